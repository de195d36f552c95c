#!/bin/bash
# calibration method 25 (decode passes timed on other tokens): the small MoE models' grid of ../2026-11-25-vm-method24/run.sh (CPU + loopback rpc-server, server on CPU 1,
# client on CPU 0), each profiled afresh into an empty cache so that the profile records the host's speed
# (planner/hostspeed.py) and every configuration's process times the same reference around its runs
cd /work/main
M=build/bench-models
D=bench/results/2026-11-25-vm-moe-method25
export OALLAMA_CACHE=$(mktemp -d /tmp/oallama-cache.XXXX)
B=(.venv/bin/python -m oallama bench --rpc-local --rpc-cpus 1 --ubatch 64 --threads 1 --no-plots --rounds 3 -o $D)
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
log start
"${B[@]}" $M/qwen3moe-small-q4_k_m-L8.gguf $M/gpt-oss-small-mxfp4_moe-L8.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,n-cpu-moe,affinity,optimal --prompt 64 --gen 32 --reps 3; log moe
log done
