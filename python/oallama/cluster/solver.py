"""The solvers of `oallama.cluster`'s block assignment: the MILP in two formulations
(HiGHS) and an exact dynamic program for contiguous plans. See distributed.py for the problem."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InfeasiblePlanError, PlanError
from .problem import CLIENT, FORMULATIONS, METHODS, Problem, Terms, _segments, evaluate, violation  # noqa: F401

# --- the MILP --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solution:
    assign: list[int]  # block j -> device index
    terms: Terms
    status: str
    time_s: float  # solver wall time (s)
    mip_gap: float
    n_vars: int
    n_rows: int
    method: str = "dp"  # "dp" or "milp/<formulation>"


def _highspy() -> Any:
    try:
        import highspy
    except ImportError:  # pragma: no cover - depends on the environment
        raise PlanError("the distributed planner needs HiGHS: pip install highspy") from None
    return highspy




class _Rows:
    """Row-wise sparse constraint matrix under construction."""

    def __init__(self) -> None:
        self.start: list[int] = [0]
        self.index: list[int] = []
        self.value: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, coefs: Sequence[tuple[int, float]], lower: float, upper: float) -> None:
        for c, v in coefs:
            self.index.append(c)
            self.value.append(v)
        self.start.append(len(self.index))
        self.lower.append(lower)
        self.upper.append(upper)


def _highs_lp(cost: np.ndarray, lower: np.ndarray, upper: np.ndarray, rows: _Rows, n_int: int) -> Any:
    """A HighsLp; the first n_int columns are integer."""
    hs = _highspy()
    n_cols, n_rows = len(cost), len(rows.lower)
    lp = hs.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = cost
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.array(rows.lower)
    lp.row_upper_ = np.array(rows.upper)
    lp.a_matrix_.format_ = hs.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n_cols
    lp.a_matrix_.num_row_ = n_rows
    lp.a_matrix_.start_ = np.array(rows.start, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(rows.index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(rows.value)
    lp.integrality_ = [hs.HighsVarType.kInteger] * n_int + [hs.HighsVarType.kContinuous] * (n_cols - n_int)
    return lp


def _lp_assignment(p: Problem, *, contiguous: bool, pin_first: bool) -> tuple[Any, Any, Any]:
    """The patent's variables. Columns: x[i,j] binary; w[j,i,k] for j >= 1 (block j-1 on device
    i and block j on device k: the product x[i,j-1] x[k,j], linearised by flow conservation
    sum_k w[j,i,k] = x[i,j-1], sum_i w[j,i,k] = x[k,j]; i != k is a transfer); u[i] used."""
    inf = _highspy().kHighsInf
    m, n = p.shape
    nx, nw = m * n, (n - 1) * m * m

    def x(i: int, j: int) -> int:
        return i * n + j

    def w(j: int, i: int, k: int) -> int:
        return nx + ((j - 1) * m + i) * m + k

    def u(i: int) -> int:
        return nx + nw + i

    n_cols = nx + nw + m
    cost, lower, upper = np.zeros(n_cols), np.zeros(n_cols), np.ones(n_cols)
    entry, exit_ = p.entry + p.entry_qos, p.exit + p.exit_qos
    for i in range(m):
        for j in range(n):
            cost[x(i, j)] = p.compute[i, j]
        cost[x(i, 0)] += entry[i, 0]
        cost[x(i, n - 1)] += exit_[i, n - 1]
        cost[u(i)] = p.w_c
        for j in range(1, n):
            for k in range(m):
                if k != i:
                    cost[w(j, i, k)] = exit_[i, j - 1] + entry[k, j]
    if pin_first:
        lower[x(0, 0)] = 1.0
    rows = _Rows()
    for j in range(n):
        rows.add([(x(i, j), 1.0) for i in range(m)], 1.0, 1.0)
    for j in range(1, n):
        for i in range(m):
            rows.add([*((w(j, i, k), 1.0) for k in range(m)), (x(i, j - 1), -1.0)], 0.0, 0.0)
            rows.add([*((w(j, k, i), 1.0) for k in range(m)), (x(i, j), -1.0)], 0.0, 0.0)
    for i in range(m):
        # memory in units of the device's capacity: with raw bytes (~1e8) HiGHS 1.15's presolve
        # returned non-optimal "optimal" plans; coefficients near 1 keep it exact
        cap = max(float(p.capacity[i]), 1.0)
        rows.add([(x(i, j), float(p.memory[j]) / cap) for j in range(n)], -inf, 1.0)
        for j in range(n):
            rows.add([(u(i), 1.0), (x(i, j), -1.0)], 0.0, inf)
        if contiguous:
            rows.add([(x(i, 0), 1.0), *((w(j, k, i), 1.0) for j in range(1, n) for k in range(m) if k != i)],
                     -inf, 1.0)

    def decode(values: np.ndarray) -> list[int]:
        xs = values[:nx].reshape(m, n)
        return [int(np.argmax(xs[:, j])) for j in range(n)]

    def encode(assign: Sequence[int]) -> np.ndarray:
        v = np.zeros(n_cols)
        for j, i in enumerate(assign):
            v[x(i, j)] = 1.0
            v[u(i)] = 1.0
            if j:
                v[w(j, assign[j - 1], i)] = 1.0
        return v

    return _highs_lp(cost, lower, upper, rows, nx), decode, encode


def _lp_segments(p: Problem, *, contiguous: bool, pin_first: bool) -> tuple[Any, Any, Any]:
    """The same MILP over runs: y[i,a,b] = 1 iff device i holds blocks a..b as one run
    (x[i,j] = sum over runs of i covering j). A plan is a path 0 -> n through the block
    boundaries whose arcs are runs; each run pays its compute, its entry at a and its exit at b,
    so the transfer term is linear without products, and a run that exceeds its device's
    memory is never generated. Contiguous: at most one run per device (and w_c per run is
    exactly w_c per device used). Otherwise: a memory row per device, u[i] >= y[i,a,b]."""
    inf = _highspy().kHighsInf
    m, n = p.shape
    entry, exit_ = p.entry + p.entry_qos, p.exit + p.exit_qos
    mem_prefix = np.concatenate([[0.0], np.cumsum(p.memory)])
    comp_prefix = np.concatenate([np.zeros((m, 1)), np.cumsum(p.compute, axis=1)], axis=1)
    runs: list[tuple[int, int, int]] = []
    costs: list[float] = []
    for i in range(m):
        for a in range(n):
            if a == 0 and pin_first and i != 0:
                continue
            for b in range(a, n):
                if mem_prefix[b + 1] - mem_prefix[a] > p.capacity[i] * (1 + 1e-12):
                    break
                runs.append((i, a, b))
                costs.append(comp_prefix[i, b + 1] - comp_prefix[i, a] + entry[i, a] + exit_[i, b]
                             + (p.w_c if contiguous else 0.0))
    ny = len(runs)
    n_cols = ny if contiguous else ny + m
    cost = np.zeros(n_cols)
    cost[:ny] = costs
    if not contiguous:
        cost[ny:] = p.w_c
    lower, upper = np.zeros(n_cols), np.ones(n_cols)
    starting: list[list[int]] = [[] for _ in range(n + 1)]
    ending: list[list[int]] = [[] for _ in range(n + 1)]  # runs ending before boundary t
    by_device: list[list[int]] = [[] for _ in range(m)]
    for r, (i, a, b) in enumerate(runs):
        starting[a].append(r)
        ending[b + 1].append(r)
        by_device[i].append(r)
    rows = _Rows()
    rows.add([(r, 1.0) for r in starting[0]], 1.0, 1.0)  # the path leaves boundary 0 ...
    for t in range(1, n):  # ... and every run that ends at t is followed by one that starts there
        rows.add([*((r, 1.0) for r in ending[t]), *((r, -1.0) for r in starting[t])], 0.0, 0.0)
    for i in range(m):
        # the device's memory over all its runs: the only memory row without contiguity; with
        # it, redundant for integer plans but it cuts fractional ones that use a cheap device
        # in two places (each run fits, their sum does not), which is what keeps the LP tight
        cap = max(float(p.capacity[i]), 1.0)
        rows.add([(r, (mem_prefix[runs[r][2] + 1] - mem_prefix[runs[r][1]]) / cap) for r in by_device[i]],
                 -inf, 1.0)
        if contiguous:
            rows.add([(r, 1.0) for r in by_device[i]], -inf, 1.0)
        else:
            for r in by_device[i]:
                rows.add([(ny + i, 1.0), (r, -1.0)], 0.0, inf)

    def decode(values: np.ndarray) -> list[int]:
        assign = [-1] * n
        for r in np.flatnonzero(values[:ny] > 0.5):
            i, a, b = runs[r]
            assign[a : b + 1] = [i] * (b - a + 1)
        return assign

    index = {run: r for r, run in enumerate(runs)}

    def encode(assign: Sequence[int]) -> np.ndarray | None:
        v = np.zeros(n_cols)
        for i, a, b in _segments(assign):
            if (i, a, b) not in index:
                return None
            v[index[(i, a, b)]] = 1.0
            if not contiguous:
                v[ny + i] = 1.0
        return v

    return _highs_lp(cost, lower, upper, rows, ny), decode, encode


def _build(p: Problem, formulation: str, *, contiguous: bool, pin_first: bool) -> tuple[Any, Any, Any]:
    if formulation == "segments":
        return _lp_segments(p, contiguous=contiguous, pin_first=pin_first)
    if formulation == "assignment":
        return _lp_assignment(p, contiguous=contiguous, pin_first=pin_first)
    raise PlanError(f"unknown formulation '{formulation}' ({' or '.join(FORMULATIONS)})")


def _run(lp: Any, time_limit_s: float, gap: float, start: np.ndarray | None = None) -> tuple[Any, Any]:
    hs = _highspy()
    h = hs.Highs()
    h.silent()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("threads", 1)
    h.passModel(lp)
    if start is not None:
        sol = hs.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    return h, h.getModelStatus()


DP_MAX_STATES = 1 << 22  # (n + 1) x 2^m states of the dynamic program, ~100 MB at most


def dp_tractable(p: Problem) -> bool:
    m, n = p.shape
    return m <= 20 and (n + 1) * (1 << m) <= DP_MAX_STATES


def solve_dp(p: Problem, *, pin_first: bool = True) -> list[int] | None:
    """The contiguous MILP solved exactly by dynamic programming over (block boundary t, set S
    of devices used): f[t, S | i] = min_a f[a, S] + cost of device i holding blocks a..t-1, the
    cost being exactly the MILP's (compute + entry at a + exit at t-1 + w_c) and only runs
    that fit the device's memory allowed. O(n 2^m m L) for runs of at most L blocks: tens of
    ms for 80 blocks x 8 devices. None if infeasible."""
    m, n = p.shape
    if not dp_tractable(p):
        raise PlanError(f"dynamic program over {m} devices x {n} blocks is too large; use the MILP")
    entry, exit_ = p.entry + p.entry_qos, p.exit + p.exit_qos
    mem_prefix = np.concatenate([[0.0], np.cumsum(p.memory)])
    comp_prefix = np.concatenate([np.zeros((m, 1)), np.cumsum(p.compute, axis=1)], axis=1)
    n_sets = 1 << m
    sets = np.arange(n_sets)
    f = np.full((n + 1, n_sets), np.inf)
    f[0, 0] = 0.0
    from_a = np.full((n + 1, n_sets), -1, dtype=np.int32)  # where the last run started
    from_i = np.full((n + 1, n_sets), -1, dtype=np.int32)  # its device
    for a in range(n):
        for i in range(m):
            if a == 0 and pin_first and i != 0:
                continue
            bit = 1 << i
            src = sets[(sets & bit) == 0]
            vals = f[a, src]
            ok = np.isfinite(vals)
            if not ok.any():
                continue
            src, vals = src[ok], vals[ok]
            dst = src | bit
            for b in range(a, n):
                if mem_prefix[b + 1] - mem_prefix[a] > p.capacity[i] * (1 + 1e-12):
                    break
                cand = vals + (comp_prefix[i, b + 1] - comp_prefix[i, a] + entry[i, a] + exit_[i, b] + p.w_c)
                better = cand < f[b + 1, dst]
                if better.any():
                    d = dst[better]
                    f[b + 1, d] = cand[better]
                    from_a[b + 1, d] = a
                    from_i[b + 1, d] = i
    s_best = int(np.argmin(f[n]))
    if not np.isfinite(f[n, s_best]):
        return None
    assign = [0] * n
    t, used = n, s_best
    while t > 0:
        a, i = int(from_a[t, used]), int(from_i[t, used])
        assign[a:t] = [i] * (t - a)
        used ^= 1 << i
        t = a
    return assign


def memory_shortfall(p: Problem) -> str | None:
    """What no placement can fit, from the blocks' and devices' memory alone (None: nothing):
    checked before anything is timed or solved."""
    mib = 2**20
    biggest = float(p.capacity.max())
    for j in range(p.shape[1]):
        if p.memory[j] > biggest:
            return (f"memory: block {j} needs {p.memory[j] / mib:.1f} MiB (weights + KV cache); the largest "
                    f"device offers beta x free = {biggest / mib:.1f} MiB")
    if p.memory[0] > p.capacity[0]:
        return (f"block 0 on device 0: block 0 needs {p.memory[0] / mib:.1f} MiB but device 0 ({p.devices[0]}) "
                f"offers {p.capacity[0] / mib:.1f} MiB; list a larger device first in the devices file")
    if p.memory.sum() > p.capacity.sum():
        return (f"memory: the blocks need {p.memory.sum() / mib:.1f} MiB (weights + KV cache), the devices "
                f"offer {p.capacity.sum() / mib:.1f} MiB in all (beta x free); add devices, lower n_ctx, or "
                f"raise beta")
    return None


def _diagnose(p: Problem, formulation: str, time_limit_s: float) -> str:
    """Name the constraint that makes the instance infeasible."""
    n = p.shape[1]
    mib = 2**20
    short = memory_shortfall(p)
    if short is not None:
        return short
    infeasible = _highspy().HighsModelStatus.kInfeasible
    if p.contiguous:
        lp, _, _ = _build(p, formulation, contiguous=False, pin_first=True)
        if _run(lp, time_limit_s, 1.0)[1] != infeasible:
            return ("contiguity: the blocks fit only if some device holds two separate ranges; "
                    "allow it with contiguous=False (--no-contiguous)")
    lp, _, _ = _build(p, formulation, contiguous=p.contiguous, pin_first=False)
    if _run(lp, time_limit_s, 1.0)[1] != infeasible:
        return f"block 0 on device 0: the blocks fit only if device 0 ({p.devices[0]}) does not hold block 0"
    return (f"memory: {n} blocks of {p.memory.min() / mib:.1f}-{p.memory.max() / mib:.1f} MiB do not pack into "
            f"the devices' {', '.join(f'{c / mib:.1f}' for c in p.capacity)} MiB (beta x free)")




def solve(p: Problem, *, method: str = "auto", formulation: str = "segments", time_limit_s: float = 60.0,
          mip_rel_gap: float = 1e-6, warm_start: bool = True) -> Solution:
    """Solve the MILP; InfeasiblePlanError names the binding constraint.

    method "milp": HiGHS on `formulation` — "segments" (runs of blocks, default) or
      "assignment" (the patent's x_ij, products linearised) — seeded, when warm_start and the
      dynamic program is tractable, with the contiguous optimum (feasible in both variants).
    method "dp": the exact dynamic program (contiguous variant only).
    method "auto": "dp" for a contiguous instance it can take, else "milp".
    All three return the same optimum (tests compare them with brute force)."""
    hs = _highspy()
    m, n = p.shape
    if m == 0 or n == 0:
        raise PlanError("nothing to plan: no devices or no blocks")
    if method not in METHODS:
        raise PlanError(f"unknown method '{method}' ({', '.join(METHODS)})")
    if method == "auto":
        method = "dp" if p.contiguous and dp_tractable(p) else "milp"
    if method == "dp" and not p.contiguous:
        raise PlanError("the dynamic program solves the contiguous variant only; use method='milp'")
    t0 = time.perf_counter()
    seed = solve_dp(p) if (method == "dp" or warm_start) and dp_tractable(p) else None
    if method == "dp":
        elapsed = time.perf_counter() - t0
        if seed is None:
            raise InfeasiblePlanError(f"no feasible plan: {_diagnose(p, formulation, time_limit_s)}")
        return Solution(seed, evaluate(p, seed), "Optimal", elapsed, 0.0, n * (1 << m), 0, "dp")
    lp, decode, encode = _build(p, formulation, contiguous=p.contiguous, pin_first=True)
    start = encode(seed) if seed is not None else None
    h, status = _run(lp, time_limit_s, mip_rel_gap, start)
    elapsed = time.perf_counter() - t0
    if status == hs.HighsModelStatus.kInfeasible:
        raise InfeasiblePlanError(f"no feasible plan: {_diagnose(p, formulation, time_limit_s)}")
    info = h.getInfo()
    if status not in (hs.HighsModelStatus.kOptimal, hs.HighsModelStatus.kTimeLimit):
        raise PlanError(f"HiGHS stopped with status '{h.modelStatusToString(status)}'")
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        raise PlanError(f"HiGHS found no plan within the time limit of {time_limit_s} s")
    assign = decode(np.asarray(h.getSolution().col_value))
    bad = violation(p, assign) if min(assign) >= 0 else "a block has no device"
    if bad:  # pragma: no cover - would be a modelling bug
        raise PlanError(f"solver returned an assignment that breaks a constraint: {bad}")
    return Solution(assign, evaluate(p, assign), h.modelStatusToString(status), elapsed,
                    float(info.mip_gap), lp.num_col_, lp.num_row_, f"milp/{formulation}")
