#!/bin/sh
# fp2.sh TREE MODEL LOG: plan a 512-token prompt (fresh profile cache, the devices' model kept), then a
# 128-token prompt of the same model; the second plan's wall time (s) appended to LOG as "second: S"
TREE=$1; MODEL=$2; LOG=$3
D=$(mktemp -d /tmp/fp/cache.XXXX); mkdir $D/profiles; cp -r /tmp/plan-cache/devices $D/; ln -s /tmp/plan-cache/models $D/models
RUN="$(dirname $0)/../2026-11-27-vm-first-plan-timings/run_tree.py $TREE"
OALLAMA_CACHE=$D /work/main/.venv/bin/python $RUN plan $MODEL --rpc-local --gpu-budget 50% --prompt 512 --gen 64 --threads 1 >> $LOG 2>&1
t0=$(date +%s.%N)
OALLAMA_CACHE=$D /work/main/.venv/bin/python $RUN plan $MODEL --rpc-local --gpu-budget 50% --prompt 128 --gen 64 --threads 1 >> $LOG 2>&1
rc=$?; t1=$(date +%s.%N)
echo "second: $(echo "$t1 - $t0" | bc) load $(cut -d' ' -f1 /proc/loadavg)" >> $LOG
rm -rf $D; exit $rc
