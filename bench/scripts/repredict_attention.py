#!/usr/bin/env python3
"""Re-predict committed long-context sets (bench_attention.py's attention.json, host-only rows) with
this checkout's cost model: each row's profile has its calibration refitted from the measurements it
carries (points, splits, attention spans), the row's workload is costed again with every weight on
the host, and the errors against the row's measured medians are printed beside the ones the set
recorded. No model runs.

    python bench/scripts/repredict_attention.py SET [SET ...] --models DIR [--json OUT] [--loads-only] [--no-tails]
        [--no-decode-tails]

DIR holds the sets' model files by the names the rows give (`oallama synth` writes the synthetic
ones again: their shapes, not their weights, are what is costed). Error = predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np


def _row(d: Path, doc: dict[str, Any], row: dict[str, Any], models: Path, loads_only: bool,
         no_tails: bool, no_decode_tails: bool) -> dict[str, Any]:
    from oallama.planner.context import Workload, build_context
    from oallama.planner.cost.calfit import refitted
    from oallama.planner.cost.profile import Profile
    from oallama.planner.cost.schedmodel import NEVER, Placement

    pf = d / "profiles" / f"{row['profile']}.json"
    prof = Profile.from_json(json.loads(pf.read_text()), pf)  # not `load`: a set's build may predate this one
    if prof.calibration is not None:
        cal = prof.calibration
        if loads_only:  # method 37: no pass size anchored by the spans' whole prompt pass
            cal = replace(cal, points=[p for p in cal.points if not p.get("anchor_only")],
                          splits=[s for s in cal.splits if not s.get("anchor_only")])
        if no_tails:  # method 39: the prompt spans after 0 and 1024 cells only
            cal = replace(cal, spans=[{k: v for k, v in sp.items() if k not in ("tails", "tail_base_us")}
                                      for sp in cal.spans])
        if no_decode_tails:  # method 40: no decode timed after the workloads' pasts (nor spans timed only with one)
            cal = replace(cal, spans=[{k: v for k, v in sp.items() if sp["n_tokens"] != 1 or k != "tails"}
                                      for sp in cal.spans if "decode_past" not in sp])
        prof.calibration = refitted(cal, prof)
    wl = Workload(prompt=row["prompt"], gen=doc["steps"] + 1, n_ubatch=doc["n_ubatch"],
                  flash_attn=row["flash_attn"], cache_type_k=row["cache_type"], cache_type_v=row["cache_type"])
    ctx = build_context(models / row["model"], None, wl, profile=prof, threads=doc["threads"], progress=False)
    pred = ctx.predict(Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes}))
    out = {"set": str(d), "model": row["model"], "prompt": row["prompt"], "fa": row["flash_attn"],
           "kv": row["cache_type"]}
    for m in ("ttft_ms", "tpot_ms"):
        meas = row[m]["median"]
        out[m] = {"measured": meas, "recorded": row["predicted"][m], "now": pred[m],
                  "err_recorded": row["predicted"][m] / meas - 1, "err_now": pred[m] / meas - 1}
    return out


def _summary(rows: list[dict[str, Any]], key: str) -> str:
    e = [r[m][key] for r in rows for m in ("ttft_ms", "tpot_ms")]
    a = [abs(x) for x in e]
    return (f"median {statistics.median(a):.1%} / p90 {float(np.percentile(a, 90)):.1%} / "
            f"bias {statistics.median(e):+.1%} ({len(e)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+", type=Path)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--loads-only", action="store_true",
                    help="leave out the passes timed whole only for their size's anchor (calibration method 37)")
    ap.add_argument("--no-tails", action="store_true",
                    help="refit without the prompt spans after more than 1024 cells (calibration method 39)")
    ap.add_argument("--no-decode-tails", action="store_true",
                    help="refit without the decode spans timed at the workloads' pasts (calibration method 40)")
    args = ap.parse_args()
    rows = []
    for d in args.sets:
        doc = json.loads((d / "attention.json").read_text())
        if doc.get("accelerator"):
            print(f"{d}: rows on {doc['accelerator']} left out (host-only rows only)", file=sys.stderr)
            continue
        for row in doc["rows"]:
            r = _row(d, doc, row, args.models, args.loads_only, args.no_tails, args.no_decode_tails)
            rows.append(r)
            print(f"{d.name:18} {r['model'][:24]:24} {r['prompt']:6} fa {r['fa']:3} {r['kv']:5} "
                  + "  ".join(f"{m[:4]} meas {r[m]['measured']:9.2f} rec {r[m]['err_recorded']:+6.1%} "
                              f"now {r[m]['err_now']:+6.1%}" for m in ("ttft_ms", "tpot_ms")), flush=True)
    print(f"recorded: {_summary(rows, 'err_recorded')}")
    print(f"now:      {_summary(rows, 'err_now')}")
    for m in ("ttft_ms", "tpot_ms"):
        for key in ("err_recorded", "err_now"):
            e = [r[m][key] for r in rows]
            a = [abs(x) for x in e]
            print(f"  {m} {key}: median {statistics.median(a):.1%} / p90 {float(np.percentile(a, 90)):.1%} / "
                  f"bias {statistics.median(e):+.1%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
