#!/bin/sh
# fp.sh TREE MODEL LOG: a first plan (fresh profile cache, the devices' model kept) from TREE's sources
# paths as run: /tmp/plan-cache holds the devices' model (devices/) and the reference model (models/);
# /tmp/fp/run_tree.py is run_tree.py here (a tree's python/ with its native files linked in)
TREE=$1; MODEL=$2; LOG=$3
D=$(mktemp -d /tmp/fp/cache.XXXX); mkdir $D/profiles; cp -r /tmp/plan-cache/devices $D/; ln -s /tmp/plan-cache/models $D/models
if [ "$TREE" = main ]; then RUN="-m oallama"; else RUN="/tmp/fp/run_tree.py $TREE"; fi
OALLAMA_CACHE=$D /work/main/.venv/bin/python $RUN plan $MODEL --rpc-local --gpu-budget 50% --prompt 512 --gen 64 --threads 1 >> $LOG 2>&1
rc=$?; rm -rf $D; exit $rc
