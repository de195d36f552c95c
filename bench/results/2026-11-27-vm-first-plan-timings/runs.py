"""How many timed runs a long op needs: the median of 1 warm-up + 3 runs against the profile's
2 warm-ups + 5, taken from the same 8 runs, beside the difference between two calls a minute
apart (the machine's drift). The 30B-A3B shape's expert matmuls (both routings) and its largest
dense matmuls, 1 thread, the CPU's default and plain layouts; cases whose runs take 50 ms or more.

Usage: python runs.py [out.json]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from oallama import _core

SIGS = [("MUL_MAT_ID", "q4_K", (2048, 768, 128)), ("MUL_MAT_ID", "q6_K", (768, 2048, 128)),
        ("MUL_MAT_ID", "q4_K", (768, 2048, 128)), ("MUL_MAT", "q4_K", (2048, 4096)), ("MUL_MAT", "q4_K", (4096, 2048)),
        ("MUL_MAT", "q6_K", (4096, 128256))]
COLS = [128, 256, 512]


def call(op: str, wtype: str, shape: tuple[int, ...], layout: str, few: bool) -> list[list[float]]:
    if op == "MUL_MAT":
        res = _core.profile_mul_mat("CPU", wtype, shape[0], shape[1], COLS, 1, 0, 8, True, "", layout)
    else:
        act = [8] * len(COLS) if few else []
        res = _core.profile_mul_mat_id("CPU", wtype, *shape, 8, COLS, act, 1, 0, 8, True, "", layout)
    return [list(r.samples_us) for r in res]


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# commit {commit}; load {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    cases = [(op, w, s, lay, few) for op, w, s in SIGS for lay in ("", "CPU")
             for few in ((False, True) if op == "MUL_MAT_ID" else (False,))]
    first = {c: call(*c) for c in cases}
    second = {c: call(*c) for c in cases}
    rows = []
    for c in cases:
        for i, n in enumerate(COLS):
            a, b = first[c][i], second[c][i]
            now = statistics.median(a[2:7])
            if now < 50_000:
                continue
            row = {"op": c[0], "wtype": c[1], "shape": list(c[2]), "layout": c[3] or "default", "few": c[4], "n": n,
                   "median_2w5": now, "median_1w3": statistics.median(a[1:4]),
                   "median_2w5_later": statistics.median(b[2:7]), "samples": a, "samples_later": b}
            row["fewer_runs"] = row["median_1w3"] / now - 1
            row["later_call"] = row["median_2w5_later"] / now - 1
            rows.append(row)
            print(f"{c[0]:10} {c[1]} {'x'.join(map(str, c[2])):14} {row['layout']:7} {'few ' if c[4] else 'most'} n={n:3} "
                  f"{now / 1000:7.1f} ms  1+3 runs {row['fewer_runs']:+6.1%}  a call later {row['later_call']:+6.1%}",
                  flush=True)
    for k in ("fewer_runs", "later_call"):
        ab = sorted(abs(r[k]) for r in rows)
        print(f"# {k}: {len(rows)} cases, median |diff| {statistics.median(ab):.1%}, p90 {ab[int(0.9 * (len(ab) - 1))]:.1%}, "
              f"max {ab[-1]:.1%}")
    print(f"# load {Path('/proc/loadavg').read_text().split()[:3]}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"commit": commit, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
