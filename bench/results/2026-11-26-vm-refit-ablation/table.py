#!/usr/bin/env python3
"""summary.md's tables: per variant, e2e / TTFT / TPOT error as median |error| / p90 |error| / bias (%):
the held-out set's CPU and rpc placements (OUT/<variant>/cells), host-only and mixed apart; the -np
sets' rows (LAY/<variant>.jsonl).

    python table.py OUT [LAY]
"""
import json
import math
import statistics
import sys
from pathlib import Path

ORDER = ["current", "no-shares", "no-sync-bound", "no-context-bound", "no-size-anchors", "global-only",
         "lsq", "lsq-p05", "lsq-p10", "lsq-p25"]


def q90(v):
    s = sorted(v)
    return s[min(len(s) - 1, max(0, math.ceil(0.9 * len(s)) - 1))]


def stats(cells, host, m):
    e = [p["predicted"][m] / p["measured"][m] - 1 for c in cells for p in c["placements"] if p["host_only"] == host]
    return f"{100 * statistics.median(map(abs, e)):.1f} / {100 * q90([abs(x) for x in e]):.1f} / {100 * statistics.median(e):+.1f}"



def heldout_table(out: Path) -> None:
    print("| variant | host-only e2e | host-only TTFT | host-only TPOT | mixed e2e | mixed TTFT | mixed TPOT |")
    print("|---|---|---|---|---|---|---|")
    for v in ORDER:
        cells = [json.loads(f.read_text()) for f in sorted((out / v / "cells").glob("*.json"))]
        if cells:
            print(f"| {v} | " + " | ".join(stats(cells, h, m) for h in (True, False)
                                            for m in ("e2e_ms", "ttft_ms", "tpot_ms")) + " |")


def layouts_table(lay: Path) -> None:
    """The -np sets' rows (layouts_refit.py's JSON lines, LAY/<variant>.jsonl): the 8B shape
    (in-sample) and the two held-out models apart."""
    print("\n| variant | set | e2e | TTFT | TPOT |\n|---|---|---|---|---|")
    for v in ORDER:
        f = lay / f"{v}.jsonl"
        if not f.exists():
            continue
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        for s in ("after", "heldout-phi3", "heldout-gemma3"):
            sel = [r for r in rows if r["set"] == s]
            cells = []
            for m in ("e2e_ms", "ttft_ms", "tpot_ms"):
                e = [r["predicted"][m] / r["measured"][m] - 1 for r in sel]
                cells.append(f"{100 * statistics.median(map(abs, e)):.1f} / {100 * q90([abs(x) for x in e]):.1f} / "
                             f"{100 * statistics.median(e):+.1f}")
            print(f"| {v} | {s} ({len(sel)}) | " + " | ".join(cells) + " |")


heldout_table(Path(sys.argv[1]))
if len(sys.argv) > 2:
    layouts_table(Path(sys.argv[2]))
