#!/bin/bash
# method 23 (the host's passes repacked and plain measured every round, the median round's ratio kept) on
# CPU + loopback rpc-server: the two MoE grids of ../2026-11-24-vm-method22/run.sh
cd /work/main
M=build/bench-models
D=bench/results/2026-11-24-vm-method23-moe
B=(.venv/bin/python -m oallama bench --rpc-local --ubatch 64 --threads 1 --no-plots --rounds 3 -o $D)
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
log start
"${B[@]}" $M/qwen3moe-small-q4_k_m-L8.gguf $M/gpt-oss-small-mxfp4_moe-L8.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,n-cpu-moe,affinity,optimal --prompt 64 --gen 32 --reps 3; log moe
log done
