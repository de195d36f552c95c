"""Tables and the held-out check from attn_per_mac.py's records (README.md: the protocol).

    python analyse.py runs.jsonl FIT_MODEL,FIT_MODEL HELD_OUT_MODEL [HELD_OUT_MODEL...]

Per model, pass size and past: the spans' time (median over rounds of each round's median; and the
rounds' spread), their cost per multiply-add, and the growth's cost per multiply-add from the
previous past. Then each held-out model's span times after the longer pasts (> CAL_PAST), predicted
from its own times after the calibration's two pasts (SHORT, CAL_PAST) three ways:
  line      a line through its own two times (what a calibration's span fit extrapolates with);
  cells     its time at CAL_PAST plus the growth's cost per multiply-add of the fit models at the
            same cells (interpolated on log cells), times the added multiply-adds;
  kv-bytes  the same, the fit models' cost read at the same K+V bytes per KV head (the cache a
            query head streams: cells x (D + Dv) x 2 bytes; log-interpolated, end values beyond).
"""

import itertools
import json
import math
import statistics
import sys
from collections import defaultdict

path, fit_models, held = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
CAL_PAST, SHORT = 1024, 32
with open(path) as f:
    rows = [json.loads(x) for x in f]
by = defaultdict(list)  # (model, n, past) -> its records, one per round
for r in rows:
    by[(r["model"], r["n_tokens"], r["past"])].append(r)


def t_us(m, n, p):
    return statistics.median(r["span_us"] for r in by[(m, n, p)])


def macs(m, n, p):
    return by[(m, n, p)][0]["mac"]


models = sorted({k[0] for k in by})
sizes = sorted({k[1] for k in by})
pasts = sorted({k[2] for k in by})
print("## spans after each past: median over rounds (rounds' min-max), us; per multiply-add and the growth's per "
      "multiply-add from the previous past, ps\n")
for m in models:
    for n in sizes:
        print(f"{m} n={n}")
        prev = None
        for p in pasts:
            if (m, n, p) not in by:
                continue
            vals = [r["span_us"] for r in by[(m, n, p)]]
            t, w = t_us(m, n, p), macs(m, n, p)
            grow = "" if prev is None else f"  growth {(t - prev[0]) / (w - prev[1]) * 1e6:6.1f} ps"
            print(f"  past {p:5d}: {t:10.0f} us ({min(vals):.0f}-{max(vals):.0f}, {len(vals)} rounds)  "
                  f"{t / w * 1e6:6.1f} ps/MAC{grow}")
            prev = (t, w)
refs = [r["ref_n32_us"] for r in rows]
print(f"\nhost-speed reference n32 over the rounds: {min(refs):.0f}-{max(refs):.0f} us; load average "
      f"{min(r['load'] for r in rows):.2f}-{max(r['load'] for r in rows):.2f}\n")


def growth_curve(m, n, x_of):
    """[(x at the segment's middle, the growth's cost per MAC, ps)] for each pair of adjacent pasts."""
    out = []
    for lo, hi in itertools.pairwise(pasts):
        if (m, n, lo) in by and (m, n, hi) in by:
            g = (t_us(m, n, hi) - t_us(m, n, lo)) / (macs(m, n, hi) - macs(m, n, lo))
            out.append((x_of(m, (lo + hi) / 2), g))
    return out


def interp(curve, x):
    curve = sorted(curve)
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    for (x0, g0), (x1, g1) in itertools.pairwise(curve):
        if x0 <= x <= x1:
            u = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return g0 + u * (g1 - g0)
    raise AssertionError


def x_cells(m, c):
    return c


def x_kv(m, c):
    return c * KV[m]


KV = {r["model"]: r["kv_bytes_per_cell"] for r in rows}  # K+V bytes per cell of one KV head

print("## held out: span time after the longer pasts, predicted from the model's own two calibration pasts\n")
print(f"{'model':<24} {'n':>4} {'past':>6} {'measured us':>12} {'line':>8} {'cells':>8} {'kv-bytes':>9}")
errs = defaultdict(list)
for m in held:
    for n in sizes:
        if (m, n, CAL_PAST) not in by or (m, n, SHORT) not in by:
            continue
        t0, w0 = t_us(m, n, SHORT), macs(m, n, SHORT)
        t1, w1 = t_us(m, n, CAL_PAST), macs(m, n, CAL_PAST)
        slope = (t1 - t0) / (w1 - w0)
        for p in pasts:
            if p <= CAL_PAST or (m, n, p) not in by:
                continue
            meas, w = t_us(m, n, p), macs(m, n, p)
            pred = {"line": t1 + slope * (w - w1)}
            for name, xf in (("cells", x_cells), ("kv-bytes", x_kv)):
                # walk the segments from CAL_PAST to p with the fit models' mean growth per MAC at each
                t, prev_p = t1, CAL_PAST
                for q in [q for q in pasts if CAL_PAST < q <= p]:
                    mid = (prev_p + q) / 2
                    g = statistics.mean(interp(growth_curve(f, n, xf), xf(m, mid))
                                        for f in fit_models)
                    t += g * (macs(m, n, q) - macs(m, n, prev_p))  # g: us per MAC
                    prev_p = q
                pred[name] = t
            for k, v in pred.items():
                errs[k].append(v / meas - 1)
            print(f"{m:<24} {n:>4} {p:>6} {meas:>12.0f} " + " ".join(f"{(pred[k] / meas - 1) * 100:+7.1f}%"
                                                                   for k in ("line", "cells", "kv-bytes")))
print()
for k, e in errs.items():
    a = sorted(abs(x) for x in e)
    print(f"{k:<9}: median |error| {statistics.median(a) * 100:5.1f}%, max {a[-1] * 100:5.1f}%, "
          f"bias {statistics.median(e) * 100:+5.1f}% ({len(e)} predictions)")
