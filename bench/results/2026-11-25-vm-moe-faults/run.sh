#!/bin/bash
# a small MoE's host-only decode in fresh processes (mmap on / off alternating), with its page faults
cd /work/main
M=build/bench-models
for model in gpt-oss-small-mxfp4_moe-L8 qwen3moe-small-q4_k_m-L8; do
  for i in 1 2 3; do
    for m in 1 0; do
      echo "{\"model\": \"$model\", \"rec\": $(taskset -c 0 .venv/bin/python bench/results/2026-11-25-vm-moe-faults/experiments/faults.py $M/$model.gguf 64 32 $m 2>/dev/null)}"
    done
  done
done
