#!/bin/sh
# char2.sh TREE LOG: characterise CPU + rpc-server afresh, then the 8B's plan, from TREE's sources
# paths as run: /tmp/plan-cache holds the devices' model (devices/) and the reference model (models/);
# /tmp/fp/run_tree.py is run_tree.py here (a tree's python/ with its native files linked in)
TREE=$1; LOG=$2
D=$(mktemp -d /tmp/fp/cache.XXXX); mkdir $D/profiles $D/devices; ln -s /tmp/plan-cache/models $D/models
OALLAMA_CACHE=$D /work/main/.venv/bin/python /tmp/fp/run_tree.py $TREE plan /tmp/fp/llama3-8b.gguf --rpc-local --gpu-budget 50% --prompt 512 --gen 64 --threads 1 >> $LOG 2>&1
rc=$?; cp $D/devices/*.json $LOG.devices.json 2>/dev/null; rm -rf $D; exit $rc
