#!/bin/bash
# calibration method 25, plans naming only what differs from the default load, device speed around every configuration:
# CPU + Vulkan0 (Mesa's lavapipe), the grids of ../2026-11-25-vm-vulkan-method24/run.sh, profiled afresh into an empty cache
cd /work/main
M=build/bench-models
D=bench/results/2026-11-25-vm-method25-vulkan
export OALLAMA_CACHE=$(mktemp -d /tmp/oallama-cache.XXXX)
export GGML_VK_VISIBLE_DEVICES=0
B=(.venv/bin/python -m oallama bench --device Vulkan0 --ubatch 64 --threads 1 --no-plots --rounds 3 --reps 3 -o $D)
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
log start
"${B[@]}" $M/tiny-q8_0.gguf --gpu-budget 25%,50%,75% --prompt 32,128 --gen 32 --op-offload both; log tiny
"${B[@]}" $M/qwen3moe-small-q4_k_m-L8.gguf --gpu-budget 50%,75% --strategies layers,fit,affinity,n-cpu-moe,optimal --prompt 64 --gen 32; log moe
log done
