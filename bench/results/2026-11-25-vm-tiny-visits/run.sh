#!/bin/bash
# method 22's tiny grid (../2026-11-24-vm-method22/run.sh's tiny line) with the profile measured afresh,
# once with the whole run (client, workers, rpc-server) on CPU 0 and once unpinned, back to back
cd /work/main
D=bench/results/2026-11-25-vm-tiny-visits
M=build/bench-models
log() { echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg) $*"; }
for mode in pinned-cpu0 unpinned; do
  B=(.venv/bin/python -m oallama bench --rpc-local --ubatch 64 --threads 1 --no-plots --rounds 3 --reprofile -o $D/$mode)
  [ $mode = pinned-cpu0 ] && B=(taskset -c 0 "${B[@]}")
  log start $mode
  "${B[@]}" $M/tiny-q8_0.gguf --gpu-budget 25%,50%,75% --prompt 32,128 --gen 32 --op-offload both --reps 5
  log end $mode
done
