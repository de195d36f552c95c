"""Mixture-of-experts models: the qwen3moe / gpt-oss presets load and generate, their graphs list
MUL_MAT_ID ops on the expert tensors, and the profiler times those ops with realistic routing."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oallama
from oallama import _core
from oallama.model import synthetic
from oallama.model.gguf_file import read
from oallama.model.synthetic import PRESETS
from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.profile import Profile
from oallama.planner.graph import inventory
from oallama.planner.workload import Ubatch
from oallama.runtime import rpc

# small variant -> (file type, the full-size preset it shrinks)
SMALL = {"qwen3moe-small": ("q4_k_m", "qwen3-30b-a3b"), "gpt-oss-small": ("mxfp4_moe", "gpt-oss-20b")}
EXPS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@pytest.fixture(scope="module", params=sorted(SMALL))
def small(request: pytest.FixtureRequest, synth_model) -> tuple[str, Path]:
    return request.param, synth_model(request.param, SMALL[request.param][0])


def test_small_presets_load_and_generate(small: tuple[str, Path]) -> None:
    name, path = small
    p = PRESETS[name]
    assert read(path).architecture == p.arch
    llm = oallama.Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False)
    try:
        # the experts are loaded as llama.cpp's 3-D tensors [n_in, n_out, n_expert]
        shapes = {t.name: t.shape for t in llm.tensor_placements()}
        assert p.moe is not None
        assert shapes["blk.0.ffn_gate_exps.weight"] == (p.n_embd, p.moe.n_ff_exp, p.moe.n_expert)
        assert shapes["blk.0.ffn_down_exps.weight"] == (p.moe.n_ff_exp, p.n_embd, p.moe.n_expert)
        out = llm("The quick brown fox", max_tokens=4, temperature=0.0)
    finally:
        llm.close()
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["text"]


def test_oallama_run_generates(small: tuple[str, Path]) -> None:
    _, path = small
    r = subprocess.run([sys.executable, "-m", "oallama", "run", str(path), "-n", "4", "--threads", "2",
                        "--temperature", "0", "--ctx", "256"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "output: '" in r.stdout and "4 tokens in" in r.stdout


def test_inventory_lists_mul_mat_id_on_the_experts(small: tuple[str, Path]) -> None:
    name, path = small
    p = PRESETS[name]
    assert p.moe is not None
    inv = inventory(path, (1, 32))
    for n in (1, 32):
        ids = [o for o in inv.target_ops(n) if o.op == "MUL_MAT_ID"]
        assert {o.weight for o in ids} == {f"blk.{i}.{e}.weight" for i in range(p.n_layer) for e in EXPS}
        assert all(o.op == "MUL_MAT" for o in inv.target_ops(n) if "_exps." not in o.weight)
        for o in ids:
            assert o.n_expert_used == p.moe.n_expert_used and len(o.weight_shape) == 3
            assert o.weight_shape[2] == p.moe.n_expert
            # qwen3moe's last layer only runs the token whose logits are asked for
            assert o.n_tokens == n or (o.layer == p.n_layer - 1 and o.n_tokens == 1)
            assert o.flops == 2 * o.weight_shape[0] * o.weight_shape[1] * p.moe.n_expert_used * o.n_tokens


@pytest.mark.parametrize("name", [full for _, full in SMALL.values()])
def test_full_size_shape_only(name: str, tmp_path: Path) -> None:
    p = PRESETS[name]
    assert p.moe is not None
    qtype = next(q for q, full in SMALL.values() if full == name)
    path = synthetic.write_model(tmp_path / "m.gguf", name, qtype, shape_only=True, progress=False)
    info = read(path)
    assert info.hparam("expert_count") == p.moe.n_expert and info.hparam("block_count") == p.n_layer
    assert info.tensor(f"blk.{p.n_layer - 1}.ffn_up_exps.weight").shape == (p.n_embd, p.moe.n_ff_exp, p.moe.n_expert)
    # llama.cpp accepts the full shapes (a metadata-only load, nothing read)
    ids = [o for o in inventory(path, (1,)).target_ops(1) if o.op == "MUL_MAT_ID"]
    assert len(ids) == 3 * p.n_layer and {o.n_expert_used for o in ids} == {p.moe.n_expert_used}
    path.unlink()


def test_profile_times_mul_mat_id_on_the_cpu(synth_model) -> None:
    path = synth_model("qwen3moe-small", "q4_k_m")
    moe = PRESETS["qwen3moe-small"].moe
    assert moe is not None
    inv = inventory(path, (1, 32))
    prof = profile_model(path, ["CPU"], threads=1, n_tokens=(1, 32), repeats=3, progress=False, calibrated=False,
                         inv=inv)
    ops = [o for n in (1, 32) for o in inv.target_ops(n) if o.op == "MUL_MAT_ID"]
    assert ops
    for o in ops:
        assert prof.op_time_us("CPU", o) > 0
        st = prof.ops["CPU"][prof.op_key(o.op, o.weight_type, o.weight_shape, o.n_tokens)]
        assert st["n"] == 3 and st["n_expert_used"] == moe.n_expert_used
        assert st["n_active"] == min(moe.n_expert, o.n_tokens * moe.n_expert_used)
        # q4_K experts live repacked, as the real load puts them (MUL_MAT_ID-capable CPU_REPACK)
        assert st["buffer_type"] == ("CPU_REPACK" if o.weight_type == "q4_K" else "CPU")
        # also timed with every token on the same experts; a routing's distinct experts in between
        most, k = st["n_active"], moe.n_expert_used
        if most > k:
            t_few, t_most = st["few_median_us"], st["median_us"]
            assert prof.op_time_us("CPU", o, active=k) == pytest.approx(t_few)
            assert prof.op_time_us("CPU", o, active=most) == prof.op_time_us("CPU", o) == pytest.approx(t_most)
            assert prof.op_time_us("CPU", o, active=(k + most) / 2) == pytest.approx((t_few + t_most) / 2)
        else:
            assert "few_median_us" not in st and prof.op_time_us("CPU", o, active=k) == st["median_us"]


def test_a_shape_only_profile_times_the_few_routing_when_a_routed_model_takes_it(synth_model, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # a shape-only file has no routing to cost: its expert matmuls are timed with the most experts
    # only; the real model of the same shapes shares that profile (its key is the shapes) and, its
    # routing measured, gets the timings with every token on the same experts added to it
    monkeypatch.setenv("OALLAMA_CACHE", str(tmp_path / "cache"))
    real = synth_model("qwen3moe-small", "q4_k_m")
    shape = synthetic.write_model(tmp_path / "shape.gguf", "qwen3moe-small", "q4_k_m", shape_only=True, progress=False)
    kw = {"threads": 1, "n_tokens": (1, 32), "repeats": 3, "progress": False, "calibrated": False}
    first = profile_model(shape, ["CPU"], routed=False, **kw)
    ids = [o for o in inventory(real, (32,)).target_ops(32) if o.op == "MUL_MAT_ID" and o.n_tokens == 32]
    keys = {Profile.op_key(o.op, o.weight_type, o.weight_shape, 32) for o in ids}
    tables = [first.ops["CPU"], *first.layouts.values()]
    assert all(k in first.ops["CPU"] and first.ops["CPU"][k]["n_active"] > 8 for k in keys)
    assert not any("few_median_us" in t[k] for t in tables for k in keys if k in t)
    second = profile_model(real, ["CPU"], **kw)
    assert second.key == first.key
    for prof in (second, Profile.load(next((tmp_path / "cache" / "profiles").glob("*.json")))):
        tables = [prof.ops["CPU"], *prof.layouts.values()]
        assert sum(k in t for t in tables for k in keys) > len(keys)  # the host layouts too
        assert all(t[k]["few_median_us"] > 0 for t in tables for k in keys if k in t)
    o = ids[0]
    st = second.ops["CPU"][Profile.op_key(o.op, o.weight_type, o.weight_shape, 32)]
    assert second.op_time_us("CPU", o, active=8) == pytest.approx(st["few_median_us"])


def test_mul_mat_id_time_grows_with_active_experts() -> None:
    # the same op (8 tokens x 8 experts each = 64 slots, the same flops) routed to 1 expert or to
    # all 64: the first reads one expert's 4 MiB, the second all 256 MiB (measured 3.6-3.9x slower on
    # a 2-core EPYC VM; f32 gives the largest gap, quantized CPU kernels being compute-bound)
    k, m, n_expert, n_used, n = 1024, 1024, 64, 8, 8
    one, every = _core.profile_mul_mat_id("CPU", "f32", k, m, n_expert, n_used, [n, n], [1, n_expert],
                                          n_threads=1, warmup=1, repeats=5)
    assert statistics.median(every.samples_us) > statistics.median(one.samples_us) > 0
    with pytest.raises(RuntimeError, match="active experts"):
        _core.profile_mul_mat_id("CPU", "f32", 64, 64, 4, 2, [1], [3], n_threads=1)


# --- planning: expert tensors are placement units; llama.cpp's --n-cpu-moe is a baseline ---------


@pytest.fixture(scope="module")
def moe_context(synth_model, rpc_server):
    from oallama.planner.plan import Workload, build_context

    path = synth_model("qwen3moe-small", "q4_k_m")
    return build_context(path, rpc_server.device_name, Workload(prompt=32, gen=8, n_ubatch=32), threads=2,
                         progress=False)


def test_n_cpu_moe_is_the_smallest_n_that_fits(moe_context) -> None:
    from oallama.planner.plan import make_plan
    from oallama.planner.strategies import expert_layers, place_n_cpu_moe
    from oallama.planner.verify import measure_memory

    ctx = moe_context
    exps = expert_layers(ctx.weight_bytes)
    assert len(exps) == 3 * ctx.n_layer
    full = measure_memory(ctx, place_n_cpu_moe(ctx, 0))["total"]
    plan = make_plan(ctx, "n-cpu-moe", full)  # room for everything: no expert on the CPU
    assert plan.extra["n_cpu_moe"] == 0 and plan.placement.on_acc >= set(exps)
    assert plan.emit_args() == ["-ngl", str(ctx.n_layer + 1), "--n-cpu-moe", "0"]
    # one byte less than every expert on the accelerator needs: the first layer's experts go to the CPU
    plan = make_plan(ctx, "n-cpu-moe", full - 1)
    n = plan.extra["n_cpu_moe"]
    assert n >= 1 and plan.memory["total"] <= full - 1
    assert {w for w in exps if w not in plan.placement.on_acc} == {w for w, layer in exps.items() if layer < n}
    if n > 1:  # the search's answer is the smallest: one layer fewer does not fit
        assert measure_memory(ctx, place_n_cpu_moe(ctx, n - 1))["total"] > full - 1


def test_moe_plans_load_as_planned(moe_context, tmp_path: Path) -> None:
    from oallama.planner.plan import make_plan

    ctx = moe_context
    full = sum(ctx.weight_bytes.values())
    ref = oallama.Llama(str(ctx.model.path), n_ctx=128, n_threads=2, verbose=False)
    try:
        want_text = ref("The quick brown fox", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    finally:
        ref.close()
    for strategy in ("n-cpu-moe", "optimal"):
        plan = make_plan(ctx, strategy, int(full * 0.9))
        path = plan.save(tmp_path / f"{strategy}.json")
        llm = oallama.Llama(str(ctx.model.path), placement=str(path), n_ctx=128, n_threads=2, verbose=False)
        try:
            got = llm.tensor_devices()
            assert {w: got[w] for w in plan.assignment()} == plan.assignment(), strategy
            text = llm("The quick brown fox", max_tokens=6, temperature=0.0)["choices"][0]["text"]
        finally:
            llm.close()
        assert text == want_text, strategy


def test_n_cpu_moe_refuses_a_dense_model(synth_model, rpc_server) -> None:
    from oallama.errors import PlanError
    from oallama.planner.plan import Workload, build_context, make_plan

    ctx = build_context(synth_model("tiny", "q8_0"), rpc_server.device_name, Workload(prompt=32, gen=8, n_ubatch=32),
                        threads=1, progress=False)
    with pytest.raises(PlanError, match="no expert tensors"):
        make_plan(ctx, "n-cpu-moe", "50%")


def test_streamed_experts_copy_only_the_routed_experts(moe_context, rpc_server) -> None:
    # When ggml's scheduler streams a host expert tensor to the accelerator, it copies only the
    # experts the pass's tokens were routed to (ggml_backend_sched_compute_splits); the pass model
    # charges that share (`expert_fraction`: n_used / n_expert of the tensor at one token). Checked
    # against the bytes that really crossed to an rpc-server in decode passes that stream every
    # expert tensor (plain layout: a repacked weight cannot stream).
    from oallama.planner.cost.profile import PLAIN
    from oallama.planner.cost.schedmodel import Placement, expert_fraction

    ctx = moe_context
    pm = ctx.passes[Ubatch(1)]
    exps = sorted(w for w in ctx.weight_bytes if "_exps." in w)
    whole = sum(ctx.weight_bytes[w] for w in exps)
    share = {w: pm.copied_share[w] for w in exps}
    n_expert, n_used = ctx.model.metadata["qwen3moe.expert_count"], ctx.model.metadata["qwen3moe.expert_used_count"]
    assert share == {w: pytest.approx(expert_fraction(n_expert, n_used, 1)) for w in exps}
    assert expert_fraction(n_expert, n_used, 1) == pytest.approx(n_used / n_expert)
    routed = sum(share[w] * ctx.weight_bytes[w] for w in exps)  # bytes
    # the model's copies of such a pass: the streamed experts' share, nothing of their whole size
    c = pm.cost(Placement(frozenset(), 0, {w: 1 for w in exps}))
    assert c.stream_bytes == pytest.approx(sum(share[w] * ctx.weight_bytes[w] for w in exps if pm.streamable[w]),
                                           rel=1e-6)
    llm = oallama.Llama(str(ctx.model.path), devices=[rpc_server.device_name], n_gpu_layers=0, n_ctx=128,
                        n_threads=2, verbose=False, layouts={w: PLAIN for w in ctx.weight_bytes})
    try:
        _core.set_offload_policy(llm.native_context, {w: 1 for w in exps})  # stream them at any batch
        tokens = llm.tokenize(b"The quick brown fox jumps over the lazy dog, again and again")
        llm.eval(tokens[:8])
        sent = []
        for t in tokens[8:12]:
            before = rpc.bytes_acked(rpc_server.port)
            llm.eval([t])  # reads the logits back: the pass is done, its bytes acknowledged
            sent.append(rpc.bytes_acked(rpc_server.port) - before)
    finally:
        llm.close()
    # each pass: the routed experts (+ a few KB of activations, graphs and padding)
    for b in sent:
        assert routed <= b <= routed * 1.2 + 64 * 1024, (b, routed, whole)


def test_streamed_experts_copy_the_recorded_routing(moe_context, rpc_server) -> None:
    # A prompt pass that streams every expert tensor copies the experts its tokens were routed to;
    # how many, the calibration records (the model's routing in one 512-token pass: distinct experts
    # per layer over every window of n consecutive tokens), and the pass model charges that share.
    # Checked against the bytes that really crossed to an rpc-server in 32-token prompt passes.
    from oallama.planner.cost.profile import PLAIN
    from oallama.planner.cost.schedmodel import expert_fraction
    from oallama.runtime.generate import prompt_tokens

    ctx, n = moe_context, 32
    routing = ctx.profile.calibration.routing
    assert routing is not None and routing.n_tokens == 512 and routing.model
    pm = ctx.passes[Ubatch(n)]
    exps = sorted(w for w in ctx.weight_bytes if "_exps." in w)
    predicted = sum(pm.copied_share[w] * ctx.weight_bytes[w] for w in exps)  # what a streamed pass copies
    uniform = sum(expert_fraction(routing.n_expert, routing.n_used, n) * ctx.weight_bytes[w] for w in exps)
    llm = oallama.Llama(str(ctx.model.path), devices=[rpc_server.device_name], n_gpu_layers=0, n_ctx=256, n_batch=n,
                        n_ubatch=n, n_threads=2, verbose=False, layouts={w: PLAIN for w in ctx.weight_bytes})
    try:
        _core.set_offload_policy(llm.native_context, {w: 1 for w in exps})  # stream them at any batch
        tokens = prompt_tokens(llm, 256)
        sent = []
        for start in range(0, 256, 2 * n):  # every other window of the prompt the routing was recorded on
            llm.reset()
            if start:
                llm.eval(tokens[:start])
            before = rpc.bytes_acked(rpc_server.port)
            llm.eval(tokens[start:start + n])
            llm.sample(temp=0.0)  # reads the logits back: the pass is done, its bytes acknowledged
            sent.append(rpc.bytes_acked(rpc_server.port) - before)
    finally:
        llm.close()
    print(f"sent {[round(b / 1e6, 2) for b in sent]} MB, predicted {predicted / 1e6:.2f}, uniform {uniform / 1e6:.2f}")
    assert statistics.median(sent) == pytest.approx(predicted, rel=0.08)


@pytest.mark.parametrize("n_expert,n_used", [(8, 2), (32, 4), (128, 8)])
def test_routing_counts_distinct_experts_per_window(n_expert: int, n_used: int) -> None:
    # `distinct_experts` (cumulative counts) against sets of every window, on a concentrated routing
    from oallama.planner.cost.routing import distinct_experts, window_sizes

    rng = np.random.default_rng(n_expert)
    hot = rng.choice(n_expert, size=max(n_used + 1, n_expert // 4), replace=False)  # a few favourite experts
    ids = np.stack([rng.choice(hot if t % 3 else np.arange(n_expert), size=n_used, replace=False) for t in range(100)])
    sizes = window_sizes(100)
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 100]
    got = distinct_experts(ids, n_expert, sizes)
    for n in sizes:
        want = statistics.fmean(len(set(ids[s:s + n].ravel())) for s in range(100 - n + 1))
        assert got[n] == pytest.approx(want), n
    assert got[1] == n_used


def test_routing_share_and_its_errors() -> None:
    from oallama.errors import ProfileError
    from oallama.planner.cost.routing import Routing

    class R:  # a recorded route as _core.Route gives it
        def __init__(self, name: str, ids: list[list[int]]) -> None:
            self.name, self.ids = name, np.array(ids, dtype=np.int32)

    r = Routing.from_routes([R("ffn_moe_topk-0", [[0, 1], [0, 1], [2, 3], [2, 3]]),
                             R("ffn_moe_topk-1", [[0, 1], [2, 3], [4, 5], [6, 7]])], n_expert=8, model="m")
    assert r.distinct == {0: {1: 2.0, 2: pytest.approx(8 / 3), 4: 4.0}, 1: {1: 2.0, 2: 4.0, 4: 8.0}}  # windows 2, 4, 2
    assert r.share(0, 1) == 2 / 8 and r.share(1, 4) == 1.0 and r.share(0, 400) == 4 / 8  # above: the pass's
    assert r.share(0, 3) == pytest.approx((8 / 3 + (4 - 8 / 3) * np.log(3 / 2) / np.log(2)) / 8)  # linear in log n
    assert r.share(None, 2) == pytest.approx((8 / 3 + 4) / 2 / 8)  # a layer not recorded: the mean
    assert Routing.from_json(r.to_json()) == r
    # a prompt's last layer routes its output token only: no curve of its own (the others' mean)
    last = Routing.from_routes([R("ffn_moe_topk-0", [[0, 1], [0, 1], [2, 3], [2, 3]]), R("ffn_moe_topk-1", [[4, 5]])],
                               n_expert=8)
    assert list(last.distinct) == [0] and last.n_tokens == 4 and last.share(1, 4) == last.share(0, 4) == 0.5
    with pytest.raises(ProfileError, match="expert_count"):
        Routing.from_routes([R("ffn_moe_topk-0", [[0, 9]])], n_expert=8)
    with pytest.raises(ProfileError, match="ffn_moe_topk"):
        Routing.from_routes([R("ffn_out-0", [[0, 1]])], n_expert=8)


def test_a_cached_profile_measures_another_models_routing(moe_context, synth_model, rpc_server) -> None:
    # The profile is cached by shapes; routing depends on the weights: a model of the same shapes
    # (another seed) reuses the cached timings but gets its own routing, measured again.
    from oallama.planner.cost.routing import fingerprint

    ctx = moe_context
    other = synth_model("qwen3moe-small", "q4_k_m", seed=7)
    prof = profile_model(other, ["CPU", rpc_server.device_name], threads=2, progress=False,
                         server_threads=ctx.profile.settings.server_threads)
    assert prof.key == ctx.profile.key  # the cached profile
    mine, theirs = ctx.profile.calibration.routing, prof.calibration.routing
    assert mine.model == fingerprint(ctx.model.path) != theirs.model == fingerprint(other)
    assert theirs.distinct != mine.distinct
