"""The second rule: an expert matmul's cost per expert, timed inside MUL_MAT_ID itself, at few columns.

rule.py found the sum of dense matmuls 20-60% short of MUL_MAT_ID on this CPU (ggml runs an
expert's rows through its own per-row kernels, not the dense GEMMs). This rule times the op itself
on a weight of only n_used experts, every token routed to all of them (each expert gets c columns),
at c in SMALL; g(c) = (T(c) - L) / n_used is one expert's cost at c columns, linear between those
and extrapolated from the last two beyond; then, with the profiler's routing (S = n * n_used slots,
S // a per expert, S % a of them one more),

    T_id(n, a) = L + sum over the a active experts of g(c_e)

Same evaluation set, settings and timings as rule.py (fixed before either was run; the rule
fits nothing, SMALL was chosen before any timing: powers of two to 64); the full MUL_MAT_ID
timed again in the same run, beside the small one, for each case.

Usage: python inop.py [out.json]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rule import CASES, REPEATS, WARMUP, med, shares

from oallama import _core
from oallama.planner.cost.profile import DEFAULT_TOKENS

SMALL = (1, 2, 4, 8, 16, 32, 64)


def interp(g: dict[int, float], c: float) -> float:
    xs = sorted(g)
    if c in g:
        return g[c]
    lo = max((x for x in xs if x < c), default=xs[0])
    hi = min((x for x in xs if x > c), default=None)
    if hi is None:  # beyond the last: the last two's line
        lo, hi = xs[-2], xs[-1]
    return g[lo] + (g[hi] - g[lo]) * (c - lo) / (hi - lo)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else ""
    rows = []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# commit {commit}; load {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
    for threads in (1, 2):
        launch = med(_core.profile_launch("CPU", threads, WARMUP, REPEATS))
        for wtype, (k, m, e), u, top in CASES:
            cols = [n for n in DEFAULT_TOKENS if n <= top]
            for layout in ("", "CPU"):
                t0 = time.perf_counter()
                small = _core.profile_mul_mat_id("CPU", wtype, k, m, u, u, list(SMALL), [u] * len(SMALL), threads,
                                                 WARMUP, REPEATS, True, "", layout)
                g = {c: (med(r) - launch) / u for c, r in zip(SMALL, small, strict=True)}
                t_small = time.perf_counter() - t0
                most = _core.profile_mul_mat_id("CPU", wtype, k, m, e, u, cols, [], threads, WARMUP, REPEATS,
                                                True, "", layout)
                few_cols = [n for n in cols if min(e, n * u) > u]
                few = _core.profile_mul_mat_id("CPU", wtype, k, m, e, u, few_cols, [u] * len(few_cols), threads,
                                               WARMUP, REPEATS, True, "", layout) if few_cols else []
                t_full = time.perf_counter() - t0 - t_small
                cases = [(n, "most", min(e, n * u), r) for n, r in zip(cols, most, strict=True)]
                cases += [(n, "few", u, r) for n, r in zip(few_cols, few, strict=True)]
                for n, routing, a, r in sorted(cases):
                    pred = launch + sum(cnt * interp(g, c) for c, cnt in shares(n, u, a).items())
                    row = {"threads": threads, "wtype": wtype, "shape": [k, m, e], "n_used": u,
                           "layout": layout or "default", "buffer_type": r.buffer_type,
                           "small_buffer_type": small[0].buffer_type, "n": n, "routing": routing, "active": a,
                           "measured_us": med(r), "rule_us": pred,
                           "spread": (max(r.samples_us) - min(r.samples_us)) / med(r), "err": pred / med(r) - 1}
                    rows.append(row)
                    print(f"t{threads} {wtype:5} {k}x{m}x{e}/{u} {row['layout']:7} {r.buffer_type:10} n={n:3} "
                          f"{routing:4} a={a:3}  measured {med(r):10.0f} us  rule {pred:10.0f} us  "
                          f"err {row['err']:+6.1%}", flush=True)
                print(f"#   timing: small {t_small:.2f} s, full {t_full:.1f} s", flush=True)
    for label, sel in (("all", rows), ("1 thread", [r for r in rows if r["threads"] == 1]),
                       ("2 threads", [r for r in rows if r["threads"] == 2]),
                       ("most", [r for r in rows if r["routing"] == "most"]),
                       ("few", [r for r in rows if r["routing"] == "few"]),
                       (">= 1 ms", [r for r in rows if r["measured_us"] >= 1000])):
        errs = [r["err"] for r in sel]
        ab = sorted(abs(x) for x in errs)
        print(f"# {label}: {len(sel)} cases, median |err| {statistics.median(ab):.1%}, "
              f"p90 {ab[int(0.9 * (len(ab) - 1))]:.1%}, bias (median signed) {statistics.median(errs):+.1%}")
    print(f"# load {Path('/proc/loadavg').read_text().split()[:3]}")
    if out:
        with open(out, "w") as f:
            json.dump({"commit": commit, "small": SMALL, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
