"""Calibration in the real graph (oallama.planner.cost.calibrate, _core.NodeTimer).

What is checked is behaviour, not speed: the timer sees exactly the graph the scheduler runs and
the scheduler model costs (node for node, each on its device), split mode stops once per split,
the fits recover known lines, and a calibrated profile carries its terms into the pass model, the
plan's breakdown and its cache key.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from contextlib import closing
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from oallama import Llama, _core
from oallama.errors import ClosedError
from oallama.planner.context import split_cost, stream_link
from oallama.planner.cost import attnspan
from oallama.planner.cost.calfit import (
    SCATTER,
    VEC,
    VIEW_OPS,
    Calibration,
    OpFit,
    fit,
    kind,
    node_overhead_us,
    work,
)
from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.profile import Link, Profile, device_identity
from oallama.planner.cost.schedmodel import HOST, Placement
from oallama.planner.graph import Graph
from oallama.planner.plan import Workload, build_context, make_plan
from oallama.planner.workload import Ubatch
from oallama.runtime import devices, rpc
from oallama.runtime.generate import prompt_tokens


@pytest.fixture(scope="module")
def tiny(synth_model) -> Path:
    return synth_model("tiny", "q8_0", n_layer=2)


def _timed_nodes(llm: Llama, n: int, stops: list[int] | None = None) -> list[_core.NodeTime]:
    toks = prompt_tokens(llm, n)
    with _core.NodeTimer(llm.native_context) as timer:
        llm.reset()
        llm.eval(toks)  # warm-up: graph built and allocated
        llm.reset()
        timer.reset(stops or [])
        llm.eval(toks)
        return timer.times()


@pytest.mark.parametrize("where", ["cpu", "rpc-odd-layers"])
@pytest.mark.parametrize("n_tokens", [1, 8])
def test_node_timer_sees_the_scheduled_graph(where: str, n_tokens: int, tiny: Path, rpc_server: rpc.RpcServer
                                             ) -> None:
    """Every node the scheduler ran, in order, on the device the scheduler model gives it."""
    acc = rpc_server.device_name
    placement = {} if where == "cpu" else {w: acc for w in _odd_layer_weights(tiny)}
    with closing(Llama(str(tiny), devices=["CPU", acc], placement=placement, n_ctx=256, n_batch=16, n_ubatch=16,
                       n_threads=1, verbose=False)) as llm:
        nodes = _timed_nodes(llm, n_tokens)
        graph = Graph(n_tokens, _core.graph(llm.native_context, n_tokens))
    timed = [(r.name, r.op) for r in nodes]
    assert timed == [(n.name, n.op) for n in graph.nodes], "the timer saw another graph than the scheduler built"
    devs = {r.device for r in nodes if r.op not in VIEW_OPS}
    assert devs == ({"CPU"} if where == "cpu" else {"CPU", acc})
    for r, n in zip(nodes, graph.nodes, strict=True):
        if not n.is_view:
            assert r.device == n.backend, f"{n.name} ({n.op}) timed on {r.device}, scheduled on {n.backend}"
        assert r.range_us >= 0 and r.done_us >= r.start_us  # node mode: every node is a stop
    assert [list(r.ne) for r in nodes] == [list(n.ne) for n in graph.nodes]


def _odd_layer_weights(path: Path) -> list[str]:
    from oallama.model import gguf_file

    return [t.name for t in gguf_file.check_model(path).tensors if t.name.startswith("blk.1.")]


def test_split_mode_stops_once_per_split(tiny: Path, rpc_server: rpc.RpcServer) -> None:
    acc = rpc_server.device_name
    with closing(Llama(str(tiny), devices=["CPU", acc], placement={w: acc for w in _odd_layer_weights(tiny)},
                       n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1, verbose=False)) as llm:
        nodes = _timed_nodes(llm, 4)
        stops = [r.index for k, r in enumerate(nodes) if k == len(nodes) - 1 or nodes[k + 1].device != r.device]
        split = _timed_nodes(llm, 4, stops)
    assert [r.index for r in split if r.range_us >= 0] == stops
    assert len(stops) >= 3  # CPU, the rpc-server's layer, CPU again
    # each range starts where the previous one ended (or later: the next split's input copies)
    ends = [r.done_us for r in split if r.done_us >= 0]
    assert ends == sorted(ends)


@pytest.mark.parametrize("wide_seconds, runs", [(60.0, 12), (0.0, 3)])
def test_split_runs_that_spread_widely_are_repeated(wide_seconds: float, runs: int, tiny: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass whose split-mode runs spread widely (here every other one reported twice as slow, as a
    software GPU's threads sharing the host's cores make them) is run again, up to 4x the repeats,
    while its runs have taken less than WIDE_SECONDS; then the median of them all is kept."""
    import oallama.planner.cost.calibrate as cal_mod
    from oallama.planner.cost.realpass import Run

    real, split_walls = cal_mod.timed_eval, []

    def every_other_slow(llm: Llama, timer: _core.NodeTimer | None, prefix: list[int], toks: list[int],
                         stops: list[int], outputs: int = 1) -> Run:
        r = real(llm, timer, prefix, toks, stops, outputs)
        if stops:  # a split-mode run
            r = Run(r.wall_us * (2 if len(split_walls) % 2 else 1), r.nodes)
            split_walls.append(r.wall_us)
        return r

    monkeypatch.setattr(cal_mod, "timed_eval", every_other_slow)
    monkeypatch.setattr(cal_mod, "SPLIT_SECONDS", 0.0)  # the repeats alone: 3 split-mode runs
    monkeypatch.setattr(cal_mod, "WIDE_SECONDS", wide_seconds)
    with closing(Llama(str(tiny), n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1, verbose=False)) as llm:
        load = cal_mod._Load(llm, prompt_tokens(llm, 256), 3)
        load.measure(1, 32)
    assert len(split_walls) == runs
    # the kept wall time is the median of every run (ranges stop at split ends only)
    assert load.walls[(1, 32)] == pytest.approx(statistics.median(split_walls))



def test_decode_passes_are_timed_on_other_tokens_as_a_generation_runs(tiny: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timed decode pass evaluates another token (a mixture of experts' same token again reads
    the experts the pass before left in the caches: the small MoE host decodes calibrated 12-15%
    fast), while a prompt pass is the same tokens every time."""
    import oallama.planner.cost.calibrate as cal_mod

    real, seen = cal_mod.timed_eval, []

    def record(llm: Llama, timer: _core.NodeTimer | None, prefix: list[int], toks: list[int], stops: list[int],
               outputs: int = 1):
        seen.append((len(prefix), list(toks)))
        return real(llm, timer, prefix, toks, stops, outputs)

    monkeypatch.setattr(cal_mod, "timed_eval", record)
    monkeypatch.setattr(cal_mod, "SPLIT_SECONDS", 0.0)
    with closing(Llama(str(tiny), n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1, verbose=False)) as llm:
        toks = prompt_tokens(llm, 256)
        load = cal_mod._Load(llm, toks, 3)
        load.measure(1, 32)
        decodes = [t for _, t in seen]
        seen.clear()
        load.measure(32, 0)
        prompts = [t for _, t in seen]
    assert all(len(t) == 1 for t in decodes) and len(decodes) >= 7  # warm-up, 3 node-mode, 3+ split-mode
    # a token of its own each time: the prompt's next positions in turn (by position, not by value:
    # the prompt's text repeats, so a long enough run meets a token id again)
    rest = toks[32:]
    assert [t[0] for t in decodes] == [rest[k % len(rest)] for k in range(len(decodes))]
    assert prompts and all(t == toks[:32] for t in prompts)

def test_node_timer_is_closed_with_its_context(tiny: Path) -> None:
    llm = Llama(str(tiny), n_ctx=256, n_threads=1, verbose=False)
    timer = _core.NodeTimer(llm.native_context)
    llm.close()
    with pytest.raises(ClosedError):
        timer.times()
    timer.close()  # uninstalling from a freed context is skipped, not a crash
    assert timer.closed


def test_opfit_recovers_a_line() -> None:
    f = OpFit.fit([(x, 3.0 + 0.5 * x) for x in (1.0, 10.0, 100.0, 1000.0)])
    assert f.a_us == pytest.approx(3.0) and f.b_us == pytest.approx(0.5) and f.max_rel_err < 1e-9
    # a negative intercept is refitted through the origin: no op costs less than nothing
    g = OpFit.fit([(10.0, 1.0), (20.0, 4.0), (30.0, 7.0)])
    assert g.a_us == 0.0 and g.b_us == pytest.approx((10 * 1 + 20 * 4 + 30 * 7) / (100 + 400 + 900))


class _OneOpTimes:
    """What `fit` asks of a profile: each weight matmul's one-op time (us) by shape and columns."""

    def __init__(self, times: dict[tuple[tuple[int, ...], int], float]) -> None:
        self.times = times

    def compute_us(self, device: str, op: Any, active: float | None = None) -> float:
        return self.times[(op.weight_shape, op.n_tokens)]


@pytest.mark.parametrize("jitter_us", [0.0, 2.0], ids=lambda v: f"jitter{v:g}us")
def test_the_fit_recovers_the_terms_synthetic_passes_were_made_of(jitter_us: float) -> None:
    """Passes of 1, 32 and 128 tokens built from known terms (a node timed alone pays h = 12 us; ADD,
    SOFT_MAX and an activation matmul cost a + b * work; weight matmuls run 1.25x their one-op time;
    outside the graph a prompt pays 300 us + 7 us a token, a decode 150 us), each node's time alone
    off by up to `jitter_us` either way (a timer's wake-up): the fit must give the terms back."""
    import random

    rng = random.Random(11)
    h, view_us, scale = 12.0, 4.0, 1.25
    lines = {"ADD": (1.5, 2e-4), "SOFT_MAX": (3.0, 5e-4), "MUL_MAT": (2.0, 1e-3)}  # op -> (a us, b us / work)
    shapes = [(1024, 1024), (1024, 4096), (4096, 1024)]
    one_op: dict[tuple[tuple[int, ...], int], float] = {}
    points: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    for n in (1, 32, 128):
        base = {"load": "host", "n_tokens": n, "n_past": 64, "split": 0, "device": "CPU"}
        nodes: list[tuple[dict[str, Any], float]] = []  # (point, true time in a whole pass)
        for i in range(8):
            op = ("ADD", "SOFT_MAX", "MUL_MAT")[i % 3]
            w = 4096.0 * n * (i + 1) * (8 if op == "MUL_MAT" else 1)
            a, b = lines[op]
            nodes.append(({**base, "op": op, "weight_type": "", "work": w, "src0_ne": [64, 64, 1, 1]}, a + b * w))
        for k, m in shapes:
            t = 0.05 * k * m / 1024 * (1 + n / 16)  # us: grows with the weight and the columns
            one_op[((k, m), n)] = t
            nodes.append(({**base, "op": "MUL_MAT", "weight_type": "q8_0", "work": 0.0, "src0_ne": [k, m, 1, 1],
                           "cols": n}, scale * t))
        for p, true in nodes:
            points.append({**p, "us": h + true + rng.uniform(-jitter_us, jitter_us)})
        points.append({**base, "op": "VIEW", "weight_type": "", "work": 0.0, "us": view_us})
        splits.append({**base, "n_ops": len(nodes), "n_views": 1, "split_us": view_us + sum(t for _, t in nodes),
                       "ops_us": sum(p["us"] for p in points[-len(nodes) - 1:-1])})
    overheads = [(1, 150.0), (32, 300.0 + 7 * 32), (128, 300.0 + 7 * 128)]
    cal = fit(points, overheads, _OneOpTimes(one_op), splits)
    dc = cal.devices["CPU"]
    exact = jitter_us == 0
    # to within a node's jitter or a few percent: what the data holds
    assert dc.node_overhead_us == pytest.approx(h, rel=1e-6, abs=jitter_us)
    for op, (a, b) in lines.items():
        assert dc.ops[op].b_us == pytest.approx(b, rel=1e-6 if exact else 0.05), op
        for w in (4096.0, 4096.0 * 128 * 8):  # the intercept, a few us, judged by the times it gives
            assert dc.node_time_us(op, w, 32) == pytest.approx(a + b * w, rel=1e-6 if exact else 0.05,
                                                               abs=jitter_us), (op, w)
    for n in (1, 32, 128):
        # the pass size's ratio: within its nodes' jitter, h's error and the pass's anchor (each up to
        # about a node's jitter) over their time
        rel = 1e-6 + 3 * jitter_us * len(shapes) / (scale * sum(one_op[(km, n)] for km in shapes))
        assert dc.scale_for(n) == pytest.approx(scale, rel=rel), n
    assert (cal.pass_a_us, cal.pass_b_us, cal.decode_us) == pytest.approx((300.0, 7.0, 150.0))


def test_an_op_kind_not_calibrated_costs_the_median_byte_op_kind() -> None:
    """A device model costs another model's graph, whose op kinds its reference may lack (Gemma 3's
    SCALE and GEGLU on Llama 3's). Nodes of known lines: three kinds whose work is bytes (one of them,
    the KV copies, dear per node) and the attention matmul (work in multiply-adds, a large intercept).
    An unseen byte op costs the median kind's intercept and slope, untouched by the matmul's intercept
    or the dear kind; an unseen op of multiply-adds the matmul's line."""
    lines = {"ADD": (1.0, 1e-4), "MUL": (2.0, 2e-4), "SET_ROWS": (30.0, 4e-3), "MUL_MAT": (80.0, 2e-5)}
    points = [{"load": "host", "n_tokens": n, "n_past": 32, "split": 0, "device": "CPU", "op": op,
               "weight_type": "", "src0_ne": [64, 64, 1, 1], "work": w, "us": a + b * w}
              for n in (1, 32) for op, (a, b) in lines.items() for w in (1e3 * n, 4e4 * n, 9e5 * n)]
    dc = fit(points, [], _OneOpTimes({})).devices["CPU"]
    for w in (1e3, 1e6):
        assert dc.node_time_us("SCALE", w, 1) == pytest.approx(2.0 + 2e-4 * w)  # median a (1, 2, 30), b
        assert dc.node_time_us("GEGLU", w, 32) == pytest.approx(2.0 + 2e-4 * w)
        assert dc.node_time_us("FLASH_ATTN_EXT", w, 1) == pytest.approx(80.0 + 2e-5 * w)
        assert dc.node_time_us("ADD", w, 1) == pytest.approx(1.0 + 1e-4 * w)  # a kind seen keeps its own


def test_node_overhead_from_splits() -> None:
    # 10 ops whose compute sums to 500 us; a split alone costs one launch (20 us) + 500; timed alone
    # each op also pays h = 30 us: the ops' node-mode sum is 500 + 10 * 30
    splits = [{"n_ops": 10, "split_us": 520.0, "ops_us": 800.0}, {"n_ops": 5, "split_us": 120.0, "ops_us": 250.0}]
    assert node_overhead_us(20.0, splits) == pytest.approx((300.0 + 150.0) / 15)
    assert node_overhead_us(20.0, []) == 20.0  # nothing to compare: the view's time


def test_each_pass_size_is_anchored_to_its_own_splits() -> None:
    """A device where a node timed alone is mostly its round trip (an rpc-server: 200 us, noisy)
    and the real compute is 5 us per decode op, 100 us per prompt op: node times cannot tell the
    two apart, the splits' totals can. Each pass size's fitted total must equal its measured one."""
    import random

    rng = random.Random(7)
    points, splits = [], []
    for n, per_op in ((1, 5.0), (32, 100.0)):
        for _ in range(40):  # one split of 40 ops; timed alone each costs 200 us more, +- 60 us noise
            points.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "op": "ADD",
                           "device": "RPC", "weight_type": "", "work": 4096.0 * n,
                           "us": per_op + 200.0 + rng.uniform(-60.0, 60.0)})
        points.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "op": "VIEW",
                       "device": "RPC", "weight_type": "", "work": 0.0, "us": 200.0})
        splits.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "device": "RPC",
                       "n_ops": 40, "n_views": 1, "split_us": 200.0 + 40 * per_op,
                       "ops_us": sum(p["us"] for p in points if p["n_tokens"] == n and p["op"] == "ADD")})
    dc = fit(points, [], None, splits).devices["RPC"]
    for n, per_op in ((1, 5.0), (32, 100.0)):
        modelled = sum(dc.node_time_us("ADD", p["work"], n) for p in points if p["n_tokens"] == n and p["op"] == "ADD")
        assert modelled == pytest.approx(40 * per_op, rel=1e-6), n
    # a pass between two timed sizes takes their factors interpolated on log tokens (4 = 2/5 of the
    # way from 1 to 32), a pass beyond them the nearest one's
    a1, a32 = dc.anchors[1], dc.anchors[32]
    assert dc.factor(4) == pytest.approx(a1 + 0.4 * (a32 - a1)) and dc.factor(512) == a32 and dc.factor(1) == a1
    assert Calibration.from_json(json.loads(json.dumps(Calibration({"RPC": dc}, 0.0, 0.0).to_json()))
                                 ).devices["RPC"].anchors == dc.anchors


@pytest.mark.parametrize("timed_alone_us", [200.0, 2.0], ids=["rpc-round-trip", "cpu"])
def test_a_pass_size_timed_mostly_as_synchronisation_is_anchored_with_the_lines_it_is_costed_with(
        timed_alone_us: float) -> None:
    """A decode pass of 20 ADDs (5 us each) and 4 FLASH_ATTN_EXTs (a line of their own at one token,
    "FLASH_ATTN_EXT:1"), a prompt pass of the same at 100 and 400 us. Timed alone, each node pays
    `timed_alone_us` (+-30%). Over an rpc-server's round trip those node times are mostly the timing's
    synchronisation (`sync_bound`): the decode pass, costed with its own lines, sums to its measured split.
    On the CPU (2 us) the anchor keeps the kinds' prompt lines (they did better on the held-out set)."""
    import random

    from oallama.planner.cost.calfit import sync_bound

    rng = random.Random(11)
    points, splits = [], []
    for n, add_us, fa_us in ((1, 5.0, 30.0), (32, 100.0, 400.0)):
        ops = [("ADD", 4096.0 * n, add_us)] * 20 + [("FLASH_ATTN_EXT", 1e4 * n * (i + 1), fa_us * (i + 1) / 2.5)
                                                    for i in range(4)]
        for op, w, us in ops:
            points.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "op": op, "device": "RPC",
                           "weight_type": "", "work": w,
                           "us": us + timed_alone_us * (1 + rng.uniform(-0.3, 0.3))})
        points.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "op": "VIEW",
                       "device": "RPC", "weight_type": "", "work": 0.0, "us": timed_alone_us})
        splits.append({"load": "accelerator", "n_tokens": n, "n_past": 64, "split": 0, "device": "RPC",
                       "n_ops": len(ops), "n_views": 1, "split_us": timed_alone_us + sum(us for _, _, us in ops),
                       "ops_us": sum(p["us"] for p in points if p["n_tokens"] == n and p["op"] != "VIEW")})
    dc = fit(points, [], None, splits).devices["RPC"]
    assert "FLASH_ATTN_EXT:1" in dc.ops
    decode = [p for p in points if p["n_tokens"] == 1 and p["op"] != "VIEW"]
    measured = splits[0]["split_us"] - timed_alone_us
    own = sum(dc.node_time_us(p["op"], p["work"], 1) for p in decode)  # as a decode pass is costed
    prompt_lines = sum(dc.node_time_us(p["op"], p["work"]) for p in decode)
    if timed_alone_us > 100:
        assert sync_bound(splits) == {1, 32}
        assert own == pytest.approx(measured, rel=1e-6)
    else:
        assert sync_bound(splits) == set()
        assert prompt_lines * dc.factor(1) == pytest.approx(measured, rel=1e-6)


@pytest.mark.parametrize("alone_factor", [1.0, 2.0], ids=lambda v: f"alone{v:g}x")
def test_attention_lines_fitted_to_spans_are_not_scaled_by_the_pass_anchors(alone_factor: float) -> None:
    """A decode pass (1 token) and a prompt pass (32) of 20 ADDs and 4 FLASH_ATTN_EXTs on the CPU, each
    node timed alone paying 10 us more and its ADDs `alone_factor` x their time in the pass (a cold
    cache): the node times misstate the ADDs, so the pass anchors rescale what they scale. The flash
    attention spans, timed whole after a short and a long KV cache, give its true line: a decode pass's
    attention over the long cache must cost what its span measured, whatever the anchor, and each timed
    pass must still sum to its measured split."""
    h, view_us, long_w = 10.0, 4.0, 2e6
    fa = {1: (5.0, 1e-2), 32: (50.0, 1e-3)}  # n_tokens -> flash attention's true (a us, b us / work)
    add = {1: 4.0, 32: 40.0}  # n_tokens -> an ADD's true time in the pass
    points, splits, spans = [], [], []
    for n in (1, 32):
        base = {"load": "host", "n_tokens": n, "n_past": 32 if n == 1 else 0, "split": 0, "device": "CPU",
                "weight_type": "", "src0_ne": [64, 64, 1, 1]}
        a, b = fa[n]
        ops = [("ADD", 4096.0 * n, add[n], add[n] * alone_factor)] * 20
        ops += [("FLASH_ATTN_EXT", 1e4 * n * (i + 1), a + b * 1e4 * n * (i + 1), a + b * 1e4 * n * (i + 1))
                for i in range(4)]
        for op, w, _, alone in ops:
            points.append({**base, "op": op, "work": w, "us": alone + h})
        points.append({**base, "op": "VIEW", "work": 0.0, "us": view_us})
        splits.append({**base, "n_ops": len(ops), "n_views": 1, "split_us": view_us + sum(t for _, _, t, _ in ops),
                       "ops_us": sum(alone + h for *_, alone in ops)})
        short_w = 1e4 * n
        spans += [{"load": "host", "n_tokens": n, "short_past": base["n_past"], "long_past": 1024, "span": i,
                   "device": "CPU", "nodes": [["FLASH_ATTN_EXT", short_w, long_w]],
                   "short_us": h + a + b * short_w, "long_us": h + a + b * long_w} for i in range(4)]
    dc = fit(points, [], None, splits, spans=spans).devices["CPU"]
    assert sorted(dc.whole) == ["FLASH_ATTN_EXT", "FLASH_ATTN_EXT:1"]
    if alone_factor > 1:
        assert abs(dc.factor(1) - 1) > 0.1  # the ADDs' node times rescaled by the anchor
    for n in (1, 32):
        a, b = fa[n]
        # the fitted node overhead is the ADDs' and the stops' mean: within it of the span's time
        assert dc.node_time_us("FLASH_ATTN_EXT", long_w, n) == pytest.approx(a + b * long_w, rel=0.01), n
        costed = sum(dc.node_time_us(p["op"], p["work"], n) for p in points
                     if p["n_tokens"] == n and p["op"] != "VIEW")
        assert costed == pytest.approx(splits[n > 1]["split_us"] - view_us, rel=1e-6), n
    back = Calibration.from_json(json.loads(json.dumps(Calibration({"CPU": dc}, 0.0, 0.0).to_json())))
    assert back.devices["CPU"].whole == dc.whole


RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def test_a_pass_size_that_timed_a_sliver_of_the_device_takes_its_neighbours_factor() -> None:
    """tiny's committed Vulkan0 calibration (`bench/results/2026-11-24-vm-vulkan-method21/`): its
    64-token accelerator load left the host one GET_ROWS (36 us measured, 15 modelled), and anchoring
    the host's 64-token passes to that split priced a host-only 64-token pass at 2.4x (a 128-token
    prompt predicted at 27.7 ms, measured 11.9). Refitted: the host's 64-token factor lies between its
    32- and 128-token ones, which the host load's whole passes fixed."""
    pf = RESULTS / "2026-11-24-vm-vulkan-method21" / "profiles" / "44f87bfe777b4f94.json"
    prof = Profile.from_json(json.loads(pf.read_text()), pf)
    old = prof.calibration
    assert old is not None and old.devices["CPU"].anchors[64] > 2.0  # as the bench's planner had it
    cpu = fit(old.points, [], prof, old.splits, old.routing).devices["CPU"]
    assert 64 not in cpu.anchors and {1, 32, 128} <= set(cpu.anchors)
    assert min(cpu.anchors[32], cpu.anchors[128]) <= cpu.factor(64) <= max(cpu.anchors[32], cpu.anchors[128])


@pytest.mark.parametrize("stored", ["2026-11-25-vm-heldout/profiles/383d65fc1235fb1c",  # Gemma 3, CPU + rpc-server
                                    "2026-11-26-h100-heldout/profiles/reference-3f201771b6b135fb"])  # spans, CUDA0
def test_a_stored_calibration_reads_back_as_written_and_renames_every_device_entry(stored: str) -> None:
    """A calibration written and read again is the same, field by field; renamed, every entry keyed or
    tagged by a device takes the new name, and nothing else changes."""
    import dataclasses

    prof = Profile.from_json(json.loads((RESULTS / f"{stored}.json").read_text()))
    cal = prof.calibration
    assert cal is not None
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    acc = next(d for d in cal.devices if d != HOST)
    new = cal.renamed({acc: "RPC[10.0.0.1:50052]"})
    assert set(new.devices) == {HOST, "RPC[10.0.0.1:50052]"} and new.devices["RPC[10.0.0.1:50052]"] == cal.devices[acc]
    for name in ("stream", "scatter", "detached", "links"):
        assert acc not in getattr(new, name), name
        assert list(getattr(new, name).values()) == list(getattr(cal, name).values()), name
    assert all(acc not in r for r in new.rounds_detached + new.rounds_alone)
    assert [sp["device"] for sp in new.spans] == [{acc: "RPC[10.0.0.1:50052]"}.get(sp["device"], sp["device"])
                                                  for sp in cal.spans]
    same = ("pass_a_us", "pass_b_us", "decode_us", "points", "splits", "routing", "layouts", "rounds_outside")
    assert all(getattr(new, k) == getattr(cal, k) for k in same)
    assert {f.name for f in dataclasses.fields(cal)} <= {*same, "devices", "stream", "scatter", "detached", "links",
                                                         "rounds_detached", "rounds_alone", "spans", "elapsed_s"}


def test_a_stored_calibration_is_fitted_again_from_its_own_measurements() -> None:
    """`refitted` (how a change of the fit is scored on a measured set, bench/heldout/refit.py): a
    held-out profile's device terms, overwritten, come back from the node and split times it keeps,
    the MoE routing included; what was measured rather than fitted (time outside the graph, streamed
    and scattered passes, layouts) stays as stored."""
    import dataclasses

    from oallama.planner.cost.calfit import DeviceCalibration, refitted

    pf = RESULTS / "2026-11-25-vm-heldout" / "profiles" / "383d65fc1235fb1c.json"  # Gemma 3, CPU + rpc-server
    prof = Profile.from_json(json.loads(pf.read_text()), pf)
    stored = prof.calibration
    assert stored is not None and stored.points and stored.splits and len(stored.devices) == 2
    wrong = dataclasses.replace(stored, devices={d: DeviceCalibration(0.0, {}, 50.0) for d in stored.devices})
    again = refitted(wrong, prof)
    assert again.devices == fit(stored.points, [], prof, stored.splits, stored.routing).devices
    for d, dc in again.devices.items():
        assert 0.1 < dc.matmul_scale < 10 and dc.ops and dc.anchors, d  # fitted, not the overwritten terms
    keep = ("pass_a_us", "pass_b_us", "decode_us", "stream", "scatter", "detached", "layouts", "routing", "points")
    assert all(getattr(again, k) == getattr(stored, k) for k in keep)


def test_decode_and_prompt_passes_time_outside_the_graph_apart() -> None:
    # a decode pass reuses its predecessor's graph (200 us outside it); a prompt pass builds its own
    # (550 us + 3 us a token): one line through all of them would put 14 us on every prompt token
    overheads = [(1, 200.0), (1, 212.0), (32, 646.0), (128, 934.0)]
    cal = fit([], overheads, None)
    assert cal.decode_us == pytest.approx(206.0)
    assert cal.pass_overhead_us(1) == pytest.approx(206.0)
    assert cal.pass_a_us == pytest.approx(550.0) and cal.pass_b_us == pytest.approx(3.0)
    assert cal.pass_overhead_us(64) == pytest.approx(550.0 + 3.0 * 64)
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))).decode_us == cal.decode_us
    # one prompt size: all of a prompt's time outside per pass; a method-12 profile: its one line
    one = fit([], [(1, 200.0), (32, 646.0)], None)
    assert one.pass_overhead_us(64) == one.pass_overhead_us(32) == pytest.approx(646.0)
    old = Calibration({}, 194.0, 14.0)
    assert old.decode_us is None and old.pass_overhead_us(1) == pytest.approx(208.0)


def test_work_of_an_activation_matmul_is_its_multiply_adds() -> None:
    # KQ: K [128, n_kv=256, heads 8] x Q [128, n=4, 8] -> [256, 4, 8]
    assert work("MUL_MAT", (256, 4, 8, 1), 256 * 4 * 8 * 4, [(128, 256, 8, 1), (128, 4, 8, 1)], 0) == 128 * 256 * 4 * 8
    assert work("ADD", (64, 4, 1, 1), 1024, [(64, 4, 1, 1)] * 2, 2048) == 3072


@pytest.fixture(scope="module")
def calibrated(tiny: Path, rpc_server: rpc.RpcServer) -> Profile:
    return profile_model(tiny, [HOST, rpc_server.device_name], threads=1, n_ctx=256, cache=False, progress=False,
                         repeats=3, server_threads=1)


def test_calibration_covers_both_devices_and_round_trips(calibrated: Profile, rpc_server: rpc.RpcServer,
                                                         tmp_path: Path) -> None:
    cal = calibrated.calibration
    assert cal is not None and set(cal.devices) == {HOST, rpc_server.device_name}
    for dev, dc in cal.devices.items():
        assert "*" in dc.ops and dc.n_matmuls > 0, dev
        assert dc.matmul_scale > 0 and dc.node_overhead_us >= 0
    assert cal.pass_a_us + cal.pass_b_us > 0
    again = Profile.load(calibrated.save(tmp_path / "p.json"))
    assert again.calibration is not None
    assert json.dumps(again.calibration.to_json(), sort_keys=True) == json.dumps(cal.to_json(), sort_keys=True)
    assert Calibration.from_json(cal.to_json()).devices.keys() == cal.devices.keys()


def test_calibrated_pass_model_costs_every_op(calibrated: Profile, tiny: Path, rpc_server: rpc.RpcServer) -> None:
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    for n, pm in ctx.passes.items():
        real = [i for i in pm.order if i not in pm.targets]
        assert real and all(i in pm.t_host and i in pm.t_acc for i in real), n
        assert pm.overhead_us > 0
        c = pm.cost(Placement())
        assert c.other_us > 0 and c.acc_us == 0 and c.copy_us == 0
        # the same graph with every layer on the accelerator: its ops run there
        full = pm.cost(Placement(frozenset(ctx.weight_bytes), ctx.n_layer))
        assert full.acc_us > 0 and full.copy_us > 0  # the logits come back
    pred = ctx.predict(Placement())
    assert {"compute_ms", "other_ms", "overhead_ms", "copy_ms", "launch_ms"} <= set(pred["passes"]["1"])
    assert pred["tpot_ms"] == pytest.approx(ctx.passes[Ubatch(1)].cost(Placement()).total_us / 1e3)


def test_streamed_load_streams_every_weight_matmul(calibrated: Profile, tiny: Path,
                                                  rpc_server: rpc.RpcServer) -> None:
    # the calibration's third load: every host weight streamed in a real decode pass; it must
    # have streamed exactly the weights the scheduler model streams for such a placement
    st = calibrated.calibration.stream[rpc_server.device_name]
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    pm = ctx.passes[Ubatch(1)]
    matmul_weights = {pm.graph.nodes[i].weight for i in pm.targets}
    assert st["n_weights"] == len(matmul_weights) > 0
    assert st["weight_bytes"] == sum(ctx.weight_bytes[w] for w in matmul_weights)
    assert st["wall_us"] > 0 and len(st["samples_us"]) >= 1
    assert Calibration.from_json(calibrated.calibration.to_json()).stream == calibrated.calibration.stream


def test_stream_link_costs_streamed_weights_only(calibrated: Profile, tiny: Path, rpc_server: rpc.RpcServer) -> None:
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    pm = ctx.passes[Ubatch(16)]
    half = sorted(pm.weights)[::2]
    p = Placement(frozenset(), 0, {w: 1 for w in half})  # half the weights streamed, the rest on the host
    before = pm.cost(p)
    assert before.n_streamed > 0 and before.copy_us > before.stream_us > 0
    pm.set_stream(Link(pm.stream.latency_us * 3, pm.stream.bytes_per_us / 4))
    after = pm.cost(p)
    assert after.stream_us > before.stream_us and after.stream_bytes == before.stream_bytes
    # activations still cross on the profiled link
    assert after.copy_us - after.stream_us == pytest.approx(before.copy_us - before.stream_us)
    pred = ctx.predict(p)
    assert pred["passes"]["16"]["stream_bytes"] == after.stream_bytes


def test_stream_link_from_a_measured_pass(calibrated: Profile, tiny: Path, rpc_server: rpc.RpcServer) -> None:
    # a pass measured slower than the model (copies aside) makes the streamed copies dearer; one
    # measured faster than the model's other terms cannot be attributed and keeps the link
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    pm = ctx.passes[Ubatch(1)]
    p = Placement(frozenset(), 0, {w: 1 for w in pm.weights})
    c = pm.cost(p)
    base = {"weight_bytes": c.stream_bytes}
    slow = stream_link(pm, {**base, "wall_us": c.total_us + 10 * c.stream_us})
    assert slow is not None
    pm.set_stream(slow)
    assert pm.cost(p).total_us == pytest.approx(c.total_us + 10 * c.stream_us, rel=1e-6)
    assert stream_link(pm, {**base, "wall_us": 0.5 * (c.total_us - c.stream_us)}) is None
    assert stream_link(pm, None) is None


def test_profile_key_names_the_rpc_server_threads(rpc_server: rpc.RpcServer) -> None:
    ident = device_identity(devices.resolve(rpc_server.device_name))
    assert ident.endswith(":threads=1")  # the session server runs with -t 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and two CPUs")
def test_profile_key_names_the_cpus_a_pinned_run_may_use(rpc_server: rpc.RpcServer) -> None:
    """Run on CPU 0 only (taskset), a loopback rpc-server's visits cost differently (0.77-0.95 ms
    against a median 1.2-1.5 ms for the tiny model's 12-split decode): such a run's profile is its own."""
    if rpc.restricted_cpus() is not None:
        pytest.skip("this process is already restricted to some CPUs")
    srv, cpu = devices.resolve(rpc_server.device_name), devices.resolve("CPU")
    free = (device_identity(srv), device_identity(cpu))
    assert ":cpus=" not in free[0] + free[1]  # unrestricted: the keys cached profiles already have
    mask = os.sched_getaffinity(0)
    a, b = sorted(mask)[:2]
    pid = rpc.listening_pid(*devices.parse_endpoint(srv.description))
    assert pid is not None
    theirs = os.sched_getaffinity(pid)
    try:
        os.sched_setaffinity(0, {a})
        os.sched_setaffinity(pid, {b})
        assert device_identity(cpu) == free[1] + f":cpus={a}"
        assert device_identity(srv) == free[0] + f":server_cpus={b}:cpus={a}"
    finally:
        os.sched_setaffinity(0, mask)
        os.sched_setaffinity(pid, theirs)
    assert (device_identity(srv), device_identity(cpu)) == free


def test_pass_kv_lengths() -> None:
    # 512-token prompt in 2 ubatches, 128 generated: llama.cpp pads the KV view to 256 cells
    wl = Workload(prompt=512, gen=128, n_ubatch=256)
    assert wl.n_ctx == 768
    assert wl.pass_kv() == {Ubatch(256): 512, Ubatch(1): 768}  # ubatches at 256 and 512 cells: mean 384 -> 512
    assert Workload(prompt=32, gen=8).pass_kv() == {Ubatch(32): 256, Ubatch(1): 256}


def test_scattered_load_changes_device_at_almost_every_weight(calibrated: Profile, tiny: Path,
                                                              rpc_server: rpc.RpcServer) -> None:
    # the calibration's fourth load: weights alternating between the host and the accelerator;
    # the model sees that placement as llama.cpp made it, with several changes of device per layer
    sc = calibrated.calibration.scatter[rpc_server.device_name]
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    pm = ctx.passes[Ubatch(1)]
    on_acc = frozenset(sc["on_acc"]) & pm.weights
    assert 0 < len(on_acc) < len(pm.weights)
    assert pm.cost(Placement(on_acc, sc["kv_layers"])).n_splits >= 2 * ctx.n_layer
    assert sc["wall_us"] > 0 and len(sc["samples_us"]) >= 1
    assert Calibration.from_json(calibrated.calibration.to_json()).scatter == calibrated.calibration.scatter


def test_split_cost_from_a_measured_pass(calibrated: Profile, tiny: Path, rpc_server: rpc.RpcServer) -> None:
    # a scattered pass measured slower than the model charges the difference to its splits, and
    # the model then costs that pass as measured; one the model accounts for gives nothing
    ctx = build_context(tiny, rpc_server.device_name, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated,
                        threads=1, progress=False)
    pm = ctx.passes[Ubatch(1)]
    sc = calibrated.calibration.scatter[rpc_server.device_name]
    p = Placement(frozenset(sc["on_acc"]) & pm.weights, sc["kv_layers"])
    pm.set_split_cost(0.0)
    c = pm.cost(p)
    changes = c.n_splits - 1  # the first split follows no change of device
    extra = split_cost(pm, {**sc, "wall_us": c.total_us + 50.0 * changes})
    assert extra == pytest.approx(50.0)
    pm.set_split_cost(extra)
    assert pm.cost(p).total_us == pytest.approx(c.total_us + 50.0 * changes)
    assert pm.cost(p).compute_us == c.compute_us and pm.cost(p).copy_us == c.copy_us  # only the splits
    host = pm.cost(Placement())  # one split, no change of device: nothing more
    assert host.n_splits == 1 and host.launch_us == pytest.approx(pm.issue[0])
    assert split_cost(pm, {**sc, "wall_us": c.total_us}) is None
    assert split_cost(pm, None) is None


def test_a_pass_without_the_rpc_server_saves_its_syncs(calibrated: Profile, tiny: Path, rpc_server: rpc.RpcServer,
                                                        tmp_path: Path) -> None:
    # the runtime loads a placement that uses no rpc-server without it (no syncs with its
    # dispatcher): the calibration times host passes both ways, and the pass model takes the
    # difference off exactly the placements that run nothing on the accelerator
    acc = rpc_server.device_name
    a, b = calibrated.calibration.detached[acc]
    assert a >= 0 and b >= 0
    ctx = build_context(tiny, acc, Workload(prompt=16, gen=4, n_ubatch=16), profile=calibrated, threads=1,
                        progress=False)
    # a plan that puts nothing on the rpc-server loads without it; one that does, with it
    none, some = make_plan(ctx, "layers", 1), make_plan(ctx, "layers", "75%")
    assert not none.placement.on_acc and some.placement.on_acc
    for plan, want in ((none, []), (some, [rpc_server.endpoint])):
        with closing(Llama(str(tiny), placement=str(plan.save(tmp_path / "plan.json")), verbose=False)) as llm:
            assert llm._rpc_endpoints == want, plan.strategy
    for u, pm in ctx.passes.items():
        assert pm.detached_us == pytest.approx(min(a + b * u.n_tokens, pm.overhead_us)), u
        assert pm.cost(Placement()).overhead_us == pytest.approx(pm.overhead_us - pm.detached_us), u
        assert pm.cost(Placement(frozenset({"output.weight"}))).overhead_us == pm.overhead_us, u
    doc = json.loads(json.dumps(calibrated.calibration.to_json()))
    assert Calibration.from_json(doc).detached == calibrated.calibration.detached
    assert calibrated.calibration.renamed({acc: "RPC0"}).detached_us("RPC0", 1) == pytest.approx(a + b)


def test_sampling_is_timed_with_the_generation_loops_sampler(tiny: Path) -> None:
    # generate() keeps one sampler chain; a standalone sample() builds one per call: the
    # calibration times the former and leaves the Llama's own sampler as it was
    from oallama.planner.cost.outside import sample_us

    with closing(Llama(str(tiny), n_ctx=64, verbose=False)) as llm:
        llm.eval(prompt_tokens(llm, 8))
        calls: list[object] = []
        real = llm._init_sampler

        def init(**kw: object) -> object:
            calls.append(kw)
            return real(**kw)

        llm._init_sampler = init  # type: ignore[method-assign]
        assert sample_us(llm, 3) > 0
        assert calls == [{"temp": 0.0}]  # one chain for all the timed samples
        assert llm._sampler is None
        assert len(list(islice(llm.generate(prompt_tokens(llm, 8), temp=0.0, reset=True), 2))) == 2  # still usable


def test_short_calibrations_keep_each_pass_from_its_median_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # a pass timed inside a window where the whole machine runs slower would scale its terms by it
    # (one round of a small MoE: its decode 4.8 ms after 32 tokens, 3.0 ms after 510): rounds repeat
    # while they are short, and each timed pass comes from the round of its median time (not the
    # fastest: that made every prediction optimistic), its nodes and splits together
    from oallama.planner.cost import calibrate as cal_mod

    # per round: (prompt pass us, decode pass us) on the host
    times = iter([(5000.0, 300.0), (3000.0, 900.0), (4000.0, 250.0), (2500.0, 200.0), (2600.0, 500.0),
                  (1000.0, 100.0)])
    calls: list[bool] = []

    def once(*args: object, routing: bool = True, **kw: object) -> cal_mod.Round:
        calls.append(routing)
        k = len(calls)
        prompt, decode = next(times)
        splits = [{"load": "host", "device": HOST, "n_tokens": n, "n_past": past, "split": 0, "n_ops": 1,
                   "n_views": 0, "split_us": us, "ops_us": us} for n, past, us in ((32, 0, prompt), (1, 32, decode))]
        points = [{"load": "host", "device": HOST, "n_tokens": n, "n_past": past, "split": 0, "op": "ADD",
                   "weight_type": "", "work": 1.0, "us": us, "round": k}
                  for n, past, us in ((32, 0, prompt), (1, 32, decode))]
        return cal_mod.Round(points, splits, {(32, 0): 10.0 * k, (1, 32): float(k)},
                             scatter={"RPC": {"wall_us": 100.0 - k}}, detached={"RPC": [float(k), 0.0]},
                             alone={"RPC": {(32, 0): 9.0 * k, (1, 32): 0.0}})

    monkeypatch.setattr(cal_mod, "_measure_round", once)
    monkeypatch.setattr(cal_mod, "_spans", lambda *a, **k: attnspan.Timed())  # no model to time spans in
    monkeypatch.setattr(cal_mod, "fit", lambda points, overheads, *a, **kw: Calibration(
        {}, 0.0, 0.0, points=list(points), splits=list(a[1]) if len(a) > 1 else [], decode_us=float(len(overheads))))
    cal = cal_mod.calibrate("m.gguf", [HOST], None, threads=1, progress=False, max_rounds=5)
    assert calls == [True, False, False, False, False]  # the routing is recorded once
    got = {(p["n_tokens"], p["round"]) for p in cal.points}
    assert got == {(32, 2), (1, 1)}  # prompt 3000 us (round 2) and decode 300 us (round 1): the medians
    # what a detached load saves: the kept times outside the graph (the median round's: 30 and 3 us) less
    # the median measured without the accelerator (27 and 0 us); every round's record kept
    assert cal.scatter["RPC"]["wall_us"] == 97.0 and cal.detached["RPC"] == [pytest.approx(3.0), pytest.approx(0.0)]
    assert cal.rounds_outside[1] == {"1,32": 2.0, "32,0": 20.0} and cal.rounds_detached[3] == {"RPC": [4.0, 0.0]}
    assert cal.rounds_alone[3] == {"RPC": {"1,32": 0.0, "32,0": 36.0}}
    # a prompt and a decode pass whose median times fell in different rounds: each from its own
    def rnd(k: int, prompt: float, decode: float) -> cal_mod.Round:
        passes = ((32, 0, prompt), (1, 32, decode))
        return cal_mod.Round([{"load": "host", "n_tokens": n, "n_past": past, "us": us, "round": k} for n, past, us in passes],
                             [{"load": "host", "n_tokens": n, "n_past": past, "split_us": us} for n, past, us in passes],
                             {(32, 0): 7.0 * k, (1, 32): float(k)})

    r = cal_mod.merge_rounds([rnd(7, 3000.0, 200.0), rnd(8, 1000.0, 100.0), rnd(9, 2000.0, 300.0)])
    assert {(p["n_tokens"], p["round"]) for p in r.points} == {(32, 9), (1, 7)}
    assert r.outside == {(32, 0): 56.0, (1, 32): 8.0}
    # the time outside the graph is the median over the rounds, not the fastest splits' round's: one slow
    # measurement of it (gpt-oss-small: 2.07 ms a decode pass, 0.74-0.80 ms in fresh calibrations) is
    # dropped, and neither is the least kept (method 19's: predictions faster than measured)
    slow_outside = [cal_mod.Round([], [{"load": "host", "n_tokens": 1, "n_past": 32, "split_us": us}], {(1, 32): out})
                    for us, out in ((200.0, 2070.0), (230.0, 780.0), (260.0, 740.0))]
    assert cal_mod.merge_rounds(slow_outside).outside == {(1, 32): 780.0}
    # what a detached load saves, against the kept times outside the graph (of two rounds, the slower:
    # the one with the detached load, 400 us more outside each pass than the other): a host-only pass
    # costs what it measured without the accelerator (900 us)
    both = [cal_mod.Round([], [], {(1, 32): 1300.0, (32, 0): 1800.0}, detached={"RPC": [400.0, 0.0]},
                          alone={"RPC": {(1, 32): 900.0, (32, 0): 1400.0}}),
            cal_mod.Round([], [], {(1, 32): 900.0, (32, 0): 1400.0}, host_s=1.0)]
    m = cal_mod.merge_rounds(both)
    assert m.outside == {(1, 32): 1300.0, (32, 0): 1800.0} and m.alone == {"RPC": {(1, 32): 900.0, (32, 0): 1400.0}}
    assert cal_mod._detached_on(m) == {"RPC": [pytest.approx(400.0), pytest.approx(0.0)]}
    assert cal_mod._detached_on(cal_mod.merge_rounds(both[:1])) == {"RPC": [400.0, 0.0]}
    # each pass's median measured time without the accelerator over the rounds (of two, the slower): a
    # round whose own difference came out 0 (its load without the accelerator slow) does not set it
    noisy = [cal_mod.Round([], [], {(1, 32): 776.0}, detached={"RPC": [0.0, 0.0]}, alone={"RPC": {(1, 32): 776.0}}),
             cal_mod.Round([], [], {(1, 32): 962.0}, detached={"RPC": [620.0, 0.0]}, alone={"RPC": {(1, 32): 342.0}})]
    assert cal_mod._detached_on(cal_mod.merge_rounds(noisy)) == {"RPC": [pytest.approx(962.0 - 776.0), 0.0]}
    # the median round (of an even number, the slower middle one), its splits kept
    three = [cal_mod.Round([], [{"load": "host", "n_tokens": 1, "n_past": 0, "split_us": us}], {(1, 0): us})
             for us in (5.0, 1.0, 3.0)]
    assert cal_mod.merge_rounds(three).outside == {(1, 0): 3.0}
    assert cal_mod.merge_rounds(three[:2]).outside == {(1, 0): 5.0}
    assert cal_mod.merge_rounds(three).splits == [{"load": "host", "n_tokens": 1, "n_past": 0, "split_us": 3.0}]
    # a long round is not repeated
    calls.clear()
    times = iter([(5000.0, 300.0)])
    cal_mod.calibrate("m.gguf", [HOST], None, threads=1, progress=False, rounds_s=0.0)
    assert calls == [True]


def test_layouts_keep_the_round_with_the_median_ratio() -> None:
    # each round's host passes repacked and plain, back to back: a slow phase of the machine during one
    # of the two loads moves that round's ratio, the median round's pair is kept per pass size
    from oallama.planner.cost.rounds import Round, merge_rounds

    def rnd(decode: tuple[float, float], prompt: tuple[float, float]) -> Round:
        sizes = {"1": {"default_us": decode[0], "plain_us": decode[1]},
                 "32": {"default_us": prompt[0], "plain_us": prompt[1]}}
        return Round([], [], {}, layouts={"n_past": 32, "n_weights": 4, "sizes": sizes})

    m = merge_rounds([rnd((100, 90), (1000, 1250)), rnd((100, 140), (1000, 980)), rnd((150, 165), (900, 950))])
    assert m.layouts is not None
    assert m.layouts["sizes"]["1"] == {"default_us": 150, "plain_us": 165}  # ratios 0.9, 1.4, 1.1
    assert m.layouts["sizes"]["32"] == {"default_us": 900, "plain_us": 950}  # 1.25, 0.98, 1.056
    assert m.layouts["n_weights"] == 4 and len(m.layouts["rounds"]) == 3
    assert merge_rounds([Round([], [], {})]).layouts is None


def test_a_round_too_long_to_repeat_repeats_its_host_load(monkeypatch: pytest.MonkeyPatch) -> None:
    # a software GPU's load makes a round too long to repeat (lavapipe's MoE round: 82 s), which would
    # leave the host's passes in the state the machine was in (its host decode 5.9 ms there, 3.5 in
    # another calibration): the host load alone repeats for the rest of the rounds while it is cheap, its
    # passes from their median round; the accelerator's passes and what a detached load saves come
    # from the whole round
    import time as time_mod

    from oallama.planner.cost import calibrate as cal_mod

    host_decode = iter([900.0, 400.0, 200.0, 700.0, 500.0])  # us, per round
    calls: list[bool] = []
    host_s = [0.01]  # seconds the host load takes

    def one_round(*args: object, routing: bool = True, host_only: bool = False, **kw: object) -> cal_mod.Round:
        calls.append(host_only)
        if not host_only:
            time_mod.sleep(0.2)  # the accelerator's load: too long for another whole round
        k = len(calls)
        loads = [("host", HOST, next(host_decode))] + ([] if host_only else [("accelerator", "Vulkan0", 5000.0)])
        splits = [{"load": load, "device": dev, "n_tokens": 1, "n_past": 32, "split": 0, "n_ops": 1, "n_views": 0,
                   "split_us": us, "ops_us": us} for load, dev, us in loads]
        points = [{"load": load, "device": dev, "n_tokens": 1, "n_past": 32, "split": 0, "op": "ADD",
                   "weight_type": "", "work": 1.0, "us": us, "round": k} for load, dev, us in loads]
        return cal_mod.Round(points, splits, {(1, 32): float(k)}, detached={} if host_only else {"V": [1.0, 0.0]},
                             host_s=host_s[0])

    monkeypatch.setattr(cal_mod, "_measure_round", one_round)
    monkeypatch.setattr(cal_mod, "_spans", lambda *a, **k: attnspan.Timed())
    monkeypatch.setattr(cal_mod, "fit", lambda points, overheads, *a, **kw: Calibration(
        {}, 0.0, 0.0, points=list(points), splits=list(a[1]) if len(a) > 1 else []))
    cal = cal_mod.calibrate("m.gguf", [HOST, "Vulkan0"], None, threads=1, progress=False, max_rounds=5,
                            rounds_s=0.3)
    assert calls == [False, True, True, True, True]  # one whole round, then the host load alone
    assert {(p["load"], p["round"]) for p in cal.points} == {("host", 5), ("accelerator", 1)}
    assert cal.detached == {"V": [1.0, 0.0]}
    # a host load that alone would take longer than the rounds' budget is not repeated
    calls.clear()
    host_decode, host_s[0] = iter([900.0]), 1.0
    cal_mod.calibrate("m.gguf", [HOST, "Vulkan0"], None, threads=1, progress=False, max_rounds=5, rounds_s=0.3)
    assert calls == [False]


@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
def test_a_kv_write_s_work_is_the_rows_it_writes_whatever_the_context(tiny_q8: Path, type_k: str) -> None:
    """SET_ROWS's result and third source are the whole cache: its work is the rows written, the same
    in a context of 256 and of 4096 cells, and in proportion to the pass's tokens."""
    from oallama.planner.graph import GraphSession

    got: dict[tuple[int, int], set[float]] = {}
    for n_ctx in (256, 4096):
        with GraphSession(tiny_q8, n_ctx=n_ctx, n_ubatch=64, type_k=type_k) as s:
            for n in (1, 64):
                g = s.graph(n)
                nodes = [x for x in g.nodes if x.op == "SET_ROWS"]
                assert nodes and all(len(x.srcs) == 3 for x in nodes)
                got[(n_ctx, n)] = {work(x.op, x.ne, x.nbytes, [g.tensor(i).ne for i in x.srcs],
                                        sum(g.tensor(i).nbytes for i in x.srcs)) for x in nodes}
    for n in (1, 64):
        assert got[(256, n)] == got[(4096, n)], n
    assert {round(w * 64) for w in got[(256, 1)]} == {round(w) for w in got[(256, 64)]}


def test_a_decode_pass_s_attention_matmuls_are_costed_by_what_they_read_on_a_line_of_their_own(tiny_q8: Path) -> None:
    """A one-token pass's KQ and KQV (a matmul of two activations with one column per head) are the
    kind VEC, whose work is the K or V elements it reads; a prompt's are MUL_MAT in multiply-adds. A
    calibration fits each on its own line: nodes timed on two known lines come back apart."""
    from oallama.planner.graph import GraphSession

    with GraphSession(tiny_q8, n_ctx=512, n_ubatch=32) as s:
        for n in (1, 32):
            g = s.graph(n)
            att = [x for x in g.nodes if x.op == "MUL_MAT" and not x.weight]  # KQ, KQV
            assert att, n
            for x in att:
                srcs = [g.tensor(i) for i in x.srcs]
                w = work(x.op, x.ne, x.nbytes, [t.ne for t in srcs], sum(t.nbytes for t in srcs))
                if n == 1:  # K or V elements read: not the V view's bytes, which span the whole context
                    assert kind(x.op, x.ne) == VEC and w == math.prod(srcs[0].ne) < srcs[0].nbytes
                else:
                    assert kind(x.op, x.ne) == "MUL_MAT" and w == srcs[0].ne[0] * math.prod(x.ne)
    lines = {VEC: (5.0, 2e-3), "MUL_MAT": (40.0, 1e-5)}
    points = [{"load": "host", "n_tokens": 1 if k == VEC else 32, "n_past": 32, "split": 0, "device": "CPU",
               "op": "MUL_MAT", "kind": k, "weight_type": "", "src0_ne": [64, 64, 1, 1], "work": w, "us": a + b * w}
              for k, (a, b) in lines.items() for w in (1e4, 1e5, 1e6)]
    dc = fit(points, [], _OneOpTimes({})).devices["CPU"]
    for k, (a, b) in lines.items():
        assert dc.node_time_us(k, 3e5, 1) == pytest.approx(a + b * 3e5), k


@pytest.mark.parametrize("flash_attn", [False, True])
def test_a_transposed_v_cache_write_is_costed_on_a_line_of_its_own(tiny_q8: Path, flash_attn: bool) -> None:
    """Without flash attention llama.cpp keeps the V cache transposed and writes a pass's V in rows of
    one element: the kind SCATTER, apart from the K write's SET_ROWS (with flash attention both are
    SET_ROWS). A calibration fits each on its own line: nodes timed on two known lines come back apart."""
    from oallama.planner.graph import GraphSession

    with GraphSession(tiny_q8, n_ctx=512, n_ubatch=32, flash_attn=flash_attn) as s:
        for n in (1, 32):
            g = s.graph(n)
            kinds = {x.name.split("_l")[0]: kind(x.op, x.ne) for x in g.nodes if x.op == "SET_ROWS"}
            assert kinds == {"cache_k": "SET_ROWS", "cache_v": "SET_ROWS" if flash_attn else SCATTER}, n
    lines = {SCATTER: (3.0, 5e-3), "SET_ROWS": (2.0, 2e-4)}
    points = [{"load": "host", "n_tokens": n, "n_past": 32, "split": 0, "device": "CPU", "op": "SET_ROWS",
               "kind": k, "weight_type": "", "src0_ne": [1, 64, 1, 1], "work": w * n, "us": a + b * w * n}
              for k, (a, b) in lines.items() for n in (1, 32) for w in (1e3, 1e4)]
    dc = fit(points, [], _OneOpTimes({})).devices["CPU"]
    for k, (a, b) in lines.items():
        assert dc.node_time_us(k, 3e5, 32) == pytest.approx(a + b * 3e5), k


def test_a_row_lookup_s_work_is_the_rows_it_gathers(tiny_q8: Path) -> None:
    """GET_ROWS (the token embedding's lookup) reads the rows it gathers: its work grows with the
    pass's tokens and is a small part of the table's bytes, which the vocabulary sets."""
    from oallama.planner.graph import GraphSession

    got: dict[int, float] = {}
    with GraphSession(tiny_q8, n_ctx=512, n_ubatch=64) as s:
        for n in (1, 64):
            g = s.graph(n)
            x = next(x for x in g.nodes if x.op == "GET_ROWS" and x.weight)
            srcs = [g.tensor(i) for i in x.srcs]
            got[n] = work(x.op, x.ne, x.nbytes, [t.ne for t in srcs], sum(t.nbytes for t in srcs))
            row = srcs[0].nbytes / srcs[0].ne[1]  # bytes of one row of the table
            assert got[n] == pytest.approx(x.nbytes + 4 * n + row * n), n
            assert got[n] < srcs[0].nbytes / 10, n
    assert got[64] == pytest.approx(64 * got[1])
