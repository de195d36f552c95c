"""The exact placement walk (planner.solvers.chaindp, csrc/pareto.cpp): its Lagrangian bounds, its heuristic
walk and its reuse of stages alike, each checked against a computation without it (exhaustive
paths of small random graphs; the same program's graph computed stage by stage)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

from oallama import _core
from oallama.planner.cost.measure import profile_model
from oallama.planner.plan import Workload, build_context
from oallama.planner.solvers import chaindp, chaingraph, chainwalk
from oallama.runtime import rpc

HOST = "CPU"

# --- small random layered graphs, walked exhaustively ---------------------------------------------


def _graph(seed: int, n_stages: int = 6, n_states: int = 3, n_opts: int = 3) -> list[tuple]:
    """Stages (src, dst, db, sw, dt, states before, states after), edges in source order."""
    rng = np.random.default_rng(seed)
    stages, before = [], 1
    for _ in range(n_stages):
        rows = [(s, int(rng.integers(n_states)), int(rng.integers(0, 6)),
                 int(rng.integers(1, 4)) if rng.random() < 0.3 else 0, float(rng.integers(1, 30)))
                for s in range(before) for _ in range(n_opts)]
        src, dst, db, sw, dt = (np.array(c) for c in zip(*rows, strict=True))
        stages.append((src.astype(np.int64), dst.astype(np.int64), db.astype(np.int64), sw.astype(np.int64),
                       dt.astype(np.float64), before, n_states))
        before = n_states
    return stages


def _paths(stages: list[tuple], j: int = 0, state: int = 0):
    """Every path from `state` before stage j: (us, bytes fixed, largest streamed)."""
    if j == len(stages):
        yield 0.0, 0, 0
        return
    src, dst, db, sw, dt, _, _ = stages[j]
    for e in np.flatnonzero(src == state):
        for t, b, m in _paths(stages, j + 1, int(dst[e])):
            yield float(dt[e]) + t, int(db[e]) + b, max(int(sw[e]), m)


def _least(stages: list[tuple], base: int, t0: float, cap: int) -> float:
    """The least us of a path within `cap` bytes (its streamed copy's room included)."""
    return min((t0 + t for t, b, m in _paths(stages) if base + b + m <= cap), default=math.inf)


def _walk(stages: list[tuple], base: int, t0: float, cap: int, limit: float, lambdas: list[float],
          entries: int = 100_000, beam: bool = False):
    levels = sorted({0, *(int(x) for st in stages for x in st[3])})
    rest = _core.pareto_bounds([(s, d, b, w, t, n0, n1) for s, d, b, w, t, n0, n1 in stages], lambdas, levels)
    least = [np.zeros(n1, dtype=np.int64) for *_, n1 in stages]  # no byte bound: the walk checks the cap
    walk_stages = [(s, d, b, w, t, n0, least[j], rest[j + 1]) for j, (s, d, b, w, t, n0, _) in enumerate(stages)]
    return _core.pareto_walk(walk_stages, base, t0, cap, limit, entries, 10.0, lambdas, beam, levels)


def _rest_paths(stages: list[tuple], j: int, state: int, level: int | None):
    """Every path from `state` before stage j streaming no weight above `level` (None: any)."""
    return [(t, b) for t, b, m in _paths(stages, j, state) if level is None or m <= level]


@pytest.mark.parametrize("seed", range(6))
def test_the_priced_bounds_are_the_least_of_every_rest(seed: int) -> None:
    stages = _graph(seed)
    lambdas = [0.0, 0.5, 3.0]
    for levels in ([], [0, 1, 3]):
        rest = _core.pareto_bounds([(s, d, b, w, t, n0, n1) for s, d, b, w, t, n0, n1 in stages], lambdas, levels)
        assert len(rest) == len(stages) + 1
        for j, (*_, n0, _) in enumerate(stages):
            assert rest[j].shape == (max(len(levels), 1), len(lambdas), n0)
            for li, level in enumerate(levels or [None]):
                for k, lam in enumerate(lambdas):
                    for state in range(n0):
                        want = min((t + lam * b for t, b in _rest_paths(stages, j, state, level)), default=math.inf)
                        assert rest[j][li, k, state] == pytest.approx(want)


@pytest.mark.parametrize("cap", [4, 9, 16])
@pytest.mark.parametrize("seed", range(6))
def test_the_walk_with_priced_bounds_finds_the_least_path(seed: int, cap: int) -> None:
    """Pruning by the Lagrangian bounds keeps the optimum; below it nothing is found."""
    stages = _graph(seed)
    best = _least(stages, 1, 2.0, cap)
    for lambdas in ([0.0], [0.0, 0.3, 1.0, 4.0]):
        for limit in (math.inf, best + 1e-6 if math.isfinite(best) else math.inf):
            found = _walk(stages, 1, 2.0, cap, limit, lambdas)
            if math.isfinite(best):
                assert found is not None and found[0] == pytest.approx(best)
            else:
                assert found is None
        if math.isfinite(best):
            assert _walk(stages, 1, 2.0, cap, best - 0.5, lambdas) is None


@pytest.mark.parametrize("seed", range(6))
def test_the_heuristic_walk_finds_a_path_that_fits(seed: int) -> None:
    """A beam of three entries per stage (the exact fronts reach 6-18) finds a path within the
    budget, no faster than the least (its edges add up to its us and bytes); a beam wider than every
    front is the exact walk."""
    stages = _graph(seed, n_stages=7)
    cap = 12
    best = _least(stages, 0, 0.0, cap)
    exact = _walk(stages, 0, 0.0, cap, math.inf, [0.0, 1.0])
    assert exact is not None and exact[3] > 3  # the beam below cuts fronts
    wide = _walk(stages, 0, 0.0, cap, math.inf, [0.0, 1.0], entries=10_000, beam=True)
    assert wide is not None and wide[0] == pytest.approx(best)
    narrow = _walk(stages, 0, 0.0, cap, math.inf, [0.0, 1.0], entries=3, beam=True)
    if narrow is None:
        assert seed == 5  # the entries kept ran out of budget (allowed of a heuristic): this graph only
        return
    t, b, edges, _ = narrow
    assert t >= best - 1e-9 and b <= cap
    assert t == pytest.approx(sum(float(stages[j][4][e]) for j, e in enumerate(edges)))
    assert b == sum(int(stages[j][2][e]) for j, e in enumerate(edges)) + max(int(stages[j][3][e])
                                                                             for j, e in enumerate(edges))
    with pytest.raises(ValueError, match="front entries"):
        _walk(stages, 0, 0.0, cap, math.inf, [0.0, 1.0], entries=3, beam=False)


def test_the_bounds_check_their_input() -> None:
    one = np.zeros(1, dtype=np.int64)
    ok = (one, one, one, one, np.zeros(1), 1, 1)
    assert _core.pareto_bounds([ok], [0.0])[0][0, 0, 0] == 0.0
    with pytest.raises(ValueError, match="negative or not finite"):
        _core.pareto_bounds([ok], [-1.0])
    with pytest.raises(ValueError, match="levels are not ascending"):
        _core.pareto_bounds([ok], [0.0], [3, 1])
    with pytest.raises(ValueError, match="stage 1 starts from 2 states, the stage before ends in 1"):
        _core.pareto_bounds([ok, (one, one, one, one, np.zeros(1), 2, 1)], [0.0])
    with pytest.raises(ValueError, match="stage 0: edge 0 names a state out of range"):
        _core.pareto_bounds([(one + 1, one, one, one, np.zeros(1), 1, 1)], [0.0])
    walk_stage = (one, one, one, one + 5, np.zeros(1), 1, one, np.zeros(2))
    with pytest.raises(ValueError, match="rest_next has 2 values, not one per level, price and state"):
        _core.pareto_walk([walk_stage], 0, 0.0, 10, math.inf, 10, 10.0, [0.0, 1.0], False, [0, 5])
    with pytest.raises(ValueError, match="streams more bytes than the largest level"):
        _core.pareto_walk([walk_stage], 0, 0.0, 10, math.inf, 10, 10.0, [0.0, 1.0], False, [0])
    with pytest.raises(ValueError, match="ascending bytes from 0"):
        _core.pareto_walk([walk_stage], 0, 0.0, 10, math.inf, 10, 10.0, [0.0, 1.0], False, [5])


# --- stages alike, reused: the same graph as computed stage by stage -------------------------------


@pytest.fixture(scope="module")
def deep_ctx(synth_model, rpc_server: rpc.RpcServer):
    """A 16-layer Q4_K_M model (layers of two type mixes, as llama-quantize makes them), its
    accelerator made fast so that streaming options stay in the program."""
    path: Path = synth_model("tiny", "q4_k_m", n_layer=16)
    acc = rpc_server.device_name
    prof = profile_model(path, [HOST, acc], threads=1, repeats=1, warmup=1, progress=False, calibrated=False)
    fast = copy.deepcopy(prof)
    for key, stats in fast.ops[acc].items():
        stats["median_us"] = prof.ops[HOST][key]["median_us"] / 20
    return build_context(path, acc, Workload(prompt=40, gen=8, objective="e2e", n_ubatch=64), profile=fast,
                         threads=1, progress=False)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("full", [False, True], ids=["partial", "full"])
@pytest.mark.parametrize("budget_share", [0.1, 0.5])
def test_stages_alike_are_reused_with_the_edges_they_would_have(deep_ctx, budget_share: float, full: bool,
                                                                stream: bool) -> None:
    ctx = deep_ctx
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    svars = chaindp.stream_options(passes, full=full, stream=stream, fixed={}, no_stream=())
    walk = chainwalk.Walk(passes, full, svars)
    n_layer = passes[0][0].n_layer
    kv_suffix = {layer: sum(ctx.kv_bytes.get(m, 0) for m in range(layer, n_layer)) for layer in range(n_layer + 1)}
    batches: dict[str, list[int]] = {}
    for w, b in sorted(svars):
        batches.setdefault(w, []).append(b)

    def options(key: tuple) -> list[int]:
        if key[0] == "kv":
            return [0] if key[1] == 0 else [0, 1]
        return [chaindp.ACC, chaindp.NEVER, *batches.get(key[1], [])]

    cap = int(budget_share * sum(ctx.weight_bytes.values())) + (sum(ctx.kv_bytes.values()) if full else 0)
    graphs = [chaingraph.StageGraph(walk, options, ctx.weight_bytes, kv_suffix, cap, sum(ctx.kv_bytes.values()) if full else 0,
                             reuse=reuse) for reuse in (True, False)]
    reused, computed = graphs
    assert computed.computed == len(walk.keys)
    assert reused.computed < 0.6 * len(walk.keys), f"{reused.computed} of {len(walk.keys)} stages computed"
    assert reused.n_states == computed.n_states
    assert reused.c0 == computed.c0
    for j, (a, b) in enumerate(zip(reused.edges, computed.edges, strict=True)):
        for name, x, y in zip(("src", "option", "dst", "bytes", "streamed"), a[:5], b[:5], strict=True):
            assert np.array_equal(x, y), f"stage {j} ({walk.keys[j]}): {name} differs"
        np.testing.assert_allclose(a[5], b[5], rtol=1e-12, err_msg=f"stage {j} ({walk.keys[j]}): us differ")
    if stream:
        assert any(o not in (chaindp.ACC, chaindp.NEVER) for key, opts in zip(walk.keys, reused.opts, strict=True)
                   if key[0] == "w" for o in opts)
