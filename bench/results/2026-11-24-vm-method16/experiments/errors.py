"""Where the numbers of this directory's README come from (no model runs; reads committed results).

1. median |error| per model over each configuration's median (kept) round, for the given results
   directories' rounds.csv (p90 as numpy.percentile);
2. the median signed error per (model, strategy) (negative: predicted faster than measured);
3. per cell (model, budget, prompt, op offload): `optimal`'s measured e2e over the best other strategy's,
   and the same ratio predicted;
4. over every committed calibration: per device and pass size, the nodes timed one by one over the
   splits run whole (method 17's SYNC_BOUND test), and the rpc-server's stored decode anchor.

  python errors.py DIR [DIR ...] [--model SUBSTRING ...]   (only models whose name contains one of them)
"""

from __future__ import annotations

import collections
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

METRICS = ("ttft", "tpot", "e2e")


def kept(d: Path) -> list[dict[str, str]]:
    return [r for r in csv.DictReader((d / "rounds.csv").open()) if r["kept"] == "True"]


def err(r: dict[str, str], m: str) -> float:
    return (float(r[f"predicted_{m}_ms"]) - float(r[f"{m}_ms"])) / float(r[f"{m}_ms"]) * 100


def main() -> int:
    args = sys.argv[1:]
    subs = [args[i + 1] for i, a in enumerate(args) if a == "--model"]
    dirs = [a for i, a in enumerate(args) if a != "--model" and (i == 0 or args[i - 1] != "--model")]
    rows = [r for d in dirs for r in kept(Path(d)) if not subs or any(s in r["model"] for s in subs)]
    print("1. |error| per model, median / p90 (%):\n")
    by_model = collections.defaultdict(list)
    for r in rows:
        by_model[r["model"]].append(r)
    for model, rs in [*sorted(by_model.items()), ("all", rows)]:
        print(
            f"  {model} ({len(rs)}): "
            + ", ".join(
                f"{m} {statistics.median(abs(err(r, m)) for r in rs):.1f} / {np.percentile([abs(err(r, m)) for r in rs], 90):.1f}"
                for m in METRICS
            )
        )
    print("\n2. signed error per model and strategy, median [min, max] (%):\n")
    by_ms = collections.defaultdict(list)
    for r in rows:
        by_ms[(r["model"], r["strategy"])].append(r)
    for (model, strategy), rs in sorted(by_ms.items()):
        print(
            f"  {model[:28]:28s} {strategy:9s} n={len(rs):2d} "
            + " ".join(
                f"{m} {statistics.median(err(r, m) for r in rs):+6.1f} [{min(err(r, m) for r in rs):+4.0f},"
                f"{max(err(r, m) for r in rs):+4.0f}]"
                for m in METRICS
            )
        )
    print("\n3. optimal / best other strategy, e2e of the median rounds (predicted):\n")
    cells = collections.defaultdict(dict)
    for r in rows:
        cells[(r["model"], r["budget"], r["prompt"], r["op_offload"])][r["strategy"]] = (
            float(r["e2e_ms"]),
            float(r["predicted_e2e_ms"]),
        )
    n = ok = 0
    for key, v in sorted(cells.items()):
        if "optimal" not in v or len(v) < 2:
            continue
        best, (bm, bp) = min(((s, x) for s, x in v.items() if s != "optimal"), key=lambda kv: kv[1][0])
        ratio, pred = v["optimal"][0] / bm, v["optimal"][1] / bp
        n, ok = n + 1, ok + (ratio <= 1.03)
        print(f"  {' '.join(key):52s} {ratio:5.3f} (best {best}; predicted {pred:5.3f})")
    print(f"  optimal ahead or within 3%: {ok} of {n}")
    print(
        "\n4. committed calibrations: nodes timed one by one / splits run whole, per device and pass size;"
        " the rpc-server's decode anchor as stored:\n"
    )
    anchors = []
    root = Path(__file__).resolve().parents[2]
    for f in sorted(root.glob("*/profiles/*.json")):
        cal = json.loads(f.read_text()).get("calibration") or {}
        ratio: dict[tuple[str, int], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for s in cal.get("splits") or []:
            ratio[(s["device"][:6], s["n_tokens"])][0] += s["ops_us"]
            ratio[(s["device"][:6], s["n_tokens"])][1] += s["split_us"]
        if ratio:
            print(
                f"  {f.parent.parent.name:34s} {f.stem[:8]} "
                + " ".join(f"{dev}@{nt}:{a / b:.1f}" for (dev, nt), (a, b) in sorted(ratio.items()) if b > 0)
            )
        for dev, v in (cal.get("devices") or {}).items():
            a = (v.get("anchors") or {}).get("1")
            if dev.startswith("RPC") and a is not None:
                anchors.append(float(a))
    low = [a for a in anchors if a < 0.5]
    print(
        f"\n  rpc-server decode anchors under 0.5: {len(low)} of {len(anchors)} ({min(low):.2f}-{max(low):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
