"""The calibration's repeated measurements, and which of them it keeps.

This VM (and any shared machine) runs the same pass in two speed states 1.5x apart for seconds to
minutes. The calibration therefore measures in rounds (calibrate.py) and keeps each timed pass from
the round of its median time (`merge_rounds`): the fastest of several rounds is biased low, and the
runs being planned for meet the slow phases too. A pass's time
outside its graph, with and without the accelerator attached, is the median over the rounds, the
statistic the bench reports of its own rounds: the fastest splits' round's let one slow measurement
reach every prediction (gpt-oss-small's decode pass: 2.07 ms outside its graph in one calibration,
0.74-0.80 ms in three fresh ones; bench/results/2026-11-24-vm-method18-gptoss), and the least over the
rounds (method 19) predicted faster than measured nearly everywhere (bench/results/2026-11-24-vm-method19);
the calibration keeps every round's (`Calibration.rounds_outside`, `rounds_alone`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .routing import Routing


@dataclass
class Round:
    """One round of a calibration's measurements, before any fit."""

    points: list[dict[str, Any]]  # every timed node (`_node_points`), with its load
    splits: list[dict[str, Any]]  # every timed split, with its load
    outside: dict[tuple[int, int], float]  # host passes: (n_tokens, n_past) -> us outside the graph + sampling
    stream: dict[str, dict[str, Any]] = field(default_factory=dict)
    scatter: dict[str, dict[str, Any]] = field(default_factory=dict)
    routing: Routing | None = None
    detached: dict[str, list[float]] = field(default_factory=dict)
    host_s: float = 0.0  # seconds its host load took (a round of the host load alone: `calibrate`)
    # accelerator -> (n_tokens, n_past) -> us outside the graph of that pass in a host load without
    # the accelerator attached (merged: the median over the rounds)
    alone: dict[str, dict[tuple[int, int], float]] = field(default_factory=dict)
    layouts: dict[str, Any] | None = None  # the host's passes repacked and plain (`realpass.measure_layouts`)


def _pass_key(d: dict[str, Any]) -> tuple[str, int, int]:
    return (str(d.get("load")), int(d["n_tokens"]), int(d["n_past"]))


def merge_rounds(rounds: Sequence[Round]) -> Round:
    """Each timed pass (load, tokens, KV length) from the round of its median time (the slower middle
    one of an even number, `middle`): its nodes and splits together; its time outside the graph the median over the
    rounds (`middle`); the streamed and scattered passes from the round of their median wall; what a
    detached load saves from the round of the median time its host passes spent outside their graphs,
    and each pass's measured time outside
    its graph without the accelerator, the median over the rounds (`alone`: calibrate.py fits what a
    detached load saves from it and the kept times)."""
    if not rounds:
        raise ValueError("no calibration rounds to merge")

    def chosen(order: list[Any]) -> Any:  # order: rounds (or their measurements) sorted fastest first
        return order[len(order) // 2]

    totals: list[dict[tuple[str, int, int], float]] = []
    for r in rounds:
        t: dict[tuple[str, int, int], float] = defaultdict(float)
        for s in r.splits:
            t[_pass_key(s)] += float(s["split_us"])
        totals.append(t)
    best: dict[tuple[str, int, int], int] = {}
    for k in {k for t in totals for k in t}:
        best[k] = chosen(sorted((i for i in range(len(rounds)) if k in totals[i]), key=lambda i: totals[i][k]))
    points = [p for i, r in enumerate(rounds) for p in r.points if best.get(_pass_key(p)) == i]
    splits = [s for i, r in enumerate(rounds) for s in r.splits if best.get(_pass_key(s)) == i]
    outside = {k: middle([r.outside[k] for r in rounds if k in r.outside]) for k in {k for r in rounds for k in r.outside}}

    def kept(field_of: Any) -> dict[str, dict[str, Any]]:
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rounds:
            for acc, m in field_of(r).items():
                by[acc].append(m)
        return {acc: chosen(sorted(ms, key=lambda m: float(m["wall_us"]))) for acc, ms in by.items()}

    with_detached = [i for i, r in enumerate(rounds) if r.detached] or list(range(len(rounds)))  # not host-only rounds
    mid = chosen(sorted(with_detached, key=lambda i: sum(rounds[i].outside.values())))
    return Round(points, splits, outside, kept(lambda r: r.stream), kept(lambda r: r.scatter),
                 rounds[0].routing, rounds[mid].detached, alone=_alone(rounds), layouts=_layouts(rounds))


def _layouts(rounds: Sequence[Round]) -> dict[str, Any] | None:
    """The host's passes repacked and plain: per pass size, the pair of walls from the round whose
    plain / repacked ratio is the median (`middle`) of the rounds that measured it; `rounds` keeps every
    round's ratios."""
    measured = [r.layouts for r in rounds if r.layouts]
    if not measured:
        return None
    out: dict[str, Any] = {**measured[0], "sizes": {}}
    for n in {n for m in measured for n in m["sizes"]}:
        pairs = [m["sizes"][n] for m in measured if n in m["sizes"]]
        ratio = middle([p["plain_us"] / p["default_us"] for p in pairs])
        out["sizes"][n] = next(p for p in pairs if p["plain_us"] / p["default_us"] == ratio)
    out["rounds"] = [{n: v["plain_us"] / v["default_us"] for n, v in m["sizes"].items()} for m in measured]
    return out


def middle(values: Sequence[float]) -> float:
    """The median of `values`, the slower middle one of an even number (a measured value, not a mean;
    not the faster one: every choice of the fast side made the predictions optimistic)."""
    if not values:
        raise ValueError("no values")
    return sorted(values)[len(values) // 2]


def _alone(rounds: Sequence[Round]) -> dict[str, dict[tuple[int, int], float]]:
    """accelerator -> pass -> its time outside the graph without the accelerator, the median over
    the rounds that measured it."""
    per: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rounds:
        for acc, a in r.alone.items():
            for k, us in a.items():
                per[acc][k].append(us)
    return {acc: {k: middle(v) for k, v in d.items()} for acc, d in per.items()}
