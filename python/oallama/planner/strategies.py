"""Placement strategies behind one interface (seed 002: operator affinity, and its baselines).

Each strategy is one object with a `name` and one method, `place(ctx, budget, search)`, that
returns its placement, llama.cpp's accounting of that placement's memory, and its details; all
are costed by the same scheduler model (`schedmodel`) and checked against the budget with
llama.cpp's own memory accounting (`verify`). `plan.make_plan` builds every plan from them.

  layers    what llama.cpp's -ngl gives on the same budget: the largest n_gpu_layers that fits.
  affinity  the paper's Algorithm 1 (seed 000), see `affinity_order`.
  optimal   the least predicted time for the workload, exactly (`optimal.solve`), stage-aware:
            a host weight also gets the batch from which its op is streamed to the accelerator.
  fit       (benchmark baseline) llama.cpp's own --fit aimed at the budget.
  flexgen   (benchmark baseline) every weight in host memory, every op streamed.
  n-cpu-moe (benchmark baseline, mixtures of experts) llama.cpp's `-ngl 99 --n-cpu-moe N` with the
            smallest N that fits the budget, searched as a user would (every layer on the
            accelerator, the expert tensors of the first N layers in host memory).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import PlanError
from ..runtime import devices as devmod
from ..runtime.place import TIED, layer_weights, tied_output
from .context import PlanContext
from .cost.schedmodel import Placement
from .graph import GraphSession
from .solvers import optimal
from .verify import all_on_host, fit_to_budget, measure_memory, session_memory

TIME_LIMIT_S = 10.0  # seconds the exact solver may search per offload mode (then: its best plan and gap)
WIN_MARGIN_MS = 1e-9  # a candidate replaces the solver's plan only when predicted faster by more than this


class Candidate(Protocol):
    """A plan already made for the same budget (`plan.Plan` is one)."""

    strategy: str
    placement: Placement
    memory: dict[str, int]
    stock_layers: bool
    extra: dict[str, Any]


@dataclass(frozen=True)
class Search:
    """What a strategy may use besides the context and the budget."""

    candidates: Sequence[Candidate] = ()  # plans made before for this budget (optimal starts from them)
    time_limit: float = TIME_LIMIT_S  # seconds the exact solver may search per offload mode
    progress: bool = False  # log each step on stderr


@dataclass
class Placed:
    """A strategy's answer."""

    placement: Placement
    memory: dict[str, int]  # bytes on the accelerator, from llama.cpp's accounting of the load
    details: dict[str, Any] = field(default_factory=dict)  # the plan's "extra"
    stock_layers: bool = False  # load with n_gpu_layers alone (llama.cpp's own placement)
    raw_overrides: list[tuple[str, str]] = field(default_factory=list)  # llama.cpp's own patterns ("fit")


class Strategy(Protocol):
    name: str
    baseline: bool  # a benchmark baseline, not offered by `oallama plan`

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        """The strategy's placement within `budget` accelerator bytes, verified to fit."""
        ...


# --- layers: llama.cpp's -ngl ---------------------------------------------------------------------


def place_layers(ctx: PlanContext, n_gpu_layers: int) -> Placement:
    """What llama.cpp's n_gpu_layers puts on the accelerator (default op offload); of a tied
    embedding, the output copy (the placement's `token_embd.weight`, place.explicit)."""
    tied = {TIED} if n_gpu_layers >= 1 and tied_output(ctx.weight_bytes) else set()
    on = frozenset(w for w in layer_weights(ctx.weight_bytes, n_gpu_layers, ctx.n_layer) | tied
                   if w in ctx.weight_bytes and w not in ctx.kept_on_host)
    return Placement(on, min(max(n_gpu_layers - 1, 0), ctx.n_layer))


class Layers:
    name = "layers"
    baseline = False

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        """Largest n_gpu_layers whose load fits (`largest_fitting`)."""
        n, loads = largest_fitting(ctx, budget, ctx.n_layer + 1, lambda n: place_layers(ctx, n),
                                   lambda n: measure_memory(ctx, place_layers(ctx, n), stock_layers=n))
        return Placed(place_layers(ctx, n), loads[n], {"n_gpu_layers": n, "loads": len(loads)}, stock_layers=True)


def largest_fitting(ctx: PlanContext, budget: int, top: int, placement: Callable[[int], Placement],
                    load: Callable[[int], dict[str, int]]) -> tuple[int, dict[int, dict[str, int]]]:
    """The largest k in [0, top] whose load (llama.cpp's accounting of placement(k), which grows
    with k) fits `budget`, or 0 when none does: (k, the loads measured, by k). Load 0 first; each
    probe then where the weights and cache placement(k) puts on the accelerator (`acc_bytes`), plus
    the last load's other bytes (compute buffers), would reach the budget (`guided_search`)."""
    loads: dict[int, dict[str, int]] = {}

    def fits(k: int) -> bool:
        loads[k] = load(k)
        return loads[k]["total"] <= budget

    def guess(lo: int, hi: int, last: int) -> int:
        other = loads[last]["total"] - ctx.acc_bytes(placement(last))  # bytes
        return max((k for k in range(lo + 1, hi + 1) if ctx.acc_bytes(placement(k)) + other <= budget),
                   default=lo + 1)

    if not fits(0):
        return 0, loads
    return guided_search(0, top, fits, guess), loads


def guided_search(lo: int, hi: int, fits: Callable[[int], bool], guess: Callable[[int, int, int], int],
                  misses: int = 2) -> int:
    """The largest n in [lo, hi] with fits(n), lo taken as the answer when none above it fits
    (fits is monotone: true up to the answer, false above). Each probe is guess(lo, hi, last
    probe) for the first `misses` probes (a guess outside the bracket: its middle), then the
    bracket's middle: the same answer as a binary search, in fewer probes where the guesses are
    good, and never more than `misses` probes beyond a binary search's."""
    last, guided = lo, 0
    while lo < hi:
        g = guess(lo, hi, last) if guided < misses else -1
        mid = g if lo < g <= hi else (lo + hi + 1) // 2
        guided += 1
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
        last = mid
    return lo


# --- affinity: the paper's Algorithm 1 ----------------------------------------------------------


def affinity_order(ops: Sequence[tuple[str, float, float, int]], limit: float,
                   transfer_us: Callable[[frozenset[str]], Mapping[str, float]],
                   max_iter: int = 50) -> tuple[list[str], frozenset[str], int]:
    """The paper's Algorithm 1. ops: (name, T_c, T_g, M) with times in us and M in bytes.

    1. B_i = (T_c,i - T_g,i) / M_i, min-max normalised to G_i; order by G descending.
    2. Repeat: place by the current order (step 3); T'_i = transfer_us(placement)[i], the copy
       and launch time op i incurs on the accelerator given where its neighbours are under that
       placement; B_i = (T_c,i - T_g,i - T'_i) / M_i; normalise, re-sort; stop when the order no
       longer changes (or after max_iter rounds, keeping the last order).
    3. Walk the order adding M_i while the running total stays <= limit (the caller passes 90%
       of the memory available for weights): those go to the accelerator.
    Returns (order, names on the accelerator, rounds).
    """

    def rank(b: Mapping[str, float]) -> list[str]:
        lo, hi = min(b.values()), max(b.values())
        g = {k: (v - lo) / (hi - lo) if hi > lo else 0.0 for k, v in b.items()}
        return sorted(g, key=lambda k: (-g[k], k))

    def fill(order: Sequence[str]) -> frozenset[str]:
        chosen, total = [], 0
        size = {name: m for name, _, _, m in ops}
        for name in order:
            if total + size[name] > limit:
                break
            chosen.append(name)
            total += size[name]
        return frozenset(chosen)

    if not ops:
        return [], frozenset(), 0
    order = rank({n: (tc - tg) / max(m, 1) for n, tc, tg, m in ops})
    for it in range(1, max_iter + 1):
        tp = transfer_us(fill(order))
        new = rank({n: (tc - tg - tp.get(n, 0.0)) / max(m, 1) for n, tc, tg, m in ops})
        if new == order:
            return order, fill(order), it
        order = new
    return order, fill(order), max_iter


def place_affinity(ctx: PlanContext, weight_budget: float) -> tuple[Placement, dict[str, Any]]:
    """Algorithm 1 on the target ops' weights; T' from the scheduler model (see affinity_order).
    weight_budget: accelerator bytes available for weights."""
    pw = ctx.workload.pass_weights()
    tc: dict[str, float] = {}
    tg: dict[str, float] = {}
    for n, pm in ctx.passes.items():
        for i in pm.targets:
            t = pm.t_host[i]
            w = pm.graph.nodes[i].weight
            tc[w] = tc.get(w, 0.0) + pw.get(n, 0.0) * t
            tg[w] = tg.get(w, 0.0) + pw.get(n, 0.0) * pm.t_acc[i]
    ops = [(w, tc[w], tg[w], ctx.weight_bytes[w]) for w in sorted(tc) if all(pm.acc_ok.get(w, True)
                                                                            for pm in ctx.passes.values())]

    def transfer_us(on: frozenset[str]) -> dict[str, float]:
        # T'_i: what op i would pay to run on the accelerator while every other node runs where
        # the current placement `on` puts it: its activation inputs that live on the host come
        # over (h2d), its result goes back if any reader runs on the host (d2h), and each graph
        # neighbour on the host means one more split to launch
        out: dict[str, float] = {}
        p = Placement(on)
        for n, pm in ctx.passes.items():
            dev = pm.assign(p)
            pos = {i: k for k, i in enumerate(pm.order)}
            for i in pm.targets:
                node = pm.graph.nodes[i]
                t = 0.0
                for src, nbytes in pm.reads[i]:
                    if src[0] != "w" and not pm.source_on_acc(src, dev, p):
                        t += pm.h2d.time_us(nbytes)
                if any(not dev[r] for r in pm.graph.readers(i) if r in dev):
                    t += pm.d2h.time_us(node.nbytes)
                k = pos[i]
                for j in (k - 1, k + 1):
                    if 0 <= j < len(pm.order) and not dev[pm.order[j]]:
                        t += pm.launch[1] / 2 + pm.launch[0] / 2
                out[node.weight] = out.get(node.weight, 0.0) + pw.get(n, 0.0) * t
        return out

    order, on, rounds = affinity_order(ops, 0.9 * weight_budget, transfer_us)
    return Placement(on, 0), {"order": order, "rounds": rounds}


def _fitting(ctx: PlanContext, budget: int, candidates: Sequence[Candidate]) -> tuple[Placement | None, int]:
    """(the best candidate that fits, to start a search from; its measured compute-buffer
    overhead as the first estimate of the reserve, bytes). flexgen's streaming is no start."""
    fitting = [c for c in candidates if c.memory["total"] <= budget and c.strategy != "flexgen"]
    start = min(fitting, key=lambda c: ctx.objective_ms(c.placement)).placement if fitting else None
    reserve = max((c.memory["total"] - ctx.acc_bytes(c.placement) for c in fitting if c.placement.on_acc),
                  default=0)
    return start, reserve


class Affinity:
    name = "affinity"
    baseline = False

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        _, reserve = _fitting(ctx, budget, search.candidates)
        p, mem, details = fit_to_budget(ctx, self.name, budget, lambda r: place_affinity(ctx, max(budget - r, 0)),
                                        reserve=reserve, progress=search.progress)
        return Placed(p, mem, details)


# --- optimal: the MILP ------------------------------------------------------------------------


def _solve(ctx: PlanContext, budget: int, reserve: int, start: Placement | None,
           time_limit: float) -> tuple[Placement, dict[str, Any]]:
    """The MILP in both offload modes; details["solver_objective_ms"] is the predicted objective
    of the placement the solver chose (absent when it found none within the budget)."""
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    best: optimal.Solution | None = None
    spent = 0.0
    modes: dict[str, Any] = {}
    # partial offload first; full offload (every layer's KV on the accelerator) only where it beats that
    for full in (False, True):
        t0 = time.perf_counter()
        sol = optimal.solve(passes, weight_bytes=ctx.weight_bytes, kv_bytes=ctx.kv_bytes, budget=budget,
                            reserve=reserve, full=full, cutoff_us=best.objective_us if best else None,
                            start=start, time_limit=time_limit)
        spent += time.perf_counter() - t0
        modes["full" if full else "partial"] = {"seconds": round(time.perf_counter() - t0, 3),
                                                "objective_ms": sol.objective_us / 1e3 if sol else None,
                                                "status": sol.status if sol else "no better solution",
                                                "gap": sol.gap if sol else None,
                                                "method": sol.method if sol else None}
        if sol is not None and (best is None or sol.objective_us < best.objective_us):
            best = sol
    host = all_on_host(ctx)
    if best is None:  # nothing fits the program's memory model
        return host, {"solver": "infeasible", "solve_seconds": spent, "modes": modes}
    if ctx.objective_ms(host) * 1e3 < best.objective_us:
        # the program charges the compute-buffer reserve to the all-host placement too, which
        # needs none: compared here, outside the program
        return host, {"solver": "all on the host is best", "solve_seconds": spent, "modes": modes,
                      "mip_gap": best.gap, "solver_objective_ms": ctx.objective_ms(host)}
    return best.placement, {"solver_status": best.status, "mip_gap": best.gap, "solve_seconds": spent,
                            "modes": modes, "vars": best.n_vars, "rows": best.n_rows,
                            "objective_ms": best.objective_us / 1e3, "streamed": best.stream_batches,
                            "solver_objective_ms": ctx.objective_ms(best.placement)}


class Optimal:
    """The MILP, started from the best candidate; the plan records which placement won:
    details["winner"] is "solver" (its own plan), the name of a candidate that llama.cpp's
    accounting shows to fit and that is predicted faster (it can only win through the
    program's compute-buffer reserve estimate), or "host" (the solver found nothing that fits)."""

    name = "optimal"
    baseline = False

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        start, reserve = _fitting(ctx, budget, search.candidates)
        total = 0.0

        def attempt(r: int) -> tuple[Placement, dict[str, Any]]:
            nonlocal total
            p, details = _solve(ctx, budget, r, start, search.time_limit)
            total += float(details["solve_seconds"])
            return p, {**details, "solve_seconds_total": total}

        p, mem, details = fit_to_budget(ctx, self.name, budget, attempt, reserve=reserve, progress=search.progress)
        own = details.get("solver_objective_ms")
        details["solver_objective_ms"] = own  # None: the solver's plan is missing or does not fit
        chosen = Placed(p, mem, {**details, "winner": "solver" if own is not None else "host"})
        best_ms = ctx.objective_ms(p)
        for c in search.candidates:
            ms = ctx.objective_ms(c.placement)
            if c.memory["total"] <= budget and ms < best_ms - WIN_MARGIN_MS:
                won = {**details, "winner": c.strategy,
                       "winner_details": {k: v for k, v in c.extra.items() if k != "order"}}
                if "n_gpu_layers" in c.extra:
                    won["n_gpu_layers"] = c.extra["n_gpu_layers"]
                chosen, best_ms = Placed(c.placement, c.memory, won, c.stock_layers), ms
        return chosen


# --- baselines ---------------------------------------------------------------------------------


class Fit:
    """llama.cpp's --fit (common_fit_params) leaving free(accelerator) - budget bytes free there."""

    name = "fit"
    baseline = True

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        from .. import _core

        if not hasattr(_core, "fit_params"):
            raise PlanError("this oallama was built without llama-common (OALLAMA_TOOLS=OFF): no 'fit' baseline")
        free, _ = devmod.device_memory(ctx.acc)  # this device only: others may be gone
        margin = max(free - budget, 0)
        n_ubatch = ctx.workload.n_ubatch
        att = ctx.attention()
        r = _core.fit_params(str(ctx.model.path), [ctx.acc], [margin], ctx.workload.n_ctx, n_ubatch, n_ubatch,
                             int(att["flash_attn"]), att["type_k"], att["type_v"], ctx.workload.parallel,
                             ctx.workload.unified)
        ngl = r.n_gpu_layers if r.n_gpu_layers >= 0 else ctx.n_layer + 1
        raw = list(r.overrides)
        # where llama.cpp puts the weights with these parameters, read from a metadata-only load
        with GraphSession(ctx.model.path, devices=[ctx.acc], overrides=raw, n_gpu_layers=ngl,
                          **ctx.session_kwargs()) as s:
            placed = s.model_tensors()
            mem = session_memory(s, ctx.acc)
        on = frozenset(t.name for t in placed if t.device == ctx.acc)
        details = {"n_gpu_layers": ngl, "fits": r.fits, "margin_bytes": margin}
        # no patterns: n_gpu_layers alone, as --fit loads (the placement's names would put both copies
        # of a tied embedding where llama.cpp puts its output copy)
        return Placed(Placement(on, min(max(ngl - 1, 0), ctx.n_layer)), mem, details, raw_overrides=raw,
                      stock_layers=not raw)


class FlexGen:
    """Every weight in host memory, every op streamed to the accelerator (FlexGen-style)."""

    name = "flexgen"
    baseline = True

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        p = Placement(frozenset(), 0, {w: 1 for w in ctx.weight_bytes})
        return Placed(p, measure_memory(ctx, p))


_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(?:up|down|gate)_(?:ch|)exps\.")  # llama.cpp's --n-cpu-moe pattern


def expert_layers(names: Sequence[str] | Mapping[str, Any]) -> dict[str, int]:
    """Expert tensors (what --cpu-moe / --n-cpu-moe keep on the CPU) -> their layer."""
    return {w: int(m[1]) for w in names if (m := _EXPERTS.match(w))}


def place_n_cpu_moe(ctx: PlanContext, n_cpu_moe: int) -> Placement:
    """`-ngl <all> --n-cpu-moe N`: every layer on the accelerator but the first N layers' experts."""
    host = {w for w, layer in expert_layers(ctx.weight_bytes).items() if layer < n_cpu_moe}
    on = layer_weights(ctx.weight_bytes, ctx.n_layer + 1, ctx.n_layer)
    return Placement(frozenset(w for w in on if w in ctx.weight_bytes and w not in host and w not in ctx.kept_on_host),
                     ctx.n_layer)


class NCpuMoe:
    """The smallest --n-cpu-moe N whose load fits (memory falls as N grows: `largest_fitting`); when
    even every layer's experts on the CPU does not fit, what a user does next: fewer layers (`layers`)."""

    name = "n-cpu-moe"
    baseline = True

    def place(self, ctx: PlanContext, budget: int, search: Search) -> Placed:
        if not expert_layers(ctx.weight_bytes):
            raise PlanError(f"strategy '{self.name}': {ctx.model.path.name} has no expert tensors (not a mixture of "
                            "experts)")
        # k layers' experts on the accelerator: N = n_layer - k on the CPU
        def placement(k: int) -> Placement:
            return place_n_cpu_moe(ctx, ctx.n_layer - k)

        k, loads = largest_fitting(ctx, budget, ctx.n_layer, placement, lambda k: measure_memory(ctx, placement(k)))
        if loads[k]["total"] > budget:
            placed = Layers().place(ctx, budget, search)
            placed.details = {**placed.details, "n_cpu_moe": None,
                              "note": "every layer's experts on the CPU does not fit: fewer layers instead"}
            return placed
        return Placed(placement(k), loads[k], {"n_cpu_moe": ctx.n_layer - k, "n_gpu_layers": ctx.n_layer + 1,
                                                "loads": len(loads)})


# --- the registry --------------------------------------------------------------------------------

REGISTRY: dict[str, Strategy] = {s.name: s for s in (Layers(), Affinity(), Optimal(), Fit(), FlexGen(), NCpuMoe())}
STRATEGIES = tuple(n for n, s in REGISTRY.items() if not s.baseline)  # what `oallama plan` compares
BASELINES = tuple(n for n, s in REGISTRY.items() if s.baseline)  # benchmark baselines


def get(name: str) -> Strategy:
    """The strategy called `name` (PlanError naming the choices otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise PlanError(f"strategy '{name}': choose one of {', '.join(REGISTRY)}") from None
