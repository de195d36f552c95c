#!/usr/bin/env python3
"""The same ablations scored on the CPU-only `-np` sets (bench/results/2026-11-26-vm-parallel-layouts:
`after`, the Llama 3 8B shape the decode-pass measurement was developed on, in-sample; `heldout-phi3`,
`heldout-gemma3`): every measured row predicted again from its set's stored profile, re-fitted.

    python bench/results/2026-11-26-vm-refit-ablation/layouts_refit.py VARIANT [SET ...]

Prints one JSON line per row: set, workload, placement, predicted and measured TTFT / TPOT / e2e.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "heldout"))
import ablate

from oallama.planner.cost import calfit

SRC = Path(__file__).resolve().parents[1] / "2026-11-26-vm-parallel-layouts"
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def main() -> int:
    from oallama.planner.cost.profile import Profile
    from oallama.planner.plan import Workload, build_context, make_plan, placement_of, read_plan

    name, sets = sys.argv[1], sys.argv[2:] or ["after", "heldout-phi3", "heldout-gemma3"]
    for k, v in ablate.VARIANTS[name].items():
        setattr(calfit, k, v)
    for s in sets:
        doc = json.loads((SRC / s / "layouts.json").read_text())
        profiles = [Profile.from_json(json.loads(f.read_text())) for f in sorted((SRC / s / "profiles").glob("*.json"))]
        for (prompt, gen, par), rows in _by_workload(doc["summary"]).items():
            tag = f"p{prompt}-g{gen}" + (f"-np{par}" if par > 1 else "")
            plans = {r["placement"]: SRC / s / "plans" / f"{tag}-{r['placement']}.json" for r in rows}
            some = read_plan(next(p for p in plans.values() if p.exists()))
            prof = next(p for p in profiles if p.key == some["profile"])
            prof.calibration = ablate.fit_again(prof.calibration, prof)
            wl = Workload(prompt, gen, "e2e", some["workload"]["n_ubatch"], parallel=par)
            ctx = build_context(doc["model"], None, wl, profile=prof, threads=doc["threads"], progress=False)
            for r in rows:
                f = plans[r["placement"]]
                pl = placement_of(read_plan(f)) if f.exists() else make_plan(ctx, "layers", None).placement
                pred = ctx.predict(pl)
                print(json.dumps({"set": s, "workload": tag, "placement": r["placement"],
                                  "predicted": {m: pred[m] for m in METRICS}, "measured": {m: r[m] for m in METRICS}}))
    return 0


def _by_workload(summary):
    out = {}
    for r in summary:
        out.setdefault((r["prompt"], r["gen"], r["parallel"]), []).append(r)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
