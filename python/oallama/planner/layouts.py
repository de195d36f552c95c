"""Host weight layouts are placements too: per weight, plain memory, ggml's repacked layout, or
both (patch 0006's CPU_REPACK_DUAL), chosen for the stated workload.

On some CPUs the repacked kernels decode faster and prefill slower than the plain ones (oallama's
2-core EPYC: q4_K repacked 1.45x faster at 1 column, 2x slower at 64-512); llama.cpp repacks
every weight it can. The profile times each host matmul in both layouts (`Profile.layouts`; a
mixture of experts' expert matmuls too, at their recorded routing), the pass models cost a
placement's layouts (`PassModel.host_us`), and `choose` picks, for each host weight, the layout of
least workload-weighted time:

  single   plain or repacked, whichever costs less over the workload's passes;
  dual     both copies, each op using the repacked one below `dual_max_batch` columns and the
           plain one from there: never slower than either, but it holds the weight's bytes twice.
           Given a host-memory budget for weights (`--host-budget`), weights go dual in order of
           time saved per extra byte while the budget allows, for the threshold that saves most.

A weight whose op the placement streams to the accelerator needs plain host memory (dual keeps
a plain copy, so it may go dual). Weights the plan does not name stay as llama.cpp puts them;
a plan with layouts loads with llama.cpp's repacking off and names every repacked weight, so the
plan lists every host weight that has a repacked layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..runtime.planfile import NEVER
from .context import PlanContext
from .cost.profile import DUAL, PLAIN, REPACK
from .cost.schedmodel import Placement, op_batch

P = TypeVar("P")  # a plan (planner.plan.Plan)


@dataclass
class WeightCost:
    """One host weight's workload-weighted host matmul time in each layout (us)."""

    weight: str
    nbytes: int
    default: str  # the layout a default load gives it
    plain: float = 0.0
    repack: float = 0.0
    # (batch, workload weight, plain us, repacked us) of every op: the dual layout's cost at any threshold
    ops: tuple[tuple[int, float, float, float], ...] = ()
    streamed: bool = False  # the placement streams its op at some batch (needs a plain copy)
    fixed: bool = False  # keeps its default layout (not every op of it was timed in both)

    def single(self) -> str:
        if self.fixed:
            return self.default
        if self.streamed:
            return PLAIN
        return REPACK if self.repack < self.plain else PLAIN

    def cost(self, layout: str, dual_max_batch: int = 0) -> float:
        if layout == PLAIN:
            return self.plain
        if layout == REPACK:
            return self.repack
        if self.fixed:
            return float("inf")  # no dual layout for it
        return sum(w * (r if b < dual_max_batch else p) for b, w, p, r in self.ops)


def weight_costs(ctx: PlanContext, p: Placement) -> dict[str, WeightCost]:
    """Every host weight whose matmuls the profile timed in both layouts, with its costs under
    `p` (ops the placement runs on the accelerator do not count)."""
    pw = ctx.workload.pass_weights()
    acc: dict[str, dict[str, Any]] = {}
    excluded: set[str] = set()
    for n, pm in ctx.passes.items():
        dev = pm.assign(p)
        w_n = pw.get(n, 0.0)
        for i in pm.targets:
            node = pm.graph.nodes[i]
            w = node.weight
            if not w or w in p.on_acc:
                continue
            e = acc.setdefault(w, {"default": pm.default_layout[i], "ops": [], "streamed": False})
            lays = pm.t_layout.get(i)
            if lays is None:
                excluded.add(w)  # an op of this weight was not timed in both layouts
                continue
            if dev[i]:
                e["streamed"] = True  # streamed at this batch: runs on the accelerator
                continue
            e["ops"].append((op_batch(node), w_n, lays[PLAIN], lays[REPACK]))
    out: dict[str, WeightCost] = {}
    for w, e in acc.items():
        if w in excluded:
            if e["default"] == REPACK:  # keeps its default layout, named (the load turns repacking off)
                out[w] = WeightCost(w, ctx.weight_bytes[w], REPACK, fixed=True)
            continue
        streamed = e["streamed"] or p.min_batch.get(w, NEVER) < NEVER
        ops = tuple(e["ops"])
        out[w] = WeightCost(w, ctx.weight_bytes[w], e["default"], sum(x[1] * x[2] for x in ops),
                            sum(x[1] * x[3] for x in ops), ops, streamed)
    return out


def choose(ctx: PlanContext, p: Placement, host_extra: int = 0) -> tuple[Placement, dict[str, Any]]:
    """`p` with a layout for every host weight that has a repacked one (see module docstring).
    host_extra: bytes of host memory the dual copies may use (0: no dual layouts)."""
    costs = weight_costs(ctx, p)
    if not costs:
        return p, {"layouts": "none: no host weight has a repacked layout in the profile"}
    single = {w: c.single() for w, c in costs.items()}
    base_us = sum(costs[w].cost(lay) for w, lay in single.items() if not costs[w].fixed)
    best: tuple[float, int, list[str]] = (0.0, 0, [])  # (us saved, threshold, dual weights)
    batches = sorted({b for c in costs.values() for b, *_ in c.ops})
    for t in (b + 1 for b in batches[:-1]):  # a threshold between two batches the workload runs
        gains = sorted(((costs[w].cost(single[w]) - c.cost(DUAL, t), w) for w, c in costs.items() if not c.fixed),
                       key=lambda g: -g[0] / max(costs[g[1]].nbytes, 1))
        chosen, used, saved = [], 0, 0.0
        for g, w in gains:
            if g <= 0 or used + costs[w].nbytes > host_extra:
                continue
            chosen.append(w)
            used += costs[w].nbytes
            saved += g
        if saved > best[0]:
            best = (saved, t, chosen)
    saved, threshold, dual = best
    layouts = {**single, **{w: DUAL for w in dual}}
    default_us = sum(c.cost(c.default) for c in costs.values() if not c.fixed)
    counts = {lay: sum(1 for v in layouts.values() if v == lay) for lay in (PLAIN, REPACK, DUAL)}
    details = {"layouts": counts, "dual_max_batch": threshold if dual else 0,
               "dual_extra_bytes": sum(costs[w].nbytes for w in dual), "host_extra_budget": host_extra,
               "predicted_host_matmul_ms": {"default": default_us / 1e3, "chosen": (base_us - saved) / 1e3}}
    return p.with_layouts(layouts, threshold if dual else 0), details


def summary(layouts: Mapping[str, str]) -> str:
    """"12 plain, 7 repacked, 3 dual" for a plan's layouts."""
    names = {PLAIN: "plain", REPACK: "repacked", DUAL: "dual"}
    parts = [f"{sum(1 for v in layouts.values() if v == k)} {n}" for k, n in names.items()]
    return ", ".join(p for p in parts if not p.startswith("0 ")) or "none"


def with_plain_layouts(ctx: PlanContext, plan: P, weights: Sequence[str]) -> P | None:
    """`plan` (llama.cpp's default load on the CPU alone) with `weights` (those the host can lay out
    both ways) in plain memory: llama.cpp's `--no-repack` (None: no such weight). One of llama.cpp's
    own placements: on this project's EPYC VM it ran 512-token prompts 1.4-1.7x faster than the
    default (bench/results/2026-11-29-vm-paired-layouts), and where the plan's per-weight choice is
    wrong (StarCoder2-7B, bench/results/2026-11-29-vm-paired-nodes) it is what a user would run."""
    if not weights:
        return None
    p = plan.placement.with_layouts(dict.fromkeys(weights, PLAIN))
    return dataclasses.replace(plan, strategy="no-repack", placement=p,
                               predicted=ctx.predict(p))


def with_default_layouts(ctx: PlanContext, plan: P) -> P | None:
    """`plan`'s placement with llama.cpp's own host layouts (None: it already has them): a distinct
    plan worth measuring, since host layouts are where the model's choices are closest."""
    if not plan.placement.layouts:
        return None
    p = plan.placement.with_layouts({})
    return dataclasses.replace(plan, placement=p, predicted=ctx.predict(p),
                               extra={**plan.extra, "layouts": "default"})
