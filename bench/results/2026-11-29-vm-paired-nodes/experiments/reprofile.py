#!/usr/bin/env python3
"""Experiment: are the one-op profile's odd points on StarCoder2-7B's q4_K matrices (the repacked
4608x4608 and 18432x4608 at 32 columns, 1.5-1.9x their neighbours' time per column and the real
graph's) the machine's state when they were timed, or the kernel's? Times the four q4_K shapes in
both layouts at the profile's columns, as the profile does (`_core.profile_mul_mat`, 2 warm-ups, 5
runs, medians), three times over, the layouts alternated, and prints us per column.

    python bench/results/2026-11-29-vm-paired-nodes/experiments/reprofile.py > reprofile.txt
"""

from __future__ import annotations

import os
import statistics
import time

from oallama import _core
from oallama.planner.cost.measure import LONG_US

SHAPES = [(4608, 512), (4608, 4608), (4608, 18432), (18432, 4608)]  # (k, n) as the profile names them
COLS = [1, 32, 64, 128, 256, 512]
LAYOUTS = {"CPU_REPACK": "", "CPU": "CPU"}  # "": the loader's own choice (repacked where it can)


def main() -> None:
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, load {os.getloadavg()[0]:.2f}, 2 threads")
    for rep in range(3):
        for k, n in SHAPES:
            for name, layout in (LAYOUTS.items() if rep % 2 == 0 else reversed(LAYOUTS.items())):
                res = _core.profile_mul_mat("CPU", "q4_K", k, n, COLS, 2, 2, 5, True, "", layout, LONG_US)
                per = [statistics.median(r.samples_us) / c for r, c in zip(res, COLS, strict=True)]
                print(f"round {rep} q4_K {k}x{n} {name:<10} ({res[0].buffer_type}) us/col: "
                      + " ".join(f"{c}:{v:.0f}" for c, v in zip(COLS, per, strict=True)), flush=True)
    print(f"# load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
