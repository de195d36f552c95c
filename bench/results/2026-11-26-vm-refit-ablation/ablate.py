#!/usr/bin/env python3
"""The calibration fit's stacked corrections, each taken out in turn, scored on the measured held-out
set by re-prediction (bench/heldout/refit.py: every stored profile's device terms re-fitted from its
own node and split times; no model run, nothing measured).

    python bench/results/2026-11-26-vm-refit-ablation/ablate.py SRC OUT VARIANT

The `lsq*` variants need lsq.diff applied first (git apply): one least-squares fit per device of a
matmul scale, an other-ops scale and a cost per node over every timed split, in place of the anchors
and shares.
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

VARIANTS = {
    "current": {},
    "no-shares": {"fit_shares": lambda *a, **k: {}},  # every weight matmul shape at its pass size's ratio
    "no-sync-bound": {"SYNC_BOUND": math.inf},  # no pass size keeps its weight matmuls at their one-op time
    "no-context-bound": {"context_bounded": lambda s: list(s)},  # a decode split not bounded by a longer one's
    "no-size-anchors": {"ANCHOR_OPS": math.inf, "SYNC_BOUND": math.inf},  # one factor per device, no pass size's own
    "global-only": {"ANCHOR_OPS": math.inf, "SYNC_BOUND": math.inf, "fit_shares": lambda *a, **k: {},
                    "context_bounded": lambda s: list(s)},  # all four out
    "lsq": {"LSQ": True},  # lsq.diff: alpha, beta, gamma free
    "lsq-p05": {"LSQ": True, "PRIOR": 0.05},  # ... alpha and beta held near 1 (a prior of 5%)
    "lsq-p10": {"LSQ": True, "PRIOR": 0.1},
    "lsq-p25": {"LSQ": True, "PRIOR": 0.25},
}


def fit_again(cal, profile):
    """The calibration's device terms fitted again by the (patched) calfit.fit from its stored node and
    split times, the rest as stored: calfit.refitted, written here so that the code before it runs too."""
    return dataclasses.replace(cal, devices=calfit.fit(cal.points, [], profile, cal.splits, cal.routing).devices)


def main() -> int:
    src, out, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    for k, v in VARIANTS[name].items():
        if not hasattr(calfit, k):
            raise SystemExit(f"{name}: calfit has no {k} (apply lsq.diff for the lsq variants)")
        setattr(calfit, k, v)
    for f in sorted((src / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] in ("cpu", "rpc"):
            refit.repredict_cell(src, out / name, cell, "current", fit_again)
    print(heldout.report(out / name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
