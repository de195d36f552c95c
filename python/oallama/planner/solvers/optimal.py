"""Optimal: the placement with the least predicted time for a stated workload, exactly.

A mixed-integer linear program over the scheduler model of `schedmodel` (which reproduces
ggml's node -> device assignment), solved with HiGHS. Decisions:

  x[w]     weight w lives on the accelerator                                  (binary)
  kv[l]    layer l is on the accelerator: its KV cache and the nodes llama.cpp
           pins to it; trailing (kv[l] <= kv[l+1]) as n_gpu_layers makes it  (binary)
  s[w,b]   a host weight's ops of batch b are streamed to the accelerator
           (FlexGen-style, patch 0001); s <= 1 - x, monotone in b            (binary)

Every non-view node's device is then linear in these: a constant, x[w] + s[w,b], kv[l], or, for
a node the scheduler spreads to, r = OR(device of the pass-1 node before, after), linearised as
r >= a, r >= b, r <= a + b. Copies and split switches are linearised with one non-negative
variable per direction (up >= c - s, down >= s - c), charged T'(bytes) or a launch cost.

  minimise   sum over passes p of  weight_p * (compute_p + copies_p + launches_p)
  subject to sum_w M_w x[w] + sum_l KV_l kv[l] + R + m <= budget      (bytes)
             m >= M_w s[w,b]   (a streamed weight needs room in the compute buffer)
  (R: the accelerator's compute buffers, measured by llama.cpp for the plan and corrected until
  the plan fits; the all-host placement it needlessly charges is compared separately)

With every integer variable fixed the objective equals `PassModel.cost` summed over the passes
(tests/test_plan.py checks that, and that the optimum equals brute force on small instances).
Full offload (every layer's KV on the accelerator) changes which nodes llama.cpp pins, so it is
solved as a separate program with kv fixed to 1.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np

from ..cost.schedmodel import NEVER, PassModel, Placement
from . import chaindp


class _Lin:
    """const + sum(coef * var): a linear expression over LP columns."""

    __slots__ = ("c", "t")

    def __init__(self, c: float = 0.0, t: Mapping[int, float] | None = None) -> None:
        self.c = c
        self.t = dict(t or {})

    def key(self) -> tuple:
        return (round(self.c, 12), tuple(sorted(self.t.items())))

    def minus(self, o: _Lin) -> _Lin:
        t = dict(self.t)
        for k, v in o.t.items():
            t[k] = t.get(k, 0.0) - v
        return _Lin(self.c - o.c, {k: v for k, v in t.items() if v != 0.0})

    @property
    def constant(self) -> bool:
        return not self.t

    def affine(self, base: float, slope: float) -> _Lin:
        """base + slope * self"""
        return _Lin(base + slope * self.c, {k: slope * v for k, v in self.t.items()})


class _Program:
    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []
        self.offset = 0.0

    def var(self, lb: float = 0.0, ub: float = 1.0, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(0.0)
        self.integer.append(integer)
        return len(self.lb) - 1

    def add_cost(self, e: _Lin, scale: float) -> None:
        self.offset += e.c * scale
        for k, v in e.t.items():
            self.cost[k] += v * scale

    def geq(self, lhs: _Lin, rhs: _Lin) -> None:
        """lhs >= rhs"""
        d = lhs.minus(rhs)
        if d.constant:
            if d.c < -1e-9:
                raise ValueError("infeasible constant constraint")
            return
        self.rows.append((d.t, -d.c, math.inf))

    def leq_const(self, e: _Lin, bound: float) -> None:
        self.rows.append((dict(e.t), -math.inf, bound - e.c))

    def solve(self, time_limit: float, cutoff: float | None = None,
              start: Mapping[int, float] | None = None) -> tuple[str, np.ndarray, float, float]:
        """(status, column values, objective, relative MIP gap).

        A small portfolio, measured on 32B-shaped programs: HiGHS without presolve proves most
        of them optimal in well under a second but stalls on a few; with presolve it solves some
        of those. So: without presolve for a short while, then with presolve for the rest of the
        time, seeded with the best solution so far. A run cut short keeps its best solution and
        reports the remaining gap."""
        first = min(3.0, time_limit / 3)
        result = self.run(first, cutoff, start, presolve=False)
        if result[0] == "Optimal" or time_limit - first <= 0.5:
            return result
        seed = start
        if math.isfinite(result[2]):
            seed = {i: float(round(result[1][i])) for i in range(len(self.lb)) if self.integer[i]}
        second = self.run(time_limit - first, cutoff, seed, presolve=True)
        return second if second[2] <= result[2] else result

    def run(self, time_limit: float, cutoff: float | None, start: Mapping[int, float] | None,
             presolve: bool) -> tuple[str, np.ndarray, float, float]:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", 1e-6)
        h.setOptionValue("presolve", "on" if presolve else "off")
        if cutoff is not None:  # only solutions better than this matter (another mode's optimum, us)
            h.setOptionValue("objective_bound", float(cutoff))
        n = len(self.lb)
        inf = highspy.kHighsInf
        h.addVars(n, np.array(self.lb), np.array([inf if math.isinf(u) else u for u in self.ub]))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.cost))
        # the constant part too (us): HiGHS's objective, bound, relative gap (mip_rel_gap and the
        # reported gap) are then of the predicted time itself, not of its variable part, which can
        # be near 0 or negative (a 48-layer MoE's: -1.3e6 us of 5.8e7, its gap overstated 40x)
        h.changeObjectiveOffset(float(self.offset))
        ints = np.array([i for i in range(n) if self.integer[i]], dtype=np.int32)
        if len(ints):
            h.changeColsIntegrality(len(ints), ints, np.array([highspy.HighsVarType.kInteger] * len(ints)))
        if self.rows:
            lo = np.array([-inf if math.isinf(r[1]) else r[1] for r in self.rows])
            hi = np.array([inf if math.isinf(r[2]) else r[2] for r in self.rows])
            starts, idx, val = [], [], []
            for terms, _, _ in self.rows:
                starts.append(len(idx))
                idx.extend(terms.keys())
                val.extend(terms.values())
            h.addRows(len(self.rows), lo, hi, len(idx), np.array(starts, dtype=np.int32),
                      np.array(idx, dtype=np.int32), np.array(val))
        if start:  # a known placement (integer columns only): HiGHS completes and keeps it if feasible
            keys = np.array(sorted(start), dtype=np.int32)
            h.setSolution(len(keys), keys, np.array([start[int(k)] for k in keys], dtype=np.float64))
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal and not has_solution:
            return status, np.zeros(n), math.inf, math.inf
        x = np.array(h.getSolution().col_value)
        return status, x, float(info.objective_function_value), float(info.mip_gap)


METHODS = ("auto", "milp", "dp")
AUTO_DP_SHARE = 0.6  # of the time limit: the dynamic program's, in method "auto" (exact, and mostly the faster)


@dataclass
class Solution:
    placement: Placement
    objective_us: float  # the program's optimum: sum of weight_p * predicted pass time
    solve_s: float  # seconds solving (the dynamic program, building the MILP, HiGHS)
    n_vars: int  # of the MILP (0: the dynamic program solved it)
    n_rows: int
    status: str
    stream_batches: dict[str, list[int]] = field(default_factory=dict)  # host weight -> batches streamed
    build_s: float = 0.0  # seconds building the program (the rest of solve_s is HiGHS)
    gap: float = 0.0  # relative MIP gap of the predicted time: <= 1e-6 when proven optimal, more when the
    #                   time limit cut the search
    method: str = "milp"  # which solver found it: "milp" (HiGHS) or "dp" (chaindp, always exact)


def solve(passes: Sequence[tuple[PassModel, float]], *, weight_bytes: Mapping[str, int],
          kv_bytes: Mapping[int, int], budget: int, reserve: int = 0, full: bool = False,
          stream: bool = True, fixed: Mapping[str, bool] | None = None, no_stream: Collection[str] = (),
          time_limit: float = 60.0, cutoff_us: float | None = None,
          start: Placement | None = None, method: str = "auto") -> Solution | None:
    """Best placement for passes [(model, weight)] within `budget` accelerator bytes.

    reserve: compute-buffer bytes the accelerator needs as soon as anything runs there.
    full: every layer on the accelerator (n_gpu_layers = n_layer + 1); else some layers stay.
    stream: allow streaming host weights (per-weight op offload); fixed: weight -> on_acc forced;
    no_stream: weights that must not be streamed.
    cutoff_us: only look for solutions better than this objective (us), e.g. another mode's optimum.
    start: a known placement to start from (e.g. the best baseline); time_limit bounds the search,
    and a search cut short returns its best solution with the remaining gap.
    method: "milp" (HiGHS), "dp" (`chaindp`: exact, raises chaindp.NotDecomposable where its fronts
    or `time_limit` run out), "auto": the dynamic program within AUTO_DP_SHARE of the time limit,
    then, unless it solved the program, HiGHS for the rest (from the walk's optimum without
    streaming options, where it found that).
    Both programs charge every pass its whole time outside the graph; the placement that runs
    nothing on the accelerator saves part of it where the runtime then loads without the
    accelerator (`PassModel.detached_us`), so it is compared with their optimum afterwards.
    Returns None when nothing satisfies the budget (e.g. full offload's KV alone exceeds it), or
    nothing beats the cutoff.
    """
    t0 = time.perf_counter()
    sol = _solve(passes, weight_bytes=weight_bytes, kv_bytes=kv_bytes, budget=budget, reserve=reserve, full=full,
                 stream=stream, fixed=fixed, no_stream=no_stream, time_limit=time_limit, cutoff_us=cutoff_us,
                 start=start, method=method)
    if full or any((fixed or {}).values()) or not any(pm.detached_us > 0 for pm, _ in passes):
        return sol
    host = Placement(frozenset(), 0, {w: NEVER for w in set().union(*(pm.weights for pm, _ in passes))})
    us = sum(w * pm.cost(host).total_us for pm, w in passes)
    if (sol is not None and us >= sol.objective_us) or (cutoff_us is not None and us >= cutoff_us):
        return sol
    return Solution(host, us, time.perf_counter() - t0, sol.n_vars if sol else 0, sol.n_rows if sol else 0,
                    sol.status if sol else "Optimal", {}, sol.build_s if sol else 0.0, sol.gap if sol else 0.0,
                    sol.method if sol is not None else ("milp" if method == "milp" else "dp"))


def _solve(passes: Sequence[tuple[PassModel, float]], *, weight_bytes: Mapping[str, int],
          kv_bytes: Mapping[int, int], budget: int, reserve: int = 0, full: bool = False,
          stream: bool = True, fixed: Mapping[str, bool] | None = None, no_stream: Collection[str] = (),
          time_limit: float = 60.0, cutoff_us: float | None = None,
          start: Placement | None = None, method: str = "auto") -> Solution | None:
    """`solve` without the comparison with the host-only placement."""
    t0 = time.perf_counter()
    if method not in METHODS:
        raise ValueError(f"optimal.solve: method {method!r} (one of {', '.join(METHODS)})")
    fixed = dict(fixed or {})
    no_stream_plan: Placement | None = None
    if method != "milp":  # the dynamic program (exact); "auto": within a share of the time
        dp_args = {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "budget": budget, "reserve": reserve,
                   "full": full, "stream": stream, "fixed": fixed, "no_stream": no_stream, "cutoff_us": cutoff_us}
        start_us = None
        if start is not None and (start.kv_layers >= passes[0][0].n_layer) == full:
            start_us = sum(w * pm.cost(start).total_us for pm, w in passes)
        if method == "dp":
            return _dp_solution(chaindp.solve(passes, **dp_args, start_us=start_us, time_limit=time_limit), t0)
        try:  # the walk decides streaming too: its optimum without streaming options first bounds the rest
            return _dp_solution(chaindp.solve(passes, **dp_args, start_us=start_us,
                                              time_limit=AUTO_DP_SHARE * time_limit), t0)
        except chaindp.NotDecomposable as e:  # its best placement so far, if any, starts HiGHS
            no_stream_plan = e.incumbent.placement if e.incumbent is not None else None
    pm0 = passes[0][0]
    n_layer = pm0.n_layer
    prog = _Program()

    weights = sorted(set().union(*(pm.weights for pm, _ in passes)))
    acc_ok = {w: all(pm.acc_ok.get(w, True) for pm, _ in passes) for w in weights}
    x: dict[str, int] = {}
    for w in weights:
        ub = 1.0 if acc_ok[w] else 0.0
        lb = 0.0
        if w in fixed:
            lb = ub = float(fixed[w])
        x[w] = prog.var(lb, ub, integer=True)
    kv: dict[int, int] = {}
    if not full:
        for layer in range(n_layer):
            kv[layer] = prog.var(0.0, 0.0 if layer == 0 else 1.0, integer=True)  # layer 0 on the host: not full
        for layer in range(n_layer - 1):
            prog.geq(_Lin(0, {kv[layer + 1]: 1}), _Lin(0, {kv[layer]: 1}))
    # streaming decisions per (weight, batch)
    s: dict[tuple[str, int], int] = {}
    if stream:
        for pm, _ in passes:
            for i in pm.order:
                k = pm.kinds[full][i]
                if (k[0] == "w" and k[2] and (k[1], k[4]) not in s and not fixed.get(k[1], False)
                        and k[1] not in no_stream):
                    s[(k[1], k[4])] = prog.var(0.0, 1.0, integer=True)
        for (w, _), v in s.items():
            prog.geq(_Lin(1, {x[w]: -1}), _Lin(0, {v: 1}))  # s <= 1 - x
        by_w: dict[str, list[int]] = {}
        for w, b in s:
            by_w.setdefault(w, []).append(b)
        for w, bs in by_w.items():
            bs.sort()
            for b1, b2 in itertools.pairwise(bs):
                prog.geq(_Lin(0, {s[(w, b2)]: 1}), _Lin(0, {s[(w, b1)]: 1}))  # a threshold: monotone

    def layer_expr(layer: int) -> _Lin:
        return _Lin(1.0) if full else _Lin(0, {kv[layer]: 1})

    or_cache: dict[tuple, _Lin] = {}

    def or_expr(a: _Lin, b: _Lin) -> _Lin:
        if (a.constant and a.c >= 1) or (b.constant and b.c >= 1):
            return _Lin(1.0)
        if a.constant:
            return b
        if b.constant:
            return a
        key = (a.key(), b.key())
        if key not in or_cache:
            r = prog.var()
            rl = _Lin(0, {r: 1})
            prog.geq(rl, a)
            prog.geq(rl, b)
            sum_ab = _Lin(a.c + b.c, {**a.t})
            for k, v in b.t.items():
                sum_ab.t[k] = sum_ab.t.get(k, 0.0) + v
            prog.geq(sum_ab, rl)
            or_cache[key] = rl
        return or_cache[key]

    for pm, pass_weight in passes:
        kind, anchors = pm.kinds[full], pm.anchor_map[full]
        dev: dict[int, _Lin] = {}
        for i in pm.order:
            k = kind[i]
            if k[0] == "c":
                dev[i] = _Lin(float(k[1]))
            elif k[0] == "kv":
                dev[i] = layer_expr(k[1])
            elif k[0] == "w":
                e = _Lin(0, {x[k[1]]: 1})
                if (k[1], k[4]) in s:
                    e.t[s[(k[1], k[4])]] = 1.0
                dev[i] = e
        for i, (a, b) in anchors.items():
            if not kind[i][1]:
                dev[i] = _Lin(0.0)
                continue
            dev[i] = or_expr(dev[a] if a is not None else _Lin(0.0), dev[b] if b is not None else _Lin(0.0))

        def source(src: tuple, dev: dict[int, _Lin] = dev) -> _Lin:
            if src[0] == "node":
                return dev[src[1]]
            if src[0] == "w":
                return _Lin(0, {x[src[1]]: 1})
            if src[0] == "kv":
                return layer_expr(src[1])
            return _Lin(float(src[1]))

        # compute (weight matmuls and, when calibrated, every other op), and the time outside the graph
        prog.offset += pm.fixed_us * pass_weight
        for i, th in pm.t_host.items():
            prog.add_cost(dev[i].affine(th, pm.t_acc[i] - th), pass_weight)
        # copies: one per (source, direction), sized by the largest read
        reads: dict[tuple, tuple[int, dict[tuple, _Lin]]] = {}
        for i in pm.order:
            for src, nbytes in pm.reads[i]:
                b, cons = reads.get(src, (0, {}))
                cons[dev[i].key()] = dev[i]
                reads[src] = (max(b, nbytes), cons)
        for src, (nbytes, cons) in reads.items():
            se = source(src)
            if src[0] == "w":  # a streamed weight (of an expert tensor: its routed experts)
                up_cost = pm.stream.time_us(round(nbytes * pm.copied_share.get(src[1], 1.0)))
            else:
                up_cost = pm.h2d.time_us(nbytes)
            down_cost = pm.d2h.time_us(nbytes)
            # a copy is paid once per direction: where a reader on a fixed device already pays it,
            # readers whose device varies add nothing in that direction (charging both counted the
            # copy twice: every full-offload program, whose layer-pinned readers are constants)
            diffs = [c.minus(se) for c in cons.values()]  # > 0: read on the accelerator, lives on the host
            paid_up = any(d.constant and d.c > 0.5 for d in diffs)
            paid_down = any(d.constant and d.c < -0.5 for d in diffs)
            prog.offset += (up_cost * paid_up + down_cost * paid_down) * pass_weight
            up = down = None
            for c, d in zip(cons.values(), diffs, strict=True):
                if d.constant:
                    continue
                if not paid_up:
                    if up is None:
                        up = prog.var(0, 1)
                        prog.cost[up] += up_cost * pass_weight
                    prog.geq(_Lin(0, {up: 1}), d)
                if not paid_down:
                    if down is None:
                        down = prog.var(0, 1)
                        prog.cost[down] += down_cost * pass_weight
                    prog.geq(_Lin(0, {down: 1}), se.minus(c))
        if pm.readback is not None:  # the logits, read back when computed on the accelerator
            prog.add_cost(dev[pm.readback[0]].affine(0.0, pm.d2h.time_us(pm.readback[1])), pass_weight)
        # launches: the first split, then every switch of device along the order
        prog.add_cost(dev[pm.order[0]].affine(pm.launch[0], pm.launch[1] - pm.launch[0]), pass_weight)
        for i, j in zip(pm.order, pm.order[1:], strict=False):
            a, b = dev[i], dev[j]
            if a.key() == b.key():
                continue
            d = b.minus(a)
            if d.constant:
                if abs(d.c) > 0.5:
                    prog.offset += pm.launch[1 if d.c > 0 else 0] * pass_weight
                continue
            up, down = prog.var(0, 1), prog.var(0, 1)
            prog.cost[up] += pm.launch[1] * pass_weight
            prog.cost[down] += pm.launch[0] * pass_weight
            prog.geq(_Lin(0, {up: 1}), d)
            prog.geq(_Lin(0, {down: 1}), a.minus(b))

    # memory, in units of the budget: byte counts (~1e10) in a row mislead HiGHS's tolerances
    unit = float(max(budget, 1))
    mem = _Lin(0.0)
    for w in weights:
        mem.t[x[w]] = weight_bytes.get(w, 0) / unit
    if full:
        mem.c += sum(kv_bytes.values()) / unit
    else:
        for layer, v in kv.items():
            mem.t[v] = mem.t.get(v, 0.0) + kv_bytes.get(layer, 0) / unit
    # the compute buffers' reserve is charged as a constant: the all-host placement it wrongly
    # charges stays feasible (whenever the budget covers the reserve) and costs the same, and an
    # "anything on the accelerator" indicator would only weaken the relaxation
    mem.c += reserve / unit
    if s:
        m = prog.var(0.0, math.inf)  # the largest streamed weight, in budget units
        for (w, _), v in s.items():
            prog.geq(_Lin(0, {m: 1}), _Lin(0, {v: weight_bytes.get(w, 0) / unit}))
        mem.t[m] = 1.0
    if mem.c > 1.0:
        return None
    prog.leq_const(mem, 1.0)

    t_build = time.perf_counter() - t0
    defaults = {(k[1], k[4]): k[3] for pm, _ in passes for k in pm.kinds[full].values() if k[0] == "w"}

    def columns(p: Placement) -> dict[int, float]:
        """A placement as a start for HiGHS (integer columns; HiGHS completes the rest)."""
        cols = {x[w]: float(w in p.on_acc) for w in weights if prog.lb[x[w]] < prog.ub[x[w]]}
        for layer, v in kv.items():
            cols[v] = float(layer >= n_layer - p.kv_layers)
        for (w, b), v in s.items():
            cols[v] = float(w not in p.on_acc and p.streams(w, b, defaults.get((w, b), False)))
        return cols

    start_cols = columns(start) if start is not None and (start.kv_layers >= n_layer) == full else None
    if method == "milp":
        status, sol, obj, gap = prog.solve(time_limit, cutoff_us, start_cols)
    else:  # auto, the dynamic program unfinished: HiGHS, from its plan without streaming if any
        # (with presolve: it finds the good plans of large programs, measured on a 64-layer 32B and
        # a 48-layer MoE shape; 3 s without presolve left them 2.5-6.5% from the optimum)
        seed = columns(no_stream_plan) if no_stream_plan is not None else start_cols
        left = time_limit - (time.perf_counter() - t0)
        status, sol, obj, gap = prog.run(max(0.5, left), cutoff_us, seed, presolve=True)
    elapsed = time.perf_counter() - t0
    if not math.isfinite(obj) or (cutoff_us is not None and obj >= cutoff_us * (1 - 1e-9)):
        return None
    on_acc = frozenset(w for w in weights if sol[x[w]] > 0.5)
    kv_layers = n_layer if full else round(sum(sol[v] for v in kv.values()))
    streamed: dict[str, list[int]] = {}
    for (w, b), v in s.items():
        if sol[v] > 0.5:
            streamed.setdefault(w, []).append(b)
    # every host weight gets an explicit policy: the smallest batch it streams at, else never
    min_batch = {w: (min(streamed[w]) if w in streamed else NEVER) for w in weights if w not in on_acc}
    return Solution(Placement(on_acc, kv_layers, min_batch), obj, elapsed, len(prog.lb), len(prog.rows), status,
                    {w: sorted(b) for w, b in streamed.items()}, t_build, gap)


def _dp_solution(r: chaindp.Result | None, t0: float) -> Solution | None:
    if r is None:  # exact: nothing fits, or nothing beats the cutoff
        return None
    return Solution(r.placement, r.objective_us, time.perf_counter() - t0, 0, 0, "Optimal", r.stream_batches,
                    0.0, 0.0, "dp")
