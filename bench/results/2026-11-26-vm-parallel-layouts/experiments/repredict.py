#!/usr/bin/env python3
"""Every measured row of this directory's sets predicted again by this checkout: each set's stored
profile (its calibration re-fitted from the node and split times it keeps), the row's plan (the
default load: llama.cpp's own layouts, `layers`), nothing run. Prints per set and workload the
predicted and measured TTFT / TPOT / e2e and the error.

    python experiments/repredict.py [SET ...]        (default: every set with a layouts.json)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def main() -> int:
    from oallama.planner.cost.calfit import refitted
    from oallama.planner.cost.profile import Profile
    from oallama.planner.plan import Workload, build_context, make_plan, placement_of, read_plan

    sets = sys.argv[1:] or sorted(p.parent.name for p in HERE.glob("*/layouts.json"))
    for s in sets:
        doc = json.loads((HERE / s / "layouts.json").read_text())
        profiles = {p.key: p for p in (Profile.from_json(json.loads(f.read_text()))
                                       for f in sorted((HERE / s / "profiles").glob("*.json")))}
        groups: dict[tuple, list] = {}
        for r in doc["summary"]:
            groups.setdefault((r["prompt"], r["gen"], r["parallel"], bool(r.get("kv_unified"))), []).append(r)
        for (prompt, gen, par, unified), rows in groups.items():
            tag = f"p{prompt}-g{gen}" + (f"-np{par}{'u' if unified else ''}" if par > 1 else "")
            plans = {r["placement"]: HERE / s / "plans" / f"{tag}-{r['placement']}.json" for r in rows}
            some = read_plan(next(p for p in plans.values() if p.exists()))
            prof = profiles[some["profile"]]
            prof.calibration = refitted(prof.calibration, prof)
            wl = Workload(prompt, gen, "e2e", some["workload"]["n_ubatch"], parallel=par, kv_unified=unified)
            ctx = build_context(doc["model"], None, wl, profile=prof, threads=doc["threads"], progress=False)
            for r in rows:
                f = plans[r["placement"]]
                pred = ctx.predict(placement_of(read_plan(f)) if f.exists() else make_plan(ctx, "layers", None).placement)
                print(json.dumps({"set": s, "workload": tag, "placement": r["placement"],
                                  "predicted": {m: pred[m] for m in METRICS}, "measured": {m: r[m] for m in METRICS},
                                  "error": {m: pred[m] / r[m] - 1 for m in METRICS}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
