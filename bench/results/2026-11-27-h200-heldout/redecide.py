#!/usr/bin/env python3
"""Each cell's confirmation decided again from its stored rounds by the current rule
(`planner.confirm.decide`: a placement over the budget, by llama.cpp's accounting, is never kept),
beside what the run kept. Nothing is measured.

    python bench/results/2026-11-27-h200-heldout/redecide.py > redecide.txt
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from oallama.planner import confirm
from oallama.planner.plan import DEFAULT_LAYOUTS_LABEL

HERE = Path(__file__).resolve().parent


def main() -> None:
    for f in sorted((HERE / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        plans = HERE / "plans" / cell["cell"]
        budget = json.loads((plans / "confirmed.plan.json").read_text())["budget"]["bytes"]
        cands = []
        for c in cell["confirmation"]["candidates"]:
            # optimal-default-layouts: optimal's placement with llama.cpp's layouts (the same bytes there)
            name = "optimal" if c["labels"][0] == DEFAULT_LAYOUTS_LABEL else c["labels"][0]
            total = json.loads((plans / f"{name}.plan.json").read_text())["memory"]["total"]
            cand = confirm.Candidate(c["labels"], SimpleNamespace(memory={"total": total}, budget_bytes=budget),  # type: ignore[arg-type]
                                     c["baseline"], c["predicted_objective_ms"], c["runs"])
            cand.too_slow, cand.warmup, cand.error = c["too_slow"], c["warmup"], c["error"]
            cands.append(cand)
        chosen, why, _ = confirm.decide(cands)
        print(f"{cell['cell']}: kept {' = '.join(cell['confirmation']['chosen'])} -> {chosen.label}: {why}")


if __name__ == "__main__":
    main()
