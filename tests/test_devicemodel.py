"""The device model (planner/cost/devicemodel.py): the devices characterised once on a reference model,
every other model costed from it without running its graph, a shape-only file never run."""

from __future__ import annotations

import copy
import dataclasses
import statistics
from pathlib import Path
from typing import Any

import pytest

from oallama.errors import PlanError
from oallama.model import gguf_file, synthetic
from oallama.planner import plan as planmod
from oallama.planner.cost import attnspan, calfit, devicemodel
from oallama.planner.cost import measure as measuremod
from oallama.planner.cost import profile as profilemod
from oallama.planner.graph import target_ops
from oallama.runtime import kvcache
from oallama.runtime import llama as llamamod
from oallama.runtime.planfile import ConfirmOptions

WORKLOAD = planmod.Workload(prompt=40, gen=8, objective="e2e", n_ubatch=64)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_q8: Path) -> dict[str, list[str]]:
    """A cache of its own, the tiny model as the reference, and a record of every model file whose
    real graph is calibrated and of every model file loaded to run."""
    monkeypatch.setenv("OALLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OALLAMA_REFERENCE_MODEL", str(tiny_q8))
    seen: dict[str, list[str]] = {"calibrated": [], "loaded": []}
    calibrate, init = measuremod.calibrate, llamamod.Llama.__init__

    def spy_calibrate(path: Any, *a: Any, **kw: Any) -> Any:
        seen["calibrated"].append(str(path))
        return calibrate(path, *a, **kw)

    def spy_init(self: Any, model_path: str, *a: Any, **kw: Any) -> None:
        seen["loaded"].append(str(model_path))
        init(self, model_path, *a, **kw)

    monkeypatch.setattr(measuremod, "calibrate", spy_calibrate)
    monkeypatch.setattr(llamamod.Llama, "__init__", spy_init)
    return seen


def test_shape_only_files_are_marked(tmp_path: Path, tiny_q8: Path) -> None:
    path = synthetic.write_model(tmp_path / "s.gguf", "tiny", "q8_0", shape_only=True, progress=False)
    assert gguf_file.check_model(path).shape_only
    assert not gguf_file.check_model(tiny_q8).shape_only


def test_a_shape_only_file_is_never_run_and_a_second_model_reuses_the_device_model(
        runs: dict[str, list[str]], tmp_path: Path, tiny_q8: Path, synth_model: Any) -> None:
    shape = synthetic.write_model(tmp_path / "mid-shape.gguf", "mid", "q4_k_m", n_layer=2, shape_only=True,
                                  progress=False)
    with pytest.raises(PlanError, match="shape-only"):  # its own calibration would run it
        planmod.build_context(shape, None, WORKLOAD, threads=1, progress=False, calibration="model")
    ctx = planmod.build_context(shape, None, WORKLOAD, threads=1, progress=False)
    # the devices were characterised on the reference (its real graph run), the shape-only file never
    assert runs["calibrated"] == [str(tiny_q8)]
    assert str(shape) not in runs["loaded"]
    dm = devicemodel.lookup(["CPU"], profilemod.default_settings(1))
    assert dm is not None and dm.reference["identity"] == gguf_file.check_model(tiny_q8).identity()
    cal = ctx.profile.calibration
    assert cal is not None and cal.devices["CPU"].node_overhead_us == dm.terms["CPU"]["node_overhead_us"]
    # sampling grows with the vocabulary: the mid model's decode pass costs its own vocabulary's sampling
    vocab = devicemodel.n_vocab(ctx.model)
    assert cal.decode_us == pytest.approx(dm.outside["decode_us"] + dm.outside["sample_us_per_id"] * vocab)
    # nor is it run to confirm the plan
    kept, _, conf = planmod.confirmed(ctx, None, ConfirmOptions(), progress=False)
    assert conf is None and kept.strategy == "optimal"
    assert str(shape) not in runs["loaded"]

    # a second model, never seen: planned from the cached device model, its graph not run
    other = synth_model("tiny", "f16", n_layer=2)
    before = len(runs["loaded"])
    ctx2 = planmod.build_context(other, None, WORKLOAD, threads=1, progress=False, calibration="device")
    assert runs["calibrated"] == [str(tiny_q8)]
    assert len(runs["loaded"]) == before
    cal2 = ctx2.profile.calibration
    assert cal2 is not None and cal2.devices["CPU"].ops.keys() == cal.devices["CPU"].ops.keys()
    pred = ctx2.predict(planmod.make_plan(ctx2, "optimal", None).placement)
    assert pred["e2e_ms"] > 0 and pred["tpot_ms"] > 0


def test_the_device_model_follows_an_rpc_server_to_another_port() -> None:
    dm = devicemodel.DeviceModel(
        "k", ["CPU", "RPC[127.0.0.1:5000]"],
        {"CPU": {"node_overhead_us": 1.0, "matmul_scale": 1.1, "ops": {"*": {"a_us": 1.0, "b_us": 0.5, "n": 3}}},
         "RPC[127.0.0.1:5000]": {"node_overhead_us": 80.0, "matmul_scale": 0.9, "ops": {}}},
        {"pass_a_us": 100.0, "pass_b_us": 2.0, "decode_us": 50.0, "sample_us_per_id": 0.001},
        {"RPC[127.0.0.1:5000]": {"split_us": 30.0, "stream_latency_us": 10.0, "stream_bytes_per_us": 500.0}},
        {"RPC[127.0.0.1:5000]": [20.0, 0.5]}, {"model": "ref.gguf"})
    again = devicemodel.DeviceModel.from_json(dm.to_json())
    cal = again.calibration(["CPU", "RPC[127.0.0.1:6000]"], vocab=32000)
    assert set(cal.devices) == {"CPU", "RPC[127.0.0.1:6000]"}
    assert cal.devices["RPC[127.0.0.1:6000]"].node_overhead_us == 80.0
    assert cal.links["RPC[127.0.0.1:6000]"]["split_us"] == 30.0
    assert cal.detached_us("RPC[127.0.0.1:6000]", 4) == pytest.approx(22.0)
    assert cal.pass_overhead_us(1) == pytest.approx(50.0 + 32.0)
    assert cal.pass_overhead_us(10) == pytest.approx(100.0 + 32.0 + 20.0)


def test_a_model_of_the_references_shapes_takes_its_matmul_times_from_the_device_model(
        runs: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_q8: Path) -> None:
    """The device model keeps the reference's one-op weight matmul times: a model of the same widths
    and types (here a shape-only twin of the reference) times none of its own; one of other widths
    times its own, and only those."""
    timed: list[tuple[str, tuple[int, ...]]] = []  # weight matmuls timed once the device model exists
    time_op = measuremod.time_op

    def spy(device: str, op: str, wtype: str, shape: tuple[int, ...], *a: Any, **kw: Any) -> Any:
        if any(devicemodel.cache_dir().glob("*.json")):  # not the characterisation's own profile
            timed.append((wtype, shape))
        return time_op(device, op, wtype, shape, *a, **kw)

    def signatures(keys: Any) -> set[tuple[str, tuple[int, ...]]]:
        return {(k.split(":")[1], tuple(map(int, k.split(":")[2].split("x")))) for k in keys}

    monkeypatch.setattr(measuremod, "time_op", spy)
    twin = synthetic.write_model(tmp_path / "twin.gguf", "tiny", "q8_0", shape_only=True, progress=False)
    ctx = planmod.build_context(twin, None, WORKLOAD, threads=1, progress=False)
    assert runs["calibrated"] == [str(tiny_q8)]  # the devices characterised on the reference
    dm = devicemodel.lookup(["CPU"], profilemod.default_settings(1))
    assert dm is not None and signatures(ctx.profile.ops["CPU"]) <= signatures(dm.matmuls["ops"]["CPU"])
    assert timed == []
    for key, stats in ctx.profile.ops["CPU"].items():
        assert stats["median_us"] == dm.matmuls["ops"]["CPU"][key]["median_us"], key

    wider = synthetic.write_model(tmp_path / "wider.gguf", "mid", "q8_0", n_layer=2, shape_only=True, progress=False)
    ctx2 = planmod.build_context(wider, None, WORKLOAD, threads=1, progress=False)
    own = signatures(ctx2.profile.ops["CPU"])
    assert timed and set(timed) == own - signatures(dm.matmuls["ops"]["CPU"])


def test_a_model_costed_from_the_device_model_is_timed_only_at_the_column_counts_its_plan_reads(
        runs: dict[str, list[str]], tmp_path: Path) -> None:
    """Its weight matmuls are timed at the grid's column counts its passes' ops are interpolated from
    (a 40-token prompt: 32 and 64; and 1), not at the others; from those each op costs what it costs
    from the whole grid, at the plan's column counts and beyond the grid's ends. A plan of another
    prompt (200 tokens: 128 and 256) adds its counts to the same profile, timing only those."""
    wider = synthetic.write_model(tmp_path / "wider.gguf", "mid", "q8_0", n_layer=2, shape_only=True, progress=False)
    ctx = planmod.build_context(wider, None, WORKLOAD, threads=1, progress=False)
    ops = [op for pm in ctx.passes.values() for op in target_ops(pm.graph)]
    assert {op.n_tokens for op in ops} == {1, 40}

    def columns(table: dict[str, Any]) -> set[int]:
        return {int(k.rsplit(":", 1)[1]) for k in table}

    first = copy.deepcopy(ctx.profile.ops["CPU"])
    assert columns(first) == {1, 32, 64}
    longer = planmod.build_context(wider, None, dataclasses.replace(WORKLOAD, prompt=200, n_ubatch=256), threads=1,
                                   progress=False)
    assert longer.profile.key == ctx.profile.key and columns(longer.profile.ops["CPU"]) == {1, 32, 64, 128, 256}
    assert all(longer.profile.ops["CPU"][k] == v for k, v in first.items())  # kept, not timed again

    whole = measuremod.profile_model(wider, ["CPU"], threads=1, repeats=2, progress=False, calibrated=False,
                                     cache=False, routed=False)
    for used in ({1, 40}, {1, 40, 600}):
        keep = profilemod.grid_columns(used, profilemod.DEFAULT_TOKENS)
        part = copy.deepcopy(whole)
        part.ops["CPU"] = {k: v for k, v in whole.ops["CPU"].items() if int(k.rsplit(":", 1)[1]) in keep}
        assert len(part.ops["CPU"]) < len(whole.ops["CPU"])
        for op in ops:
            for n in used:
                assert part.op_time_us("CPU", op, n) == whole.op_time_us("CPU", op, n), (op.weight, n)


def test_the_reference_s_layer_weights_are_kept_at_every_column_count(
        runs: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, synth_model: Any) -> None:
    """A 2-layer Q4_K_M reference: its last layer's ffn_down is q6_K, the only one, and llama.cpp runs a
    last layer's feed-forward on the output rows alone (1 column). A deeper model of the same widths
    runs q6_K ffn_down in other layers at every pass size: the device model keeps every layer
    weight at every column count of a profile."""
    ref = synth_model("tiny", "q4_k_m", n_layer=2)
    monkeypatch.setenv("OALLAMA_REFERENCE_MODEL", str(ref))
    twin = synthetic.write_model(tmp_path / "twin.gguf", "tiny", "q4_k_m", n_layer=2, shape_only=True, progress=False)
    ctx = planmod.build_context(twin, None, WORKLOAD, threads=1, progress=False)
    dm = devicemodel.lookup(["CPU"], profilemod.default_settings(1))
    assert dm is not None and runs["calibrated"] == [str(ref)]
    down = [op for pm in ctx.passes.values() for op in target_ops(pm.graph) if op.weight == "blk.1.ffn_down.weight"]
    assert down and {op.n_tokens for op in down} == {1} and down[0].weight_type == "q6_K"
    for pm in ctx.passes.values():
        for op in target_ops(pm.graph):
            if op.layer is not None:
                keys = {profilemod.Profile.op_key(op.op, op.weight_type, op.weight_shape, n)
                        for n in profilemod.DEFAULT_TOKENS}
                assert keys <= dm.matmuls["ops"]["CPU"].keys(), op.weight


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_attention_spans_are_each_layer_s_nodes_that_grow_with_the_kv_cache(tiny_q8: Path, flash_attn: bool) -> None:
    """The spans timed at two KV lengths: per layer and pass (a prompt in the workloads' default ubatch, a
    decode), the run of nodes whose work grows with the cache -- KQ, softmax, KQV; flash attention's one
    node -- found in the real graph, each timed at both lengths, its nodes by the kind they are costed as."""
    timed = attnspan.measure(tiny_q8, ["CPU"], threads=1, attention=kvcache.llama_kwargs(flash_attn, "f16", "f16"),
                             reps=1)
    spans = timed.spans
    n_layer = int(gguf_file.check_model(tiny_q8).hparam("block_count"))
    # a prompt's attention per unit of work depends on its pass size (bench/results/2026-11-28-vm-attention-curve)
    assert planmod.Workload().n_ubatch == attnspan.PROMPT_TOKENS
    for n in (attnspan.PROMPT_TOKENS, 1):
        mm = calfit.VEC if n == 1 else "MUL_MAT"  # a decode pass's KQ and KQV: matrix-vector products
        want = ["FLASH_ATTN_EXT"] if flash_attn else [mm, "SOFT_MAX", mm]
        got = [s for s in spans if s["n_tokens"] == n]
        assert len(got) == n_layer, n
        for s in got:
            assert [op for op, _, _ in s["nodes"]] == want and s["device"] == "CPU" and s["load"] == "host"
            assert all(wl > ws for _, ws, wl in s["nodes"])
            assert s["short_us"] > 0 and s["long_us"] > 0
            # a prompt's spans also after a longer cache, written (runtime.kvstate): more work per node, timed
            if n == 1:
                assert "tails" not in s
            else:
                (t,) = s["tails"]
                assert t["past"] == attnspan.PROMPT_TAIL and t["us"] > 0 and s["tail_base_us"] > 0
                assert all(w > wl for w, (_, _, wl) in zip(t["works"], s["nodes"], strict=True))
    # the prompt pass after no cache, also run whole: one split on the host, holding its spans' times
    (whole,) = timed.whole
    assert (whole.load, whole.n_tokens, whole.n_past, len(whole.split_us)) == ("host", attnspan.PROMPT_TOKENS, 0, 1)
    assert whole.split_us[0] > sum(s["short_us"] for s in spans if s["n_tokens"] == attnspan.PROMPT_TOKENS)


def test_the_span_factors_recover_known_lines_and_scale_each_pass_kind_s_attention() -> None:
    """Synthetic spans timed as if the attention kinds' lines were 3x steeper with 0.5x the intercept at
    decode, 0.5x as steep with 2x the intercept in prompts (plus a timed stop's node overhead): the
    factors come back, and the lines they give cost decode and prompt attention so, every other op as
    fitted."""
    lines = {"MUL_MAT": (20.0, 1e-5), "SOFT_MAX": (2.0, 1e-4), "ADD": (1.0, 1e-6)}
    dc = calfit.DeviceCalibration(4.0, {op: calfit.OpFit(a, b, 8) for op, (a, b) in lines.items()}, 1.0)

    def true_us(op: str, w: float, slope: float, icept: float) -> float:
        a, b = lines[op]
        return a + b * w if op == "ADD" else icept * a + slope * b * w

    def span(n: int, slope: float, icept: float, scale: float) -> dict[str, Any]:
        nodes = [["MUL_MAT", 1e6 * scale, 9e6 * scale], ["SOFT_MAX", 1e4 * scale, 9e4 * scale],
                 ["ADD", 5e3, 5e3], ["MUL_MAT", 2e6 * scale, 8e6 * scale]]
        return {"n_tokens": n, "device": "CPU", "nodes": nodes,
                "short_us": 4.0 + sum(true_us(op, ws, slope, icept) for op, ws, _ in nodes),
                "long_us": 4.0 + sum(true_us(op, wl, slope, icept) for op, _, wl in nodes)}

    got = calfit.span_factors({"CPU": dc}, [span(1, 3.0, 0.5, 1.0), span(1, 3.0, 0.5, 2.0), span(128, 0.5, 2.0, 50.0)])
    assert got["CPU"]["1"]["factor"] == pytest.approx(3.0) and got["CPU"]["n"]["factor"] == pytest.approx(0.5)
    assert got["CPU"]["1"]["intercept"] == pytest.approx(0.5) and got["CPU"]["n"]["intercept"] == pytest.approx(2.0)
    assert got["CPU"]["1"]["kinds"] == ["MUL_MAT", "SOFT_MAX"]
    scaled = calfit.DeviceCalibration(4.0, {**dc.ops, **calfit.span_lines(dc, got["CPU"])}, 1.0)
    w = 4e6
    for op in ("MUL_MAT", "SOFT_MAX"):
        assert scaled.node_time_us(op, w, 1) == pytest.approx(true_us(op, w, 3.0, 0.5)), op
        assert scaled.node_time_us(op, w, 128) == pytest.approx(true_us(op, w, 0.5, 2.0)), op
    assert scaled.node_time_us("ADD", w, 1) == scaled.node_time_us("ADD", w, 128) == pytest.approx(1.0 + 1e-6 * w)


def test_tails_timed_in_separate_runs_bend_a_line_through_each_segment_s_own_growth() -> None:
    """Synthetic decode spans of a kind whose line steepens 2x past work 1e6 and 5x past 3e6 (a cache
    leaving the CPU's caches), the tails after 2e6 and 4e6 of work timed in two separate runs, each against
    its own long passes (its "base_us", 30 and 70 us above the span's own long time: the VM drifted): the
    knots come back where each segment starts, with each segment's slope."""
    a, b = 10.0, 1e-4
    dc = calfit.DeviceCalibration(0.0, {calfit.VEC: calfit.OpFit(a, b, 8)}, 1.0)

    def true_us(w: float) -> float:
        return a + b * w + b * (w - 1e6) * (w > 1e6) + 3 * b * (w - 3e6) * (w > 3e6)

    tails = [{"past": past, "us": true_us(w) + drift, "works": [w], "base_us": true_us(1e6) + drift}
             for past, w, drift in ((4096, 4e6, 70.0), (2048, 2e6, 30.0))]
    span = {"n_tokens": 1, "device": "CPU", "nodes": [[calfit.VEC, 1e5, 1e6]], "short_us": true_us(1e5),
            "long_us": true_us(1e6), "tails": tails}
    got = calfit.span_factors({"CPU": dc}, [span])["CPU"]["1"]
    assert got["factor"] == pytest.approx(1.0) and got["intercept"] == pytest.approx(1.0)
    (line,) = calfit.span_lines(dc, {"1": got}).values()
    assert [k for k, _ in line.knots] == [pytest.approx(1e6), pytest.approx(2e6)]
    for w in (5e5, 1e6, 1.5e6, 2e6, 4e6):  # through each tail; straight between two (3e6, the bend, is not timed)
        assert line.time_us(w) == pytest.approx(true_us(w)), w


def test_a_workload_s_decode_past_is_timed_once_in_its_profile_and_bends_the_decode_lines(
        runs: dict[str, list[str]], tiny_q8: Path, gemma3_270m: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload decoding after more cells than the spans' long cache: the calibration also times its decode
    spans after the workload's mean past, once (a second plan of it, or of a past within DECODE_MATCH,
    reuses the cached profile; another past adds its own tail), and the decode lines bend through them
    while every other line stays as fitted without them."""
    from oallama.planner.cost import calibrate as calmod

    timed: list[int] = []
    measure_decode = attnspan.measure_decode

    def spy(path: Any, devices: Any, past: int, **kw: Any) -> Any:
        timed.append(past)
        return measure_decode(path, devices, past, **kw)

    monkeypatch.setattr(attnspan, "measure_decode", spy)
    wl = dataclasses.replace(WORKLOAD, prompt=1500, gen=8, n_ubatch=512)
    past = round(wl.pass_attended()[wl.decode_pass] - 1)
    assert past == 1500 + 3  # the decode passes after 1500..1506 cells
    ctx = planmod.build_context(tiny_q8, None, wl, threads=1, progress=False, calibration="model")
    cal = ctx.profile.calibration
    assert cal is not None and timed == [past] and calmod.decode_tail_pasts(cal) == [past]
    decode = [s for s in cal.spans if s["n_tokens"] == 1]
    assert decode and all([t["past"] for t in s["tails"]] == [past] and s["tails"][0]["base_us"] > 0 for s in decode)
    ops = cal.devices["CPU"].ops
    bent = {k for k, f in ops.items() if k.endswith(":1") and f.knots}
    assert bent == {f"{k}:1" for s in decode for k, ws, wl_ in s["nodes"] if wl_ > ws}
    without = calfit.fit(cal.points, [], ctx.profile, cal.splits, cal.routing,
                         [{k: v for k, v in s.items() if s["n_tokens"] != 1 or k != "tails"} for s in cal.spans])
    assert {k: dataclasses.replace(f, knots=[]) if k in bent else f for k, f in ops.items()} == \
        without.devices["CPU"].ops
    # planned again, or nearly the same past: no measurement; another past: one more tail
    for prompt in (1500, 1510):
        planmod.build_context(tiny_q8, None, dataclasses.replace(wl, prompt=prompt), threads=1, progress=False,
                              calibration="model")
    assert timed == [past] and runs["calibrated"] == [str(tiny_q8)]
    ctx3 = planmod.build_context(tiny_q8, None, dataclasses.replace(wl, prompt=3000), threads=1, progress=False,
                                 calibration="model")
    assert timed == [past, 3003] and calmod.decode_tail_pasts(ctx3.profile.calibration) == [past, 3003]
    assert runs["calibrated"] == [str(tiny_q8)]
    # a workload within the spans' long cache times nothing more
    planmod.build_context(tiny_q8, None, WORKLOAD, threads=1, progress=False, calibration="model")
    assert timed == [past, 3003]
    # a calibration whose spans were over budget takes the decode spans timed with the tail as its own
    bare = dataclasses.replace(cal, spans=[s for s in cal.spans if s["n_tokens"] != 1])
    got = calmod.with_decode_tail(bare, ctx.profile, tiny_q8, ["CPU"], past, threads=1, progress=False,
                                  attention=ctx.profile.settings.attention())
    assert got is not None and {s["decode_past"] for s in got.spans if s["n_tokens"] == 1} == {past}
    assert {k for k, f in got.devices["CPU"].ops.items() if k.endswith(":1") and f.knots} == bent
    # a sliding-window model's caches are not written: nothing is loaded to find that out
    loaded = len(runs["loaded"])
    assert calmod.with_decode_tail(cal, ctx.profile, gemma3_270m, ["CPU"], past, threads=1, progress=False) is None
    assert timed == [past, 3003, past] and len(runs["loaded"]) == loaded


def test_a_calibration_fits_its_attention_lines_to_its_spans_and_the_device_model_carries_them(
        runs: dict[str, list[str]], tiny_q8: Path) -> None:
    """A calibration cheap enough times the attention spans and keeps them; its fit gives the attention
    kinds lines of their own for decode ("<kind>:1"), fitted again from the stored spans alike; the
    device model characterised on it carries those lines."""
    ctx = planmod.build_context(tiny_q8, None, WORKLOAD, threads=1, progress=False, calibration="model")
    cal = ctx.profile.calibration
    assert cal is not None and cal.spans and {s["n_tokens"] for s in cal.spans} == {1, attnspan.PROMPT_TOKENS}
    ops = cal.devices["CPU"].ops
    assert f"{calfit.VEC}:1" in ops and "SOFT_MAX:1" in ops
    # the prompt attention bends where the long spans' work ends, toward the spans after PROMPT_TAIL cells
    bent = {op for op, f in ops.items() if f.knots}
    assert bent == {k for sp in cal.spans if sp["n_tokens"] == attnspan.PROMPT_TOKENS for k, _, _ in sp["nodes"]}
    for op in bent:  # one knot, at the long spans' work of that kind
        long_works = [wl for sp in cal.spans if sp["n_tokens"] == attnspan.PROMPT_TOKENS
                      for k, _, wl in sp["nodes"] if k == op]
        assert [k for k, _ in ops[op].knots] == [pytest.approx(statistics.median(long_works))]
    again = calfit.refitted(cal, ctx.profile).devices["CPU"].ops
    # the same lines: the stored profile takes the launch the fit saw (Profile.launch_us)
    assert again == ops
    without = calfit.fit(cal.points, [], ctx.profile, cal.splits, cal.routing).devices["CPU"].ops
    assert f"{calfit.VEC}:1" not in without  # the decode lines come from the spans
    # the spans' prompt pass, run whole, gives its size (the workloads' ubatch, beyond the loads' sizes) a factor
    # of its own and touches nothing else
    assert attnspan.PROMPT_TOKENS in cal.devices["CPU"].anchors
    assert {p["n_tokens"] for p in cal.points if p.get("anchor_only")} == {attnspan.PROMPT_TOKENS}
    loads_only = calfit.fit([p for p in cal.points if not p.get("anchor_only")], [], ctx.profile,
                            [s for s in cal.splits if not s.get("anchor_only")], cal.routing, cal.spans).devices["CPU"]
    assert attnspan.PROMPT_TOKENS not in loads_only.anchors
    assert loads_only.ops == ops and loads_only.matmul_scale == cal.devices["CPU"].matmul_scale
    assert loads_only.anchors == {n: a for n, a in cal.devices["CPU"].anchors.items() if n != attnspan.PROMPT_TOKENS}
    other = synthetic.write_model(tiny_q8.parent / "other-shape.gguf", "mid", "q8_0", n_layer=2, shape_only=True,
                                  progress=False)
    ctx2 = planmod.build_context(other, None, WORKLOAD, threads=1, progress=False)
    assert ctx2.profile.calibration is not None
    carried = ctx2.profile.calibration.devices["CPU"].ops
    assert carried[f"{calfit.VEC}:1"] == ops[f"{calfit.VEC}:1"] and carried["SOFT_MAX:1"] == ops["SOFT_MAX:1"]
