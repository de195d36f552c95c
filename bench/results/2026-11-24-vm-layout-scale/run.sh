#!/bin/bash
# the layout A/B of README.md: the full 8B's host-only decode, default / method 20's optimal plan's / all-plain layouts
cd /work/main
D=bench/results/2026-11-24-vm-layout-scale
.venv/bin/python $D/layouts_ab.py build/bench-models/llama3-8b-q4_k_m.gguf \
    $D/optimal-50pct.plan.json \
    bench/results/2026-11-24-vm-method20/profiles/3a1d4c8f8c5bfcdf.json 3 > $D/results.jsonl 2> $D/stderr.txt
