#!/usr/bin/env python3
"""Each cell's host-only prediction errors beside how fast the machine ran its reference ops
(planner/cost/hostspeed.py) during the cell's measurement, over how fast it ran them just before the
cell's profile was timed: a ratio above 1 is a host slower at the run than when it was profiled.

    python bench/results/2026-11-27-h200-heldout/drift.py > drift.txt
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBES = ("n1_us", "n32_us", "big_n1_us")  # q4_K 2048x2048 at 1 and 32 columns, 8192x8192 at 1 (us)


def main() -> None:
    profiles = {p.stem: json.loads(p.read_text()) for p in (HERE / "profiles").glob("*.json")}
    print("cell | profile's host probe n1 / n32 / big (us) | run / profile n1 / n32 / big | host-only errors "
          "TTFT / TPOT / e2e (%)")
    for f in sorted((HERE / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        at_profile = profiles[cell["profile"]]["host_speed"]["before"]["host"]
        run = cell["device_speed"]
        ratios = [statistics.mean(run[w]["host"][k] for w in ("before", "after")) / at_profile[k] for k in PROBES]
        host = [p for p in cell["placements"] if p.get("host_only")]
        errs = [" / ".join(f"{100 * (p['predicted'][m] / p['measured'][m] - 1):+.1f}"
                           for m in ("ttft_ms", "tpot_ms", "e2e_ms")) for p in host]
        print(f"{cell['cell']} | {' / '.join(f'{at_profile[k]:.0f}' for k in PROBES)} | "
              f"{' / '.join(f'{r:.2f}' for r in ratios)} | {'; '.join(errs) or '-'}")


if __name__ == "__main__":
    main()
