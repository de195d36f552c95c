#!/usr/bin/env python3
"""Re-predict a committed host-layouts set (bench_layouts.py's output) with this checkout's cost
model, from the profile and calibration it committed: each placement's TTFT, TPOT and e2e against
the measured medians, and what `optimal` plans now. No model runs (the model file is read for its
graph).

    python bench/scripts/repredict_layouts.py DIR [--first-pair] [--model PATH]

--first-pair: each weight shape's node times of the calibration's paired layouts from its first pair
only (what calibration method 42 measured: one pass node by node per layout, in the first pair),
where the set's calibration kept every pair's (`<layout>_each_us`, method 43).
--model: the model file, where it is not at the path the set recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oallama.planner import plan as planmod
from oallama.planner.cost.profile import PLAIN, Profile

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def first_pair(layouts: dict[str, Any]) -> int:
    """Set each shape's node times to its first pair's, in place; how many shapes had pairs."""
    n = 0
    for v in (layouts.get("sizes") or {}).values():
        for sh in (v.get("shapes") or {}).values():
            for what in ("default", "plain"):
                each = sh.get(f"{what}_each_us")
                if each:
                    sh[f"{what}_us"] = each[0]
                    n += what == "default"
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--first-pair", action="store_true", help="node times of the first pair only (method 42)")
    ap.add_argument("--model", type=Path, help="the model file (default: the path the set recorded)")
    args = ap.parse_args()
    doc = json.loads((args.dir / "layouts.json").read_text())
    (pf,) = sorted((args.dir / "profiles").glob("*.json"))
    prof = Profile.from_json(json.loads(pf.read_text()), pf)
    if prof.calibration is None or prof.calibration.layouts is None:
        sys.exit(f"{pf}: no calibrated host layouts")
    if args.first_pair and not first_pair(prof.calibration.layouts):
        sys.exit(f"{pf}: the calibration kept no pair's node times (method 42 or before)")
    model = args.model or Path(doc["model"])
    print(f"# {args.dir} ({model.name}), node times: {'first pair' if args.first_pair else 'as kept'}\n")
    print("| workload | placement | TTFT ms measured / recorded / now | TPOT ms | e2e ms | e2e error now |")
    print("|---|---|---|---|---|---|")
    workloads = dict.fromkeys((s["prompt"], s["gen"], s.get("parallel", 1), bool(s.get("kv_unified")))
                              for s in doc["summary"])
    for prompt, gen, par, unified in workloads:
        wl = planmod.Workload(prompt=prompt, gen=gen, parallel=par, kv_unified=unified)
        ctx = planmod.build_context(model, None, wl, profile=prof, threads=doc["threads"], progress=False)
        tag = f"p{prompt}-g{gen}" + (f"-np{par}{'u' if unified else ''}" if par > 1 else "")
        preds: dict[str, dict[str, Any]] = {}
        for s in doc["summary"]:
            if (s["prompt"], s["gen"], s.get("parallel", 1), bool(s.get("kv_unified"))) != (prompt, gen, par, unified):
                continue
            plan_doc = json.loads((args.dir / "plans" / f"{tag}-{s['placement']}.json").read_text())
            now = preds[s["placement"]] = ctx.predict(planmod.placement_of(plan_doc))
            cells = [f"{s[k]:.0f} / {plan_doc['predicted'][k]:.0f} / {now[k]:.0f}" for k in METRICS]
            print(f"| {tag} | {s['placement']} | {' | '.join(cells)} | {now['e2e_ms'] / s['e2e_ms'] - 1:+.1%} |")
        meas = {s["placement"]: s for s in doc["summary"] if (s["prompt"], s["gen"]) == (prompt, gen)}
        if {"default", "all-plain"} <= meas.keys():
            r_meas = meas["all-plain"]["ttft_ms"] / meas["default"]["ttft_ms"]
            r_pred = preds["all-plain"]["ttft_ms"] / preds["default"]["ttft_ms"]
            print(f"\n{tag}: all-plain / default TTFT predicted {r_pred:.3f}, measured {r_meas:.3f} "
                  f"({r_pred / r_meas - 1:+.1%})")
        opt = planmod.make_plan(ctx, "optimal", None)
        n_plain = sum(1 for v in opt.placement.layouts.values() if v == PLAIN)
        print(f"{tag}: optimal now lays {n_plain} weights plain of {len(opt.placement.layouts)} it names; "
              f"predicted e2e {opt.predicted['e2e_ms']:.0f} ms\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
