"""How far a one-op profile's 512-column weight matmuls move between rounds on this VM, and whether the
machine's speed timed right beside them (hostspeed's 32-column reference op) accounts for it.

Each round: the reference op (q4_K 2048x2048 at 32 columns, median of 15), then StarCoder2-7B's four q4_K weight
shapes at 512 columns, repacked, timed as the profile times them (2 warm-ups, median of 3), then the reference
again; rounds PAUSE_S apart. Per shape: the spread of the raw medians over the rounds, and of the medians scaled
by the round's reference (mean of its two) over the reference's median over all rounds.

    python profile_drift.py ROUNDS PAUSE_S THREADS > profile_drift.txt
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import oallama  # noqa: F401  (points llama_cpp at oallama's libraries)
from oallama import _core

SHAPES = [(4608, 512), (4608, 4608), (4608, 18432), (18432, 4608)]  # [k, m] of StarCoder2-7B's q4_K weights
rounds, pause, threads = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])


def ref() -> float:
    (t,) = _core.profile_mul_mat("CPU", "q4_K", 2048, 2048, [32], threads, 2, 15, True)
    return float(statistics.median(t.samples_us))


print(f"# {rounds} rounds, {pause} s apart, {threads} threads, load {os.getloadavg()[0]:.2f}")
rows = []
for r in range(rounds):
    before = ref()
    times = [float(statistics.median(t.samples_us)) for k, m in SHAPES
             for t in _core.profile_mul_mat("CPU", "q4_K", k, m, [512], threads, 2, 3, True)]
    after = ref()
    rows.append(((before + after) / 2, times))
    print(f"round {r:2d} {time.strftime('%H:%M:%S')} ref {before:7.0f} {after:7.0f} us | "
          + " ".join(f"{t:9.0f}" for t in times), flush=True)
    time.sleep(pause)

ref_mid = statistics.median(r for r, _ in rows)
print("\n# per shape: max/min - 1 and (p90 - p10) / median of the raw medians, then scaled by the round's reference")
for i, (k, m) in enumerate(SHAPES):
    raw = [t[i] for _, t in rows]
    scaled = [t[i] * ref_mid / r for r, t in rows]
    for name, v in (("raw", raw), ("scaled", scaled)):
        q = statistics.quantiles(v, n=10)
        print(f"{k}x{m:<6d} {name:6s} median {statistics.median(v):9.0f} us  max/min-1 {max(v) / min(v) - 1:6.1%}  "
              f"p10-p90 {(q[-1] - q[0]) / statistics.median(v):6.1%}")
print(f"# load {os.getloadavg()[0]:.2f}")
