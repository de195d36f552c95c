#!/usr/bin/env python3
"""In every held-out results set under bench/results, the cells where llama.cpp's own placements
(`layers`, `fit`, `n-cpu-moe`) took more of the accelerator than the cell's budget, by llama.cpp's
accounting as the plan files record it (`memory.total` against `budget.bytes`).

    python bench/results/2026-11-27-h200-heldout/overbudget.py > overbudget.txt
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1]
OWN = ("layers", "fit", "n-cpu-moe")


def main() -> None:
    for d in sorted(p for p in RESULTS.iterdir() if "heldout" in p.name and (p / "plans").is_dir()):
        cells = sorted(c for c in (d / "plans").iterdir() if c.is_dir())
        over = []
        for c in cells:
            for s in OWN:
                f = c / f"{s}.plan.json"
                if not f.exists():
                    continue
                doc = json.loads(f.read_text())
                budget, total = int(doc["budget"]["bytes"] or 0), int(doc["memory"]["total"])
                if budget and total > budget:
                    over.append(f"  {c.name} {s}: {total / 2**20:.0f} MiB, budget {budget / 2**20:.0f} MiB")
        n_over = len({line.split()[0] for line in over})
        print(f"{d.name}: {n_over} of {len(cells)} cells")
        if over:
            print("\n".join(over))


if __name__ == "__main__":
    main()
