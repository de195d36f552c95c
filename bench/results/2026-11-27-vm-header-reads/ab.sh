#!/usr/bin/env bash
# Whole-process time of planning the 30B-A3B shape (bench/scripts/bench_plan.py, optimal @50%, the
# device model and profile already cached), with the header cache of python/oallama/model/gguf_file.py
# ("after": the working tree's) and without it ("before": BEFORE's, default HEAD, run before the change
# was committed), alternated ROUNDS times.
#   OALLAMA_CACHE=<a cache holding the device model> [BEFORE=<commit>] bash ab.sh ROUNDS > ab.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-5}
run() {
  local t0 t1
  t0=$(date +%s.%N)
  .venv/bin/python bench/scripts/bench_plan.py --preset qwen3-30b-a3b --budget 50% --reps 1 --strategies optimal \
    -o /tmp/header-reads-plan --model-dir /tmp/header-reads-models > /tmp/header-reads-run.log 2>&1
  t1=$(date +%s.%N)
  printf '%s %.2f s load %s\n' "$1" "$(echo "$t1 - $t0" | bc)" "$(cut -d' ' -f1 /proc/loadavg)"
}
echo "# commit $(git rev-parse --short HEAD) + the working tree's gguf_file.py; $(nproc) CPUs; $(date -u +%FT%TZ)"
cp python/oallama/model/gguf_file.py /tmp/header-reads-new.py
trap 'cp /tmp/header-reads-new.py python/oallama/model/gguf_file.py' EXIT
run warm-up >/dev/null
for _ in $(seq "$rounds"); do
  run after
  git show "${BEFORE:-HEAD}:python/oallama/model/gguf_file.py" > python/oallama/model/gguf_file.py
  run before
  cp /tmp/header-reads-new.py python/oallama/model/gguf_file.py
done
