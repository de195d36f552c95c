#!/bin/bash
# calibration method 25 (decode passes timed on other tokens), plans naming only what differs from the default load
# (plan.unnamed_defaults), device speed around every configuration: CPU + loopback rpc-server, server on CPU 1, client
# on CPU 0 (--rpc-cpus 1), the grids of ../2026-11-25-vm-method24/run.sh, profiled afresh into an empty cache
cd /work/main
M=build/bench-models
D=bench/results/2026-11-25-vm-method25-rpc
export OALLAMA_CACHE=$(mktemp -d /tmp/oallama-cache.XXXX)
B=(.venv/bin/python -m oallama bench --rpc-local --rpc-cpus 1 --ubatch 64 --threads 1 --no-plots --rounds 3 -o $D)
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
log start
"${B[@]}" $M/llama3-8b-q4_k_m.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,affinity,optimal --prompt 32 --gen 8 --reps 3; log 8b
"${B[@]}" $M/tiny-q8_0.gguf --gpu-budget 25%,50%,75% --prompt 32,128 --gen 32 --op-offload both --reps 5; log tiny
"${B[@]}" $M/llama3-8b-q4_k_m-2l.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,affinity,optimal --prompt 32 --gen 8 --reps 5; log 2l
"${B[@]}" $M/llama3-8b-q4_k_m-2l.gguf --gpu-budget 50% --strategies flexgen --prompt 32 --gen 8 --reps 5; log 2l-flexgen
"${B[@]}" $M/minicpm3-4b-q4_k_m-4l.gguf $M/qwq-32b-q4_k_m-2l.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,affinity,optimal --prompt 32 --gen 8 --reps 3; log arch
"${B[@]}" $M/qwen3moe-small-q4_k_m-L8.gguf $M/gpt-oss-small-mxfp4_moe-L8.gguf --gpu-budget 25%,50%,75% --strategies layers,fit,n-cpu-moe,affinity,optimal --prompt 64 --gen 32 --reps 3; log moe
log done
