#!/usr/bin/env bash
# Set up (idempotent, see setup.sh), lint, then run the test suite. Extra args go to pytest:
#   scripts/test.sh -k placement -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
echo; echo "==> ruff"
ruff check python tests scripts bench
echo; echo "==> import contracts (pyproject: [tool.importlinter])"
lint-imports
echo; echo "==> pytest"
python -m pytest -m "not vulkan" "$@"
# ggml-vulkan reads GGML_VK_VISIBLE_DEVICES once per process and lists Mesa's software GPU
# (a CPU-type device) only when it is named: the Vulkan tests run in a process of their own, so
# that no other test sees a Vulkan device. They skip, saying why, when Vulkan is not built.
echo; echo "==> pytest: GPU-class backend (Vulkan)"
rc=0
GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} python -m pytest -m vulkan "$@" || rc=$?
[ "$rc" = 5 ] && rc=0  # every Vulkan test deselected by the caller's -k/-m: nothing to run
exit "$rc"
