"""The confirmation's rules on its measurements (`planner.confirm` measures): which candidate is
kept (`decide`), when no round to come could change that (`settled`), and which candidate a time
bound drops first (`first_dropped`). Pure functions of the candidates' predicted and measured times."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import PlanError

if TYPE_CHECKING:
    from .context import Workload
    from .cost.schedmodel import Placement

# llama.cpp's own placements (on the CPU alone: its default load, and `--no-repack`, every weight plain)
LLAMA_CPP_OWN = ("layers", "no-repack", "fit", "n-cpu-moe")
CHALLENGERS = ("optimal", "affinity")  # oallama's plans, in the order a tie on prediction ranks them
MIN_ROUNDS = 3  # rounds before a plan may depart from llama.cpp's placement (fewer: no spread to judge by)
# a plan departs only when measured faster than this too (a share of the baseline's time): one placement
# loaded twice, on fresh loads each round, measured up to 2.8% faster than itself beyond the rounds'
# spread in 2 of 160 confirmations here (bench/results/2026-11-27-vm-confirm-ties)
TIE = 0.03
# a baseline too slow to run (again) within the time bound loses to a plan measured at under its first
# run's time / this, or its predicted time / this where it never ran (the held-out evaluation's worst
# prediction erred by 24%; a first run's allocation adds seconds at most): lavapipe's streamed prompts,
# a 53-s `layers` pass against a 1.8-s `optimal` one, would otherwise keep the slow one unmeasured
CENSORED = 2.0


class Plan(Protocol):
    """What confirming a plan reads of it (planner.plan.Plan, a dataclass)."""

    strategy: str
    placement: Placement
    workload: Workload
    predicted: dict[str, Any]
    memory: dict[str, int]
    extra: dict[str, Any]
    budget_bytes: int

    def to_json(self) -> dict[str, Any]: ...

    def save(self, path: str | Path) -> Path: ...


@dataclass
class Candidate:
    """One distinct placement of the shortlist, with its measurements (ms)."""

    labels: list[str]  # the strategies whose plans load this placement
    plan: Plan
    baseline: bool  # one of llama.cpp's own placements
    predicted_ms: float  # the workload's objective, predicted
    runs: list[dict[str, float] | None] = field(default_factory=list)  # per round: ttft_ms, tpot_ms, objective_ms
    load_s: float = 0.0
    error: str | None = None  # it failed to load or run: not a choice
    too_slow: bool = False  # its runs did not fit in what was left of the time bound: not (or no more) run
    warmup: dict[str, float] | None = None  # its first run (unrecorded in `runs`: a first run allocates)

    @property
    def label(self) -> str:
        return " = ".join(self.labels)

    def measured(self) -> dict[str, float] | None:
        done = [r for r in self.runs if r is not None]
        if not done:
            return None
        return {m: statistics.median(r[m] for r in done) for m in done[0]}


def first_dropped(cands: Sequence[Candidate]) -> int:
    """Index of the candidate a time bound drops first (of more than two): the one predicted slowest
    whose removal leaves one of llama.cpp's placements and, where there was one, one of oallama's. On
    the CPU alone a short bound had dropped `optimal` to keep the default load and `--no-repack`, and
    then nothing could depart from them."""
    kinds = {c.baseline for c in cands}

    def leaves_both(i: int) -> bool:
        return {c.baseline for j, c in enumerate(cands) if j != i} == kinds

    return max((i for i in range(len(cands)) if leaves_both(i)), key=lambda i: (cands[i].predicted_ms, i))





def over_budget_bytes(memory: Mapping[str, int], budget_bytes: int) -> int:
    """Bytes by which a load's accelerator memory (llama.cpp's accounting: `verify.measure_memory`)
    exceeds a budget; 0 within it, or without a budget (a CPU-only plan)."""
    return max(int(memory.get("total", 0)) - int(budget_bytes), 0) if budget_bytes else 0


def over_budget(c: Candidate) -> int:
    """Bytes by which the candidate's load exceeds its plan's budget on the accelerator; 0 within it,
    or without a plan to read."""
    return over_budget_bytes(c.plan.memory, c.plan.budget_bytes) if c.plan is not None else 0


def decide(cands: Sequence[Candidate], tie: float = TIE,
           min_rounds: int = MIN_ROUNDS) -> tuple[Candidate, str, dict[str, dict[str, float]]]:
    """`_decide` over the placements within the budget. Where none of llama.cpp's is within it, its
    best is the reference the others are compared with, and the fastest within the budget is kept
    (by the median of its rounds; by prediction where none was measured)."""
    within = [c for c in cands if over_budget(c) == 0]
    if len(within) == len(cands) or not within:
        return _decide(cands, tie, min_rounds)
    over = ", ".join(f"'{c.label}' ({over_budget(c) / 2**20:.0f} MiB)" for c in cands if over_budget(c))
    note = f"; over the budget, never kept: {over}"
    if any(c.baseline and c.error is None for c in within):
        best, why, ratios = _decide(within, tie, min_rounds)
        return best, why + note, ratios
    best, why, ratios = _decide(cands, tie, min_rounds)
    if over_budget(best) == 0:
        return best, why + note, ratios
    ok = [c for c in within if c.error is None] or within
    measured = [c for c in ok if c.measured() is not None]  # else by prediction
    alt = (min(measured, key=lambda c: c.measured()["objective_ms"]) if measured  # type: ignore[index]
           else min(ok, key=lambda c: c.predicted_ms))
    def ms(c: Candidate) -> str:
        m = c.measured()
        return f"{m['objective_ms']:.0f} ms measured" if m is not None else f"{c.predicted_ms:.0f} ms predicted"

    return alt, (f"kept '{alt.label}' ({ms(alt)}), the fastest within the budget: none of llama.cpp's placements "
                 f"fits it ('{best.label}': {ms(best)}){note}"), ratios


def settled(cands: Sequence[Candidate], more: int, tie: float = TIE, min_rounds: int = MIN_ROUNDS) -> bool:
    """True when `more` rounds could not make `decide` depart from the best of llama.cpp's placements
    as measured so far, whatever they measured: every other baseline's median could not fall below
    its, and every other candidate's median ratio to it could not fall below 1 - tie (its runs' ratio
    0 in every round to come, the baseline's time unbounded). Only where every candidate is within
    the budget and ran every round so far, at least `min_rounds` of them."""
    n = len(cands[0].runs) if cands else 0
    if n < min_rounds or any(c.error is not None or c.too_slow or over_budget(c) or len(c.runs) != n
                             or any(r is None for r in c.runs) for c in cands):
        return False
    obj = {id(c): [r["objective_ms"] for r in c.runs if r is not None] for c in cands}
    base = min((c for c in cands if c.baseline), key=lambda c: statistics.median(obj[id(c)]), default=None)
    if base is None:
        return False
    highest = statistics.median(obj[id(base)] + [math.inf] * more)
    for c in cands:
        if c is base:
            continue
        if c.baseline:
            if statistics.median([0.0] * more + obj[id(c)]) <= highest:
                return False
        elif statistics.median([0.0] * more + [a / b for a, b in zip(obj[id(c)], obj[id(base)], strict=True)]) < 1 - tie:
            return False
    return True


def _decide(cands: Sequence[Candidate], tie: float = TIE,
            min_rounds: int = MIN_ROUNDS) -> tuple[Candidate, str, dict[str, dict[str, float]]]:
    """(the candidate kept, why, per label its median ratio to the kept baseline and its spread).

    The best baseline is the one of llama.cpp's placements with the lowest median objective over the
    rounds it ran (before any measurement: the lowest predicted). Each other candidate is compared
    round by round with it: q = its objective / the baseline's in the same round. It replaces the
    baseline when 1 - median(q) exceeds both `tie` and the spread, half the range of q, over at
    least `min_rounds` rounds; of several, the largest gain."""
    ok = [c for c in cands if c.error is None]
    base_ok = [c for c in ok if c.baseline]
    if not base_ok:
        raise PlanError("confirmation: none of llama.cpp's own placements could be loaded and run: "
                        + "; ".join(f"{c.label}: {c.error}" for c in cands if c.baseline))

    def median_obj(c: Candidate) -> float:
        m = c.measured()
        return m["objective_ms"] if m is not None else float("inf")

    measured_base = [c for c in base_ok if c.measured() is not None]
    base = (min(measured_base, key=median_obj) if measured_base else min(base_ok, key=lambda c: c.predicted_ms))
    ratios: dict[str, dict[str, float]] = {}
    if not measured_base and base.too_slow:  # no round of the baseline: the censored comparison
        ref, what = ((base.warmup["objective_ms"], "its one run") if base.warmup is not None
                     else (base.predicted_ms, "predicted"))
        fast = [c for c in ok if not c.baseline and sum(r is not None for r in c.runs) >= min_rounds
                and CENSORED * median_obj(c) < ref]
        if fast:
            best = min(fast, key=median_obj)
            for c in fast:
                ratios[c.label] = {"vs_baseline_censored": median_obj(c) / ref}
            return best, (f"'{best.label}' measured {median_obj(best):.0f} ms, under 1/{CENSORED:g} of llama.cpp's "
                          f"'{base.label}' ({what}: {ref:.0f} ms), too slow to run again within the time bound"), ratios
    best, best_gain = base, 0.0
    for c in ok:
        if c is base:
            continue
        q = [a["objective_ms"] / b["objective_ms"] for a, b in zip(c.runs, base.runs, strict=False)
             if a is not None and b is not None and b["objective_ms"] > 0]
        if not q:
            continue
        ratio, spread = statistics.median(q), (max(q) - min(q)) / 2
        ratios[c.label] = {"vs_baseline": ratio, "spread": spread, "paired_rounds": len(q)}
        gain = 1.0 - ratio
        if len(q) >= min_rounds and gain > max(tie, spread) and gain > best_gain:
            best, best_gain = c, gain
    if best is base:
        faster = [lab for lab, r in ratios.items() if r["vs_baseline"] < 1.0]
        if not measured_base:
            why = f"nothing was measured within the time bound: kept llama.cpp's '{base.label}'"
        elif faster:
            why = (f"kept llama.cpp's '{base.label}': {', '.join(faster)} measured faster only within the rounds' "
                   f"spread or by under {tie:.0%}")
        else:
            why = f"kept llama.cpp's '{base.label}': nothing measured faster"
    else:
        r = ratios[best.label]
        why = (f"'{best.label}' measured {1 - r['vs_baseline']:.1%} faster than llama.cpp's '{base.label}' "
               f"(spread {r['spread']:.1%}, {int(r['paired_rounds'])} rounds)")
    return best, why, ratios


__all__ = ["CENSORED", "CHALLENGERS", "LLAMA_CPP_OWN", "MIN_ROUNDS", "TIE", "Candidate", "Plan", "decide",
           "first_dropped", "over_budget", "over_budget_bytes", "settled"]
