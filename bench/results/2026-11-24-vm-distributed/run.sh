#!/bin/bash
# The distributed scenarios (loopback, then the emulated networks: root, namespaces + the user-space
# relay, then the report) into OUT, with the kernel's default congestion control set to CC for the run
# (new namespaces take it) and set back after.
#   bash run.sh bench/results/2026-11-24-vm-distributed            this VM's default (BBR)
#   bash run.sh bench/results/2026-11-24-vm-distributed/cubic cubic
# before/ is this script's first form (no CC argument) at commit 8e2c705.
set -e
cd /work/main
D=${1:?output directory}
CC=${2:-}
mkdir -p "$D"
OLD=$(sysctl -n net.ipv4.tcp_congestion_control)
if [ -n "$CC" ]; then sysctl -qw net.ipv4.tcp_congestion_control="$CC"; trap 'sysctl -qw net.ipv4.tcp_congestion_control=$OLD' EXIT; fi
log() { echo "$1 $(date -u +%Y-%m-%dT%H:%M:%SZ) $(cat /proc/loadavg) commit $(git rev-parse --short HEAD) cc $(sysctl -n net.ipv4.tcp_congestion_control) slow_start_after_idle $(sysctl -n net.ipv4.tcp_slow_start_after_idle)"; }
log start > "$D/load.txt"
.venv/bin/python bench/scripts/bench_distributed.py loopback -o "$D" --reps 5
.venv/bin/python bench/scripts/bench_distributed.py scenarios -o "$D" --reps 5
.venv/bin/python bench/scripts/bench_distributed.py report -o "$D"
log end >> "$D/load.txt"
