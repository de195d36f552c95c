"""The whole flow on a GPU-class backend: ggml's Vulkan backend, here on Mesa's software GPU.

Vulkan has what RPC lacks — a pinned host buffer type, `offload_op`, ops it does not support and
its own device memory report — so these tests run the planner's and the placer's GPU branches.
Timings on the software GPU say nothing about GPU speed; the tests check behaviour only.

ggml-vulkan only lists CPU-type Vulkan devices (lavapipe) that GGML_VK_VISIBLE_DEVICES names, and
reads it once per process: scripts/test.sh runs this file in its own pytest process with it set
(`-m vulkan`), and every other test sees no Vulkan device.
"""

from __future__ import annotations

import random
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    assert_memory_as_planned,
    greedy_tokens,
    planned_context,
    post_json,
    sched_model_mismatches,
    stock_context,
    stock_placement,
    stock_server,
)
from oallama import Llama, _core
from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.schedmodel import HOST
from oallama.planner.graph import GraphSession
from oallama.planner.plan import STRATEGIES, Workload, build_context, make_plan
from oallama.runtime import devices
from oallama.runtime.place import compile_patterns

pytestmark = pytest.mark.vulkan


def _vulkan_device() -> devices.Device | None:
    return next((d for d in devices.list_devices() if d.backend == "Vulkan"), None)


@pytest.fixture(scope="module")
def vk() -> str:
    if not _core.have_vulkan:
        pytest.skip("built without Vulkan (OALLAMA_VULKAN=ON bash scripts/setup.sh)")
    dev = _vulkan_device()
    if dev is None:
        pytest.skip("no Vulkan device visible (set GGML_VK_VISIBLE_DEVICES=0 for Mesa's software GPU)")
    return dev.name


@pytest.fixture(scope="module")
def tiny_f16(synth_model) -> Path:
    return synth_model("tiny", "f16", n_layer=2)


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a - b) ** 2).sum() / (b**2).sum())


PROMPT = b"Once upon a time, in a land far away, there lived" * 2


@pytest.fixture(scope="module")
def cpu_reference(tiny_f16: Path):
    # devices=["CPU"]: no Vulkan device in the load at all, weights in plain host memory
    llm = Llama(str(tiny_f16), devices=["CPU"], n_ctx=256, n_ubatch=64, n_threads=1, verbose=False, logits_all=True)
    prompt = llm.tokenize(PROMPT)
    llm.eval(prompt)
    ref = np.array(llm.scores[: len(prompt)])
    text = llm(llm.detokenize(prompt).decode(), max_tokens=12, temperature=0)["choices"][0]["text"]
    llm.close()
    return prompt, ref, text


def test_vulkan_device_is_listed_with_its_memory(vk: str) -> None:
    dev = devices.resolve(vk)
    assert dev.kind in ("gpu", "igpu") and not dev.is_host
    assert dev.memory_total > 0 and 0 < dev.memory_free <= dev.memory_total


def test_hand_placement_reads_back_and_matches_cpu(vk: str, tiny_f16: Path, cpu_reference) -> None:
    prompt, ref, text = cpu_reference
    llm0 = Llama(str(tiny_f16), devices=["CPU"], n_ctx=256, verbose=False)
    names = [t.name for t in llm0.tensor_placements() if len(t.shape) > 1]
    llm0.close()
    rng = random.Random(7)
    placement = {n: vk for n in names if rng.random() < 0.5}
    llm = Llama(str(tiny_f16), devices=["CPU", vk], placement=placement, n_ctx=256, n_ubatch=64, n_threads=1,
                verbose=False, logits_all=True)
    got = llm.tensor_devices()
    assert {n for n, d in got.items() if d == vk} == set(placement)
    llm.eval(prompt)
    assert _nmse(np.array(llm.scores[: len(prompt)]), ref) < 1e-4
    llm.reset()
    assert llm(llm.detokenize(prompt).decode(), max_tokens=12, temperature=0)["choices"][0]["text"] == text
    llm.close()


@pytest.mark.parametrize("passes", [1, 2])
def test_host_weights_offloaded_by_op_offload_match_cpu(vk: str, tiny_f16: Path, passes: int) -> None:
    """Every weight on the host, op offload on: the prompt's ops go to Vulkan0 with their weights
    copied per split, in the context the runtime reserved once more after creating it (and the
    second prompt pass reuses that state)."""
    kw = {"n_ctx": 256, "n_ubatch": 64, "n_threads": 1, "verbose": False, "logits_all": True}
    with closing(Llama(str(tiny_f16), devices=["CPU"], **kw)) as cpu:
        prompt = cpu.tokenize(PROMPT * 2)
        assert len(prompt) >= 32  # ggml-vulkan offloads an op from 32 rows
        cpu.eval(prompt)
        ref = np.array(cpu.scores[: len(prompt)])
    with closing(Llama(str(tiny_f16), devices=["CPU", vk], n_gpu_layers=0, **kw)) as llm:
        assert set(llm.tensor_devices().values()) == {"CPU"}
        for _ in range(passes):
            llm.reset()
            with _core.NodeTimer(llm.native_context) as timer:
                llm.eval(prompt)
                ran_on = {r.device for r in timer.times()}
            assert vk in ran_on
            assert _nmse(np.array(llm.scores[: len(prompt)]), ref) < 1e-4


def test_pinned_host_weights_count_as_host_memory(vk: str, tiny_f16: Path) -> None:
    # with a GPU-class device in the load, llama.cpp keeps host weights in that device's pinned
    # host buffer type: host memory, which the readback and the memory accounting give the CPU
    llm = Llama(str(tiny_f16), devices=["CPU", vk], placement={"output.weight": vk}, n_ctx=256, verbose=False)
    host = [t for t in llm.tensor_placements() if t.name != "output.weight"]
    pinned = [t for t in host if t.buffer_type != "CPU" and t.is_host]
    assert pinned, "expected host weights in the Vulkan device's pinned host buffer type"
    assert {t.device for t in host} == {"CPU"}
    assert llm.tensor_devices()["output.weight"] == vk
    weights_on_vk = sum(t.nbytes for t in llm.tensor_placements() if t.device == vk)
    llm.close()
    with GraphSession(tiny_f16, devices=[vk], n_ctx=256, n_ubatch=64,
                      overrides=compile_patterns({"output.weight": vk})) as s:
        mem = s.memory()
    by_dev: dict[str, int] = {}
    for m in mem:
        by_dev[m.device] = by_dev.get(m.device, 0) + m.model  # bytes of weights
    assert by_dev.get(vk, 0) == weights_on_vk


@pytest.mark.parametrize("n_tokens", [1, 40])
def test_sched_model_matches_the_real_scheduler_on_vulkan(vk: str, synth_model, n_tokens: int) -> None:
    # Vulkan has its own offload_op: host weights are streamed at its default threshold when no
    # policy names them, and at per-weight thresholds (patch 0001) when one does
    assert not sched_model_mismatches(synth_model("tiny", "q4_k_m", n_layer=2), vk, n_tokens, f"vulkan-{n_tokens}")


WORKLOAD = Workload(prompt=40, gen=8, objective="e2e", n_ubatch=64)


@pytest.fixture(scope="module")
def vk_ctx(vk: str, tiny_f16: Path):
    prof = profile_model(tiny_f16, [HOST, vk], threads=1, repeats=2, progress=False)
    return build_context(tiny_f16, vk, WORKLOAD, profile=prof, threads=1, progress=False)


def test_cpu_ops_are_profiled_in_the_pinned_host_memory_a_load_uses(vk: str, vk_ctx) -> None:
    # llama.cpp's loader puts host weights in the GPU-class device's pinned host buffer type ahead
    # of the repacked layouts: the profile must time the CPU's ops there, not in CPU_REPACK
    pinned = devices.resolve(vk).host_buffer_type
    assert pinned
    assert {s["buffer_type"] for s in vk_ctx.profile.ops[HOST].values()} == {pinned}
    assert {s["buffer_type"] for s in vk_ctx.profile.ops[vk].values()} == {devices.resolve(vk).buffer_type}


@pytest.mark.parametrize("strategy", [*STRATEGIES, "fit", "flexgen"])
def test_flow_on_vulkan_matches_cpu(strategy: str, vk: str, tiny_f16: Path, vk_ctx, cpu_reference) -> None:
    prompt, ref, text = cpu_reference
    plan = make_plan(vk_ctx, strategy, "60%")
    assert plan.memory["total"] <= int(0.6 * vk_ctx.model.weight_bytes) + 1
    llm = Llama(str(tiny_f16), gpu_budget="60%", placement=strategy, device=vk, workload=WORKLOAD,
                profile=vk_ctx.profile, n_ctx=256, n_ubatch=64, n_threads=1, verbose=False, logits_all=True)
    assert llm.plan is not None
    on_acc = {w for w, d in llm.plan["placement"].items() if d == vk}
    assert {w for w, d in llm.tensor_devices().items() if d == vk} == on_acc
    llm.eval(prompt)
    assert _nmse(np.array(llm.scores[: len(prompt)]), ref) < 1e-4
    llm.reset()
    assert llm(llm.detokenize(prompt).decode(), max_tokens=12, temperature=0)["choices"][0]["text"] == text
    llm.close()


@pytest.mark.parametrize("strategy", ["layers", "optimal"])
def test_emitted_stock_command_places_as_planned_on_vulkan(strategy: str, vk: str, tiny_f16: Path, vk_ctx,
                                                          tmp_path: Path) -> None:
    """`oallama plan --emit-ot`'s command for a GPU-class device on oallama's stock llama-server:
    the weights go where the plan says (the server's own load log) and, where the plan streams no
    host weight (stock has no per-weight thresholds), the greedy completion equals oallama's."""
    from contextlib import closing

    plan = make_plan(vk_ctx, strategy, "60%")
    cmd = plan.stock_command()
    assert cmd[:3] == ["llama-server", "-m", str(tiny_f16)] and cmd[cmd.index("--device") + 1] == vk
    on_acc = {w for w, d in plan.assignment().items() if d == vk}
    prompt, n = "Once upon a time, in a land far away, there lived", 12
    with closing(Llama(str(tiny_f16), placement=str(plan.save(tmp_path / "plan.json")), n_ctx=256, n_batch=64,
                       n_ubatch=64, n_threads=1, flash_attn=False, verbose=False)) as llm:
        assert {w for w, d in llm.tensor_devices().items() if d == vk} == on_acc
        want = greedy_tokens(llm, prompt, n)
    log = tmp_path / "llama-server.log"
    with stock_server([*cmd[1:], "-v"], log) as url:  # the command as emitted: it pins every setting
        out = post_json(url + "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0,
                                              "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True})
    text = log.read_text(errors="replace")
    placed = stock_placement(text, list(plan.assignment()), vk_ctx.n_layer)
    assert {w for w, d in placed.items() if d.startswith(vk)} == on_acc
    assert stock_context(text) == planned_context(plan)
    assert_memory_as_planned(plan, text, vk)
    if not any(b <= len(prompt) for b in plan.offload_policy().values()):  # the same ops on the same devices
        assert out["tokens"] == want


@pytest.mark.parametrize(("fa", "ctk", "ctv"), [("auto", "f16", "f16"), ("on", "q8_0", "q8_0")],
                         ids=["fa-auto-f16", "fa-on-q8_0"])
def test_a_long_context_plans_attention_is_the_stock_servers_on_vulkan(fa: str, ctk: str, ctv: str, vk: str,
                                                                      tiny_f16: Path, tmp_path: Path) -> None:
    """A 2048-token context with every layer on Vulkan0: flash attention `auto` resolves as the
    stock llama-server resolves it for that placement (its log), and the emitted command, which
    pins the result and the KV cache's types, reserves the plan's bytes on Vulkan0."""
    wl = Workload(prompt=40, gen=8, n_ubatch=64, context=2048, flash_attn=fa, cache_type_k=ctk, cache_type_v=ctv)
    # one-op times only (no calibration): they do not depend on the attention
    prof = profile_model(tiny_f16, [HOST, vk], threads=1, repeats=2, progress=False, calibrated=False, n_ctx=2048)
    ctx = build_context(tiny_f16, vk, wl, profile=prof, threads=1, progress=False)
    plan = make_plan(ctx, "layers", "100%")
    cmd = plan.stock_command()
    if fa == "auto":  # the stock server resolving auto for the same placement
        args = list(cmd[1:])
        args[args.index("-fa") + 1] = "auto"
        log = tmp_path / "auto.log"
        with stock_server([*args, "-v"], log):
            pass
        on = "Flash Attention enabled" in log.read_text(errors="replace")
        assert plan.settings["flash_attn"] is on
    log = tmp_path / "llama-server.log"
    with stock_server([*cmd[1:], "-v"], log):
        pass
    text = log.read_text(errors="replace")
    assert stock_context(text) == planned_context(plan)
    assert plan.memory["context"] > 0
    assert_memory_as_planned(plan, text, vk)


def test_calibration_times_the_real_graph_on_vulkan(vk: str, tiny_f16: Path, vk_ctx) -> None:
    """The node timer on a GPU-class backend: every scheduled node is timed, on Vulkan0 where the
    scheduler put it (Vulkan reorders nodes within its splits: compared as sets), and the
    calibration fits Vulkan0's ops next to the CPU's."""
    from contextlib import closing

    from oallama.planner.graph import Graph
    from oallama.runtime.generate import prompt_tokens

    with closing(Llama(str(tiny_f16), devices=["CPU", vk], n_gpu_layers=99, n_ctx=256, n_batch=8, n_ubatch=8,
                       n_threads=1, verbose=False)) as llm:
        toks = prompt_tokens(llm, 8)
        with _core.NodeTimer(llm.native_context) as timer:
            llm.eval(toks)
            llm.reset()
            timer.reset([])
            llm.eval(toks)
            nodes = timer.times()
        graph = Graph(8, _core.graph(llm.native_context, 8))
    assert sorted((r.name, r.op) for r in nodes) == sorted((n.name, n.op) for n in graph.nodes)
    sched = {(n.name, n.op): n.backend for n in graph.nodes if not n.is_view}
    assert {r.device for r in nodes if (r.name, r.op) in sched} == {"CPU", vk}
    assert all(sched[(r.name, r.op)] == r.device for r in nodes if (r.name, r.op) in sched)
    cal = vk_ctx.profile.calibration
    assert cal is not None and vk in cal.devices and cal.devices[vk].n_matmuls > 0


def test_a_weight_the_loader_keeps_off_the_device_is_planned_on_the_host(vk: str, synth_model) -> None:
    # lavapipe cannot run the 151936-row output matmul at the size llama.cpp's loader tests a weight
    # with, so -ngl <all> leaves output.weight on the host; the planner's model of -ngl must too
    # (it once costed that matmul on the device: a decode pass predicted 18x too slow)
    from oallama.planner.context import loader_kept

    path = synth_model("qwen3moe-small", "q4_k_m", n_layer=1)
    with GraphSession(path, devices=[vk], n_gpu_layers=2, n_ctx=256, n_ubatch=32) as s:
        kept = loader_kept(s, vk, 1)
    assert kept == {"output.weight"}
    with closing(Llama(str(path), devices=[vk], n_gpu_layers=2, n_ctx=256, verbose=False)) as llm:
        got = llm.tensor_devices()
    assert got["output.weight"] == HOST and got["blk.0.ffn_up_exps.weight"] == vk
