#!/usr/bin/env python3
"""Term by term: each measured placement of a held-out set, its prompt pass and its decode pass as
two cost models predicted them -- the plan file's (the set's own calibration) and a re-prediction's
(`heldout.py --repredict`, e.g. from the device model) -- beside the measured TTFT and TPOT.

    python bench/heldout/terms.py REPREDICTED_DIR [-o terms.md]

A pass's terms (ms): weight matmuls (`compute`), every other op (`other`), copies and streamed
weights (`copy`), launches and the time outside the graph (`fixed`). Measured: the median of the
set's rounds; error = predicted / measured - 1 (negative: predicted too fast).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TERMS = {"compute": ("compute_ms",), "other": ("other_ms",), "copy": ("copy_ms", "stream_ms"),
         "fixed": ("launch_ms", "overhead_ms")}


def _terms(p: dict[str, Any]) -> dict[str, float]:
    return {t: sum(float(p.get(k, 0.0)) for k in ks) for t, ks in TERMS.items()} | {"total": float(p["total_ms"])}


def _plan_file(cell: dict[str, Any], pl: dict[str, Any], sets: Path) -> Path:
    """The plan file a placement was loaded from: the path the cell stored, else the same file in the source
    set in `sets` (a set read from another checkout)."""
    f = Path(pl["file"])
    if f.exists():
        return f
    return sets / Path(cell["repredicted_from"]).name / "plans" / cell["cell"] / f.name


def rows(cell: dict[str, Any], sets: Path) -> list[str]:
    """One row per placement and pass kind: measured, then each cost model's error and terms (sets: the
    directory holding the source set)."""
    out = []
    for pl in cell["placements"]:
        own = json.loads(_plan_file(cell, pl, sets).read_text())["predicted"]["passes"]
        new = pl["predicted_passes"]
        prompt = str(max(int(u) for u in own))  # the prompt's ubatch (a held-out prompt is one ubatch)
        for kind, u, metric in (("prompt", prompt, "ttft_ms"), ("decode", "1", "tpot_ms")):
            meas = float(pl["measured"][metric])
            a, b = _terms(own[u]), _terms(new[u])
            cells = [cell["cell"], "/".join(pl["labels"]), kind, f"{meas:.1f}"]
            for t in (a, b):
                cells += [f"{t['total'] / meas - 1:+.1%}", " / ".join(f"{t[k]:.1f}" for k in TERMS)]
            out.append("| " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("repredicted", type=Path, help="a heldout.py --repredict results directory")
    ap.add_argument("-o", "--output", type=Path, help="write the table here too")
    a = ap.parse_args()
    cells = [json.loads(f.read_text()) for f in sorted((a.repredicted / "cells").glob("*.json"))]
    if not cells or any("predicted_passes" not in p for c in cells for p in c["placements"]):
        print(f"{a.repredicted}: no re-predicted cells with per-pass terms", file=sys.stderr)
        return 2
    head = ("| cell | placement | pass | measured ms | own error | own terms | re-predicted error | "
            "re-predicted terms |\n|---|---|---|---|---|---|---|---|")
    text = "\n".join([f"Terms (ms): {' / '.join(TERMS)}; the source's calibration, then "
                      f"{cells[0].get('calibration', '?')} calibration.", "", head, *(r for c in cells for r in rows(c, a.repredicted.resolve().parent))])
    print(text)
    if a.output:
        a.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
