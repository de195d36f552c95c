#!/usr/bin/env python3
"""A held-out set's stored calibrations re-fitted (calfit.refitted) with the decode anchor of calibration
method 33 switched, and its placements predicted again: nothing is run or measured (as
bench/heldout/refit.py does).

    python ablate.py SRC OUT VARIANT

VARIANT: "method32" (every pass's anchor with the kinds' prompt lines), "method33" (a pass size whose node
times were mostly synchronisation, `calfit.sync_bound`, anchored with its own lines), "own-lines" (every
pass size with its own lines). SRC: a held-out results directory with cells/, profiles/ and plans/ (a set
re-predicted without plans/: a directory of links to its cells/, profiles/ and its source's plans/).
"""
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "heldout"))
import heldout
import refit
from oallama.planner.cost import calfit

VARIANTS = {"method32": math.inf, "method33": calfit.SYNC_SHARE, "own-lines": 0.0}  # calfit.SYNC_SHARE


def main() -> int:
    src, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    calfit.SYNC_SHARE = VARIANTS[name]
    acted = 0
    for f in sorted((src / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] in ("cpu", "rpc"):
            refit.repredict_cell(src, out / name, cell, "current")
    calfit.SYNC_SHARE = VARIANTS["method33"]
    for f in sorted((src / "profiles").glob("*.json")):
        cal = (json.loads(f.read_text()).get("calibration") or {})
        for dev in {s["device"] for s in cal.get("splits", [])}:
            acted += bool(calfit.sync_bound([s for s in cal["splits"] if s["device"] == dev]))
    calfit.SYNC_SHARE = VARIANTS[name]
    print(f"<!-- {name}: SYNC_SHARE {calfit.SYNC_SHARE}; (profile, device) pairs with a sync-bound pass size "
          f"at SYNC_SHARE {VARIANTS['method33']}: {acted} -->")
    print(heldout.report(out / name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
