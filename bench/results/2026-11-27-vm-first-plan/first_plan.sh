#!/bin/sh
# first_plan.sh MODEL [--characterise]: one first plan of MODEL on the CPU + a loopback rpc-server
# (1 thread each, budget 50%, prompt 512, gen 64), timed whole-process by /usr/bin/time -v.
# A fresh cache each time: the devices' model is copied in from $OALLAMA_CACHE (default
# ~/.cache/oallama), the reference model linked; with --characterise the devices are characterised
# afresh first (the reference model must be in the cache's models/). No profile is reused.
set -e
MODEL=$1; SRC=${OALLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oallama}
D=$(mktemp -d); mkdir "$D/profiles" "$D/devices"; ln -s "$SRC/models" "$D/models"
[ "$2" = --characterise ] || cp "$SRC"/devices/*.json "$D/devices/"
OALLAMA_CACHE=$D /usr/bin/time -v python -m oallama plan "$MODEL" --rpc-local --gpu-budget 50% --prompt 512 \
    --gen 64 --threads 1 || rc=$?
rm -rf "$D"; exit ${rc:-0}
