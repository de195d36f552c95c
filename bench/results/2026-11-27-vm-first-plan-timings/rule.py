"""Is an expert matmul (MUL_MAT_ID) the sum of its active experts' dense matmuls? A one-op check.

The rule (no fitted term): n tokens routed to n_used experts each over a distinct experts give
S = n * n_used slots, S // a per expert (S % a of them one more); with T(c) the one-op time of one
expert's [k, m] weight as a plain MUL_MAT at c columns and L the device's launch (an empty graph),

    T_id(n, a) = L + sum over the a experts of (T(c_e) - L)

Evaluation set, fixed before anything was timed (every row is held out: the rule fits nothing):
  experts of the MoE presets: qwen3-30b-a3b's three signatures (q4_K 2048x768x128, q6_K and q4_K
  768x2048x128, 8 used), qwen3moe-small's (q4_K and q6_K 256x256x128, 8 used), gpt-oss-20b's
  (mxfp4 2880x2880x32, 4 used; at most 128 columns: a run at 512 takes seconds here) and
  gpt-oss-small's (mxfp4 128x128x32, 4 used), and one more type (q8_0 2048x768x128, 8 used);
  column counts profile.DEFAULT_TOKENS; routing with the most distinct experts and with every
  token on the same n_used experts ("few"); the CPU's default (repacked where it can) and plain
  layouts; 1 and 2 threads. Timings as measure.time_op takes them (2 warm-up, 5 runs, median).

Usage: python rule.py [out.json]   (prints one row per case and the error summary)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from oallama import _core
from oallama.planner.cost.profile import DEFAULT_TOKENS

CASES = [  # wtype, (k, m, n_expert), n_used, max columns
    ("q4_K", (2048, 768, 128), 8, 512), ("q6_K", (768, 2048, 128), 8, 512), ("q4_K", (768, 2048, 128), 8, 512),
    ("q4_K", (256, 256, 128), 8, 512), ("q6_K", (256, 256, 128), 8, 512),
    ("mxfp4", (2880, 2880, 32), 4, 128), ("mxfp4", (128, 128, 32), 4, 512),
    ("q8_0", (2048, 768, 128), 8, 512),
]
WARMUP, REPEATS = 2, 5


def med(t: _core.Timing) -> float:
    return statistics.median(t.samples_us)


def shares(n: int, n_used: int, a: int) -> dict[int, int]:
    """columns -> experts with that many (the profiler's routing: slots spread evenly)."""
    s = n * n_used
    c, r = divmod(s, a)
    return {k: v for k, v in ((c, a - r), (c + 1, r)) if v and k}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else ""
    rows = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# commit {commit}; load {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    for threads in (1, 2):
        launch = med(_core.profile_launch("CPU", threads, WARMUP, REPEATS))
        for wtype, (k, m, e), n_used, top in CASES:
            cols = [n for n in DEFAULT_TOKENS if n <= top]
            for layout in ("", "CPU"):
                t0 = time.perf_counter()
                plans = {}
                for n in cols:
                    a = min(e, n * n_used)
                    plans[(n, "most")] = shares(n, n_used, a)
                    if a > n_used:
                        plans[(n, "few")] = shares(n, n_used, n_used)
                need = sorted({c for p in plans.values() for c in p})
                dense = _core.profile_mul_mat("CPU", wtype, k, m, need, threads, WARMUP, REPEATS, True, "", layout)
                td = {c: med(r) for c, r in zip(need, dense, strict=True)}
                t_dense = time.perf_counter() - t0
                most = _core.profile_mul_mat_id("CPU", wtype, k, m, e, n_used, cols, [], threads, WARMUP, REPEATS,
                                                True, "", layout)
                few_cols = [n for n in cols if (n, "few") in plans]
                few = _core.profile_mul_mat_id("CPU", wtype, k, m, e, n_used, few_cols, [n_used] * len(few_cols),
                                               threads, WARMUP, REPEATS, True, "", layout) if few_cols else []
                t_id = time.perf_counter() - t0 - t_dense
                measured = {(n, "most"): r for n, r in zip(cols, most, strict=True)}
                measured |= {(n, "few"): r for n, r in zip(few_cols, few, strict=True)}
                for (n, routing), p in sorted(plans.items()):
                    r = measured[(n, routing)]
                    pred = launch + sum(cnt * (td[c] - launch) for c, cnt in p.items())
                    row = {"threads": threads, "wtype": wtype, "shape": [k, m, e], "n_used": n_used,
                           "layout": layout or "default", "buffer_type": r.buffer_type,
                           "dense_buffer_type": dense[0].buffer_type, "n": n, "routing": routing,
                           "active": sum(p.values()), "measured_us": med(r), "rule_us": pred,
                           "spread": (max(r.samples_us) - min(r.samples_us)) / med(r),
                           "err": pred / med(r) - 1}
                    rows.append(row)
                    print(f"t{threads} {wtype:5} {k}x{m}x{e}/{n_used} {row['layout']:7} {r.buffer_type:10} "
                          f"n={n:3} {routing:4} a={row['active']:3}  measured {med(r):10.0f} us  rule {pred:10.0f} us"
                          f"  err {row['err']:+6.1%}", flush=True)
                print(f"#   timing: dense {t_dense:.1f} s, MUL_MAT_ID {t_id:.1f} s", flush=True)
    errs = [r["err"] for r in rows]
    ab = sorted(abs(x) for x in errs)
    print(f"# {len(rows)} cases: median |err| {statistics.median(ab):.1%}, p90 {ab[int(0.9 * (len(ab) - 1))]:.1%}, "
          f"bias (median signed) {statistics.median(errs):+.1%}; load {Path('/proc/loadavg').read_text().split()[:3]}")
    if out:
        with open(out, "w") as f:
            json.dump({"commit": commit, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
