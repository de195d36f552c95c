"""Each round's measurements against the prediction of its own round (profile and calibration
measured minutes before, `--reprofile`) and of the other rounds (the same placement costed with a
profile measured 10-20 minutes away): |predicted - measured| / measured, median and p90 over
the configurations, per metric; then each round's lavapipe-heavy placements side by side.

    python own_round.py RESULTS_DIR      (reads rounds.csv)
"""
import csv
import statistics as S
import sys
from collections import defaultdict
from pathlib import Path

with (Path(sys.argv[1]) / "rounds.csv").open() as f:
    rows = list(csv.DictReader(f))
by_cfg = defaultdict(dict)
for r in rows:
    by_cfg[r["config_id"]][int(r["round"])] = r
M = ("ttft_ms", "tpot_ms", "e2e_ms")


def p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]


own, other = defaultdict(list), defaultdict(list)
for rounds in by_cfg.values():
    for k, meas in rounds.items():
        for j, pred in rounds.items():
            for m in M:
                e = abs(float(pred[f"predicted_{m}"]) - float(meas[m])) / float(meas[m])
                (own if j == k else other)[m].append(e)
print(f"{len(by_cfg)} configurations x {len({k for r in by_cfg.values() for k in r})} rounds")
print("| prediction from | " + " | ".join(f"{m[:-3].upper()} median / p90" for m in M) + " |")
print("|---|" + "---|" * len(M))
for name, d in (("its own round", own), ("the other rounds", other)):
    print(f"| {name} ({len(d['e2e_ms'])}) | " + " | ".join(f"{100 * S.median(d[m]):.1f}% / {100 * p90(d[m]):.1f}%" for m in M) + " |")
print()
print("| strategy | budget | round | TTFT ms measured / predicted | TPOT ms measured / predicted | load |")
print("|---|---|---|---|---|---|")
for rounds in sorted(by_cfg.values(), key=lambda r: (r[1]["budget"], r[1]["strategy"])):
    for k in sorted(rounds):
        r = rounds[k]
        print(f"| {r['strategy']} | {r['budget']} | {k} | {float(r['ttft_ms']):.1f} / {float(r['predicted_ttft_ms']):.1f} | "
              f"{float(r['tpot_ms']):.2f} / {float(r['predicted_tpot_ms']):.2f} | {float(r['load_avg_start']):.2f} |")
