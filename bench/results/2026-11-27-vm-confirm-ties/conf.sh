#!/bin/sh
# conf.sh TREE LOG: Gemma 3 270M's plan on CPU + a loopback rpc-server, confirmed afresh (--reconfirm),
# from TREE's sources, with a profile cache shared by every run (its calibration done by a first run)
TREE=$1; LOG=$2
OALLAMA_CACHE=/tmp/confcache /work/main/.venv/bin/python $(dirname $0)/../2026-11-27-vm-first-plan-timings/run_tree.py $TREE plan /tmp/heldout-cache/models/gemma-3-270m-q4_k_m.gguf --rpc-local --gpu-budget 50% --prompt 512 --gen 64 --threads 1 --reconfirm >> $LOG 2>&1
