"""Plans for the attention people run llama.cpp with: flash attention (on, off, auto) and quantized
KV caches. The planner's graphs and bytes against llama.cpp's own loads, a plan's settings carried
into oallama's load and pinned in the stock llama-server command (its log read back)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from helpers import assert_memory_as_planned, planned_context, stock_context, stock_server
from oallama import Llama, PlanError, _core
from oallama.planner.context import Workload, build_context
from oallama.planner.cost.measure import profile_model
from oallama.planner.graph import attention_layers
from oallama.planner.plan import make_plan
from oallama.planner.workload import Ubatch
from oallama.runtime import kvcache, rpc
from oallama.serve.app import build_app
from oallama.serve.options import ServeOptions

N_CTX = 2048  # tokens: the KV cache is most of the context's bytes


@pytest.fixture(scope="module")
def tiny(synth_model) -> Path:
    return synth_model("tiny", "f16", n_layer=2)


def _context(path: Path, acc: str | None, fa: str, ctk: str, ctv: str, n_ctx: int = N_CTX) -> Any:
    """A planning context of a workload with this attention, costed from a one-op profile (no
    calibration: these tests check graphs, bytes and settings, not times)."""
    wl = Workload(prompt=40, gen=8, n_ubatch=64, context=n_ctx, flash_attn=fa, cache_type_k=ctk, cache_type_v=ctv)
    devices = ["CPU", acc] if acc else ["CPU"]
    prof = profile_model(path, devices, threads=1, repeats=2, progress=False, calibrated=False, n_ctx=n_ctx)
    return build_context(path, acc, wl, profile=prof, threads=1, progress=False)


@pytest.mark.parametrize(("fields", "message"), [
    ({"flash_attn": "maybe"}, r"--flash-attn 'maybe'"),
    ({"cache_type_k": "q3_K"}, r"--cache-type-k 'q3_K'"),
    ({"cache_type_v": "q8_0"}, r"--cache-type-v q8_0 needs flash attention"),
    ({"flash_attn": "off", "cache_type_v": "q4_0"}, r"--cache-type-v q4_0 needs flash attention"),
], ids=["fa-maybe", "ctk-q3_K", "ctv-q8_0-fa-off", "ctv-q4_0-fa-off"])
def test_a_workload_refuses_what_llama_cpp_refuses(fields: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Workload(prompt=8, gen=8, **fields)


@pytest.mark.parametrize(("fa", "ctk", "ctv"), [("off", "f16", "f16"), ("on", "f16", "f16"), ("on", "q8_0", "q8_0"),
                                                ("auto", "q8_0", "q4_0")],
                         ids=["fa-off-f16", "fa-on-f16", "fa-on-q8_0", "fa-auto-q8_0-q4_0"])
def test_the_graphs_and_kv_cache_are_the_loads(fa: str, ctk: str, ctv: str, tiny: Path) -> None:
    """The planner's graphs carry flash attention where the workload asks for it (auto: the CPU
    runs it), and its KV cache bytes are a real load's with the same settings, per layer type."""
    ctx = _context(tiny, None, fa, ctk, ctv)
    on = fa != "off"
    assert ctx.attention() == {"flash_attn": on, "type_k": ctk, "type_v": ctv}
    for pm in ctx.passes.values():
        ops = {n.op for n in pm.graph.nodes}
        assert ("FLASH_ATTN_EXT" in ops) == on and ("SOFT_MAX" in ops) != on
    with contextlib.closing(Llama(str(tiny), n_ctx=N_CTX, n_ubatch=64, n_batch=64, n_threads=1, verbose=False,
                                  **kvcache.llama_kwargs(on, ctk, ctv))) as llm:
        loaded = sum(int(m.context) for m in _core.memory(llm.native_context) if m.device == "CPU")
    assert sum(ctx.kv_bytes.values()) == loaded


@pytest.fixture(scope="module")
def own_server() -> Any:
    with rpc.start_server(threads=1) as server:
        yield server


@pytest.mark.parametrize(("fa", "ctk", "ctv", "n_ctx"), [("on", "q8_0", "q8_0", N_CTX), ("auto", "q8_0", "f16", N_CTX),
                                                         ("on", "q4_0", "q4_0", 32768)],
                         ids=["fa-on-q8_0-ctx2048", "fa-auto-q8_0-f16-ctx2048", "fa-on-q4_0-ctx32768"])
def test_a_plans_attention_is_what_oallama_and_the_stock_server_load(fa: str, ctk: str, ctv: str, n_ctx: int,
                                                                    tiny: Path, own_server: rpc.RpcServer,
                                                                    tmp_path: Path) -> None:
    """A plan records its resolved attention; oallama's load of the plan file takes it (and refuses
    a conflicting keyword), reserving the plan's bytes on the rpc-server; the emitted stock command
    pins it, and llama-server's log shows that context and those bytes. Auto is resolved as
    llama-server itself resolves it for the plan's placement."""
    ctx = _context(tiny, own_server.device_name, fa, ctk, ctv, n_ctx)
    plan = make_plan(ctx, "layers", "256MiB")  # every layer and its cache
    assert plan.settings["flash_attn"] is True and (plan.settings["type_k"], plan.settings["type_v"]) == (ctk, ctv)
    assert plan.workload.flash_attn == fa  # what was asked, beside what it resolved to
    path = str(plan.save(tmp_path / "plan.json"))
    kw: dict[str, Any] = {"n_ctx": n_ctx, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "verbose": False}
    with contextlib.closing(Llama(str(tiny), placement=path, **kw)) as llm:
        assert llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert (llm.context_params.type_k, llm.context_params.type_v) == (kvcache.ggml_type_id(ctk),
                                                                          kvcache.ggml_type_id(ctv))
        rows = [m for m in _core.memory(llm.native_context) if m.device == own_server.device_name]
        got = {k: sum(int(getattr(m, k)) for m in rows) for k in ("model", "context", "compute")}
    assert got["context"] > 0 and got == {k: plan.memory[k] for k in got}
    with pytest.raises(PlanError, match=r"flash_attn=False conflicts with the plan's flash_attn=True"):
        Llama(str(tiny), placement=path, flash_attn=False, **kw)
    # oallama serve takes it too: llama_cpp.server's own defaults (flash attention off) do not overrule it
    served = build_app(ServeOptions(tiny, placement=path, ctx=n_ctx, threads=1))
    try:
        assert served.llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert served.llm.context_params.type_v == kvcache.ggml_type_id(ctv)
    finally:
        served.close()
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as other:  # a fresh rpc-server: one serves one client at a time
        args = [a.replace(own_server.endpoint, other.endpoint) for a in plan.stock_command()[1:]]
        if fa == "auto":  # llama-server resolving auto itself, for the plan's placement
            args[args.index("-fa") + 1] = "auto"
        with stock_server([*args, "-v"], log):
            pass
    text = log.read_text(errors="replace")
    want = planned_context(plan)
    if fa == "auto":
        assert re.search(r"Flash Attention enabled", text), "llama-server resolved auto to off"
        want["flash_attn"] = "auto"
    assert stock_context(text) == want
    assert_memory_as_planned(plan, text, "RPC0")


def test_a_sliding_window_models_cache_is_what_the_stock_server_reserves(gemma3_270m: Path,
                                                                        own_server: rpc.RpcServer,
                                                                        tmp_path: Path) -> None:
    """Gemma 3 (five of six layers attend over a 512-token window) at a 2048-token context with
    flash attention and a q8_0 cache, every layer on the rpc-server: the emitted command's stock
    llama-server reserves the plan's weights, KV cache and compute buffers there. Its own default
    would cut the window layers' cache to the window; the command pins --swa-full, as planned."""
    ctx = _context(gemma3_270m, own_server.device_name, "on", "q8_0", "q8_0")
    plan = make_plan(ctx, "layers", "100%")
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as other:
        args = [a.replace(own_server.endpoint, other.endpoint) for a in plan.stock_command()[1:]]
        with stock_server([*args, "-v"], log):
            pass
    text = log.read_text(errors="replace")
    assert stock_context(text) == planned_context(plan)
    assert plan.memory["context"] > 0
    assert_memory_as_planned(plan, text, "RPC0")


@pytest.mark.parametrize(("preset", "qtype", "window", "global_layers"), [
    ("gpt-oss-small", "mxfp4_moe", 128, {1, 3}), ("tiny", "q8_0", 0, {0, 1, 2, 3})], ids=["gpt-oss-small", "tiny"])
def test_window_layers_are_read_from_llama_cpp(preset: str, qtype: str, window: int, global_layers: set[int],
                                               synth_model) -> None:
    """gpt-oss attends over a 128-token window in every other layer (llama.cpp's pattern: the file
    says only the window); a model without windows has none."""
    layers = attention_layers(synth_model(preset, qtype))
    assert set(layers.order) - set(layers.window) == global_layers
    assert set(layers.window.values()) <= {window}


def test_a_window_layers_flash_attention_costs_its_window(synth_model) -> None:
    """Decode with flash attention after a 1000- and a 4000-token prompt, costed from one calibration
    measured with it: a window layer's attention node costs the same at both (ggml skips the cells
    its mask hides: it reads its 128), a global layer's grows with the cells before the token."""
    path = synth_model("gpt-oss-small", "mxfp4_moe")
    prof = profile_model(path, ["CPU"], threads=1, repeats=2, progress=False, n_ctx=1024, flash_attn=True)
    costs = []
    for prompt in (1000, 4000):
        wl = Workload(prompt=prompt, gen=8, n_ubatch=512, flash_attn="on")
        pm = build_context(path, None, wl, profile=prof, threads=1, progress=False).passes[Ubatch(1)]
        fa = [i for i in pm.order if pm.graph.nodes[i].op == "FLASH_ATTN_EXT"]
        costs.append({pm.kv_layer(pm.graph.nodes[i].srcs[1]): pm.t_host[i] for i in fa})
    short, long = costs
    assert set(short) == {0, 1, 2, 3}
    for layer in (0, 2):
        assert long[layer] == pytest.approx(short[layer])
    for layer in (1, 3):
        assert long[layer] > 2 * short[layer]
