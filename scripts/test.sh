#!/usr/bin/env bash
# Set up (idempotent, see setup.sh), lint, then run the test suite. Extra args go to pytest:
#   scripts/test.sh -k placement -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
echo; echo "==> ruff"
ruff check python tests scripts
echo; echo "==> import contracts (pyproject: [tool.importlinter])"
lint-imports
echo; echo "==> pytest"
python -m pytest "$@"
