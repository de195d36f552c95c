#!/usr/bin/env python3
"""A held-out set's stored calibrations re-fitted (calfit.refitted) with one correction taken out,
and its placements predicted again: nothing is run or measured (bench/heldout/refit.py).

    python ablate.py SRC OUT VARIANT [CELL-SUBSTRING]

SRC: a held-out results directory with cells/, profiles/ and plans/ (a re-predicted set without
plans/: a directory of links to its cells/, profiles/ and its source's plans/). The `before`
variants need the fit before this set's change (`git checkout df1f95c -- python`); the others run on
the change itself.
"""
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "heldout"))
import heldout
import refit
from oallama.planner.cost import calfit

VARIANTS = {  # calfit attribute -> its value in the variant
    "current": {},
    "no-sync-bound": {"SYNC_BOUND": math.inf},  # before: no pass size keeps its matmuls at their one-op time
    "no-context-bound": {"context_bounded": lambda s: list(s)},  # before: no decode split bounded by a longer one's
    "no-both": {"SYNC_BOUND": math.inf, "context_bounded": lambda s: list(s)},  # before: both out (= the change)
    "no-anchor-ops": {"ANCHOR_OPS": 0.0},  # every timed pass size anchored, however little of the device it ran
    "no-detached": {},  # what a pass that runs nothing on the rpc-server saves detached: nothing (POST)
}
POST = {"no-detached": lambda cal: dataclasses.replace(cal, detached={})}


def main() -> int:
    src, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    only = sys.argv[4] if len(sys.argv) > 4 else None
    for k, v in VARIANTS[name].items():
        if not hasattr(calfit, k):
            raise SystemExit(f"{name}: calfit has no {k} (a `before` variant: check out df1f95c's python/)")
        setattr(calfit, k, v)
    post = POST.get(name, lambda c: c)
    for f in sorted((src / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] in ("cpu", "rpc") and (only is None or only in cell["cell"]):
            refit.repredict_cell(src, out / name, cell, "current", lambda c, p: post(calfit.refitted(c, p)))
    print(heldout.report(out / name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
