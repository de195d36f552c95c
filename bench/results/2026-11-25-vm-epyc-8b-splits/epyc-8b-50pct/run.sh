#!/bin/bash
cd /work/main
export OALLAMA_CACHE=$(mktemp -d /tmp/oallama-cache.XXXX)
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
log start
.venv/bin/python -m oallama bench --rpc-local --rpc-cpus 1 --ubatch 64 --threads 1 --no-plots --rounds 1 -o bench/results/2026-11-25-vm-epyc-8b-splits/epyc-8b-50pct build/bench-models/llama3-8b-q4_k_m.gguf --gpu-budget 50% --strategies layers,affinity,optimal --prompt 32 --gen 8 --reps 3
log done
