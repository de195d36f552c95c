#!/bin/bash
# the small MoE host decode beside the machine's memory speed, one process on CPU 0 for 180 s (l3probe.py's docstring)
cd /work/main
taskset -c 0 .venv/bin/python bench/results/2026-11-25-vm-moe-l3/experiments/l3probe.py \
    build/bench-models/qwen3moe-small-q4_k_m-L8.gguf 16 180 64 > bench/results/2026-11-25-vm-moe-l3/l3.jsonl
