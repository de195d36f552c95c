#!/bin/bash
# A/B of one more scheduler reserve after context creation (reserve_ab.py), CPU + Vulkan0 (lavapipe)
cd /work/main
export GGML_VK_VISIBLE_DEVICES=0
D=bench/results/2026-11-24-vm-vulkan-reserve
M=build/bench-models
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
{
log start; git rev-parse HEAD; lscpu | grep "Model name"
.venv/bin/python $D/reserve_ab.py $M/tiny-q8_0.gguf 0 64 3
.venv/bin/python $D/reserve_ab.py $M/tiny-q8_0.gguf 99 64 3
.venv/bin/python $D/reserve_ab.py $M/tiny-q8_0.gguf 99 32 3
.venv/bin/python $D/reserve_ab.py $M/qwen3moe-small-q4_k_m-L8.gguf 99 64 2
log done
} 2>&1 | grep -v "^ggml_vulkan" > $D/results.txt
