"""What the re-prediction scripts (repredict_stream.py, repredict_experts.py) share: a
configuration's TTFT / TPOT / e2e from its per-pass times, and the old-vs-new error table."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def metrics(passes: Mapping[int, float], workload: Mapping[str, Any], gen: int) -> dict[str, float]:
    """ms: the prompt's passes (full ubatches, then the rest), one decode pass, and e2e."""
    full, rest = divmod(int(workload["prompt"]), int(workload["n_ubatch"]))
    ttft = full * passes.get(int(workload["n_ubatch"]), 0.0) + (passes[rest] if rest else 0.0)
    return {"ttft_ms": ttft, "tpot_ms": passes[1], "e2e_ms": ttft + (gen - 1) * passes[1]}


class ErrorTable:
    """|predicted - measured| / measured of the old and the new prediction, per metric."""

    def __init__(self) -> None:
        self.errs: dict[str, dict[str, list[float]]] = {w: {k: [] for k in METRICS} for w in ("old", "new")}

    def add(self, meas: Mapping[str, float], old: Mapping[str, float], new: Mapping[str, float]) -> str:
        """Records one configuration; returns its table cells (measured | old | new per metric)."""
        for k in METRICS:
            self.errs["old"][k].append(abs(old[k] - meas[k]) / meas[k])
            self.errs["new"][k].append(abs(new[k] - meas[k]) / meas[k])
        return " | ".join(f"{meas[k]:.1f} | {old[k]:.1f} | {new[k]:.1f}" for k in METRICS)

    def summary(self) -> str:
        lines = ["\n| prediction | metric | configs | median error | p90 | max |", "|---|---|---|---|---|---|"]
        for w in ("old", "new"):
            for k in METRICS:
                v = self.errs[w][k]
                lines.append(f"| {w} | {k} | {len(v)} | {100 * statistics.median(v):.1f}% | "
                             f"{100 * float(np.percentile(v, 90)):.1f}% | {100 * max(v):.1f}% |")
        return "\n".join(lines)
