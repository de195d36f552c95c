"""Plans for several sequences decoded together (llama.cpp's -np, llama-server's slots): the
workload's context as llama.cpp sizes it, graphs whose decode pass carries one token of each
sequence over its own KV stream, bytes against real loads and the stock llama-server's log, and
the runtime's timed decode of several sequences against its one-sequence generation."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from helpers import assert_memory_as_planned, planned_context, stock_context, stock_server
from oallama import Llama, PlanError, _core
from oallama.planner.context import Workload, build_context
from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.schedmodel import Placement
from oallama.planner.plan import make_plan
from oallama.planner.workload import Ubatch
from oallama.runtime import rpc
from oallama.runtime.generate import SeqBatch, prompt_tokens, timed_generate, timed_parallel


@pytest.fixture(scope="module")
def tiny(synth_model) -> Path:
    return synth_model("tiny", "f16", n_layer=2)


def _context(path: Path, acc: str | None, parallel: int, fa: str = "off", context: int | None = None,
             unified: bool = False, prompt: int = 40) -> Any:
    """A planning context costed from a one-op profile (these tests check graphs, bytes and
    settings, not times)."""
    wl = Workload(prompt=prompt, gen=8, n_ubatch=64, parallel=parallel, flash_attn=fa, context=context,
                  kv_unified=unified)
    devices = ["CPU", acc] if acc else ["CPU"]
    prof = profile_model(path, devices, threads=1, repeats=2, progress=False, calibrated=False, n_ctx=wl.n_ctx)
    return build_context(path, acc, wl, profile=prof, threads=1, progress=False)


@pytest.mark.parametrize(("fields", "message"), [
    ({"parallel": 0}, r"--parallel 0: llama.cpp holds 1 to 256"),
    ({"parallel": 300}, r"--parallel 300: llama.cpp holds 1 to 256"),
    ({"parallel": 4, "context": 1024}, r"--ctx 1024: .* need 300 tokens of context in each of 4 sequences \(256 cells"),
    ({"parallel": 4, "context": 1024, "kv_unified": True}, r"--ctx 1024: the workload's 4 sequences need 1200 cells "
     r"of the unified KV cache \(1024\)"),
], ids=["np0", "np300", "np4-ctx1024", "np4-ctx1024-unified"])
def test_a_workload_refuses_what_llama_cpp_cannot_hold(fields: dict[str, int], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Workload(prompt=200, gen=100, **fields)


@pytest.mark.parametrize(("parallel", "context", "unified"),
                         [(1, 1000, False), (3, 1000, False), (4, None, False), (5, 3000, False), (3, 1000, True),
                          (5, 3000, True)],
                         ids=["np1-ctx1000", "np3-ctx1000", "np4-default", "np5-ctx3000", "np3-ctx1000-unified",
                              "np5-ctx3000-unified"])
def test_the_context_is_sized_as_llama_cpp_sizes_it(parallel: int, context: int | None, unified: bool,
                                                    tiny: Path) -> None:
    """The workload's n_ctx and per-sequence cells are what llama.cpp makes of -c and -np (each
    stream padded to 256 cells; one unified stream padded as a whole), read from a real load."""
    wl = Workload(prompt=40, gen=8, parallel=parallel, context=context, kv_unified=unified)
    with contextlib.closing(Llama(str(tiny), n_ctx=wl.n_ctx if context is None else context, n_threads=1,
                                  verbose=False, n_seq_max=parallel, kv_unified=unified)) as llm:
        assert (llama_cpp.llama_n_ctx(llm.ctx), llama_cpp.llama_n_ctx_seq(llm.ctx)) == (wl.n_ctx, wl.n_ctx_seq)
        assert llama_cpp.llama_n_seq_max(llm.ctx) == parallel


@pytest.mark.parametrize("fa", ["off", "on"])
def test_a_decode_pass_carries_one_token_of_each_sequence_over_its_stream(fa: str, tiny: Path) -> None:
    """With 4 sequences the decode pass is a 4-token graph whose attention runs per stream (4
    streams of one query row each), the prompt's passes one stream; the KV cache's bytes are a
    real load's with the same sequences."""
    ctx = _context(tiny, None, 4, fa)
    assert ctx.workload.decode == 4 and set(ctx.workload.pass_weights()) == {Ubatch(40), Ubatch(4, 4)}
    att = "FLASH_ATTN_EXT" if fa == "on" else "SOFT_MAX"

    def att_shape(u: Ubatch) -> tuple[int, ...]:
        return next(tuple(nd.ne) for nd in ctx.passes[u].graph.nodes if nd.op == att)

    # flash attention's result [Dv, n_head, rows, streams]; soft_max's scores [n_kv, rows, n_head, streams]
    rows = 2 if fa == "on" else 1
    dec, prompt = att_shape(Ubatch(4, 4)), att_shape(Ubatch(40))
    assert (dec[rows], dec[3]) == (1, 4) and (prompt[rows], prompt[3]) == (40, 1)
    with contextlib.closing(Llama(str(tiny), n_ctx=ctx.workload.n_ctx, n_ubatch=64, n_batch=64, n_threads=1,
                                  verbose=False, flash_attn=fa == "on", n_seq_max=4, kv_unified=False)) as llm:
        loaded = sum(int(m.context) for m in _core.memory(llm.native_context) if m.device == "CPU")
    assert sum(ctx.kv_bytes.values()) == loaded


@pytest.mark.parametrize("fa", ["off", "on"])
def test_a_prompt_ubatch_of_as_many_tokens_as_sequences_is_not_the_decode_pass(fa: str, tiny: Path) -> None:
    """Prompt 68 in ubatches of 64 with 4 sequences: the prompt's last ubatch (4 tokens of one
    sequence, one row of logits) and the decode pass (one token of each of 4 sequences, a row each)
    are both 4-token graphs; each has its own, and TTFT is costed on the prompt's."""
    ctx = _context(tiny, None, 4, fa, prompt=68)
    last, dec = Ubatch(4), Ubatch(4, 4)
    assert ctx.workload.pass_weights() == {Ubatch(64): 4.0, last: 4.0, dec: 7.0}
    att = "FLASH_ATTN_EXT" if fa == "on" else "SOFT_MAX"

    def shapes(u: Ubatch) -> tuple[tuple[int, ...], int]:
        """(the attention node's shape, the output matmul's columns) of the pass."""
        nodes = ctx.passes[u].graph.nodes
        out = next(nd.ne[1] for nd in nodes if nd.op == "MUL_MAT" and nd.weight in ("output.weight",
                                                                                     "token_embd.weight"))
        return next(tuple(nd.ne) for nd in nodes if nd.op == att), out

    (a_last, out_last), (a_dec, out_dec) = shapes(last), shapes(dec)
    rows = 2 if fa == "on" else 1  # flash attention's [Dv, n_head, rows, streams]; soft_max's [n_kv, rows, n_head, streams]
    assert (a_last[rows], a_last[3], out_last) == (4, 1, 1) and (a_dec[rows], a_dec[3], out_dec) == (1, 4, 4)
    p = Placement()
    pred = ctx.predict(p)
    assert pred["ttft_ms"] * 1e3 == pytest.approx(sum(ctx.passes[u].cost(p).total_us for u in (Ubatch(64), last)))
    assert pred["tpot_ms"] * 1e3 == pytest.approx(ctx.passes[dec].cost(p).total_us)
    assert set(pred["passes"]) == {"64", "4", "4x1", "1"} and Ubatch.parse("4x1") == dec


@pytest.mark.parametrize("fa", ["off", "on"])
def test_sequences_in_one_unified_stream_attend_over_every_sequence_s_cells(fa: str, tiny: Path) -> None:
    """With a unified KV cache the decode pass of 4 sequences after 100 tokens each is one stream of
    4 query rows over the cells of all four (400 used: 512, where a stream of its own would span 256),
    as a real decode's nodes show; the KV cache's bytes are a real unified load's."""
    ctx = _context(tiny, None, 4, fa, unified=True, prompt=100)
    att = "FLASH_ATTN_EXT" if fa == "on" else "SOFT_MAX"
    dec = next(tuple(nd.ne) for nd in ctx.passes[Ubatch(4, 4)].graph.nodes if nd.op == att)
    # flash attention's result [Dv, n_head, rows, streams]; soft_max's scores [n_kv, rows, n_head, streams]
    assert (dec[2 if fa == "on" else 1], dec[3]) == (4, 1)
    assert ctx.workload.pass_kv()[Ubatch(4, 4)] == 512
    assert _context(tiny, None, 4, fa, prompt=100).workload.pass_kv()[Ubatch(4, 4)] == 256
    with contextlib.closing(Llama(str(tiny), n_ctx=ctx.workload.n_ctx, n_ubatch=128, n_batch=128, n_threads=1,
                                  verbose=False, flash_attn=fa == "on", n_seq_max=4, kv_unified=True)) as llm:
        loaded = sum(int(m.context) for m in _core.memory(llm.native_context) if m.device == "CPU")
        toks = prompt_tokens(llm, 100)
        with contextlib.closing(SeqBatch(128)) as b:
            for s in range(4):
                b.decode(llm, [(t, i, s, i == 99) for i, t in enumerate(toks)])
            with _core.NodeTimer(llm.native_context) as timer:
                b.decode(llm, [(toks[0], 100, s, True) for s in range(4)])
                kq = [r.ne for r in timer.times() if r.op == "SOFT_MAX"]
                fa_kv = [r.src_ne[1][1] for r in timer.times() if r.op == "FLASH_ATTN_EXT"]
    assert (kq[0][0] if kq else fa_kv[0]) == 512  # the cells the real pass spans
    assert sum(ctx.kv_bytes.values()) == loaded


def test_sequences_decoded_together_generate_what_one_does(tiny: Path) -> None:
    """timed_parallel's sequences of one prompt each generate the one-sequence greedy tokens."""
    with contextlib.closing(Llama(str(tiny), n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=1, verbose=False,
                                  n_seq_max=4, kv_unified=False)) as llm:
        toks = prompt_tokens(llm, 40)
        g = timed_parallel(llm, toks, 4, 8)
        alone = timed_generate(llm, toks, 8).tokens
    assert g.tokens == [alone] * 4 and len(g.pass_s) == 7 and len(g.prompt_s) == 4
    with contextlib.closing(Llama(str(tiny), n_ctx=256, n_threads=1, verbose=False)) as llm, \
            pytest.raises(Exception, match=r"4 sequences: the context holds 1 \(load with n_seq_max=\)"):
        timed_parallel(llm, prompt_tokens(llm, 8), 4, 2)


@pytest.fixture(scope="module")
def own_server() -> Any:
    with rpc.start_server(threads=1) as server:
        yield server


@pytest.mark.parametrize(("parallel", "fa", "unified"), [(4, "on", False), (3, "off", False), (4, "off", True)],
                         ids=["np4-fa-on", "np3-fa-off", "np4-unified"])
def test_a_plan_for_several_sequences_is_what_oallama_and_the_stock_server_load(parallel: int, fa: str, unified: bool,
                                                                               tiny: Path, own_server: rpc.RpcServer,
                                                                               tmp_path: Path) -> None:
    """Every layer on the rpc-server: oallama's load of the plan holds the plan's sequences and
    bytes there (and refuses another n_seq_max); the emitted command pins -np and a KV stream per
    sequence (or one for all), and llama-server's log shows that context and the plan's bytes."""
    ctx = _context(tiny, own_server.device_name, parallel, fa, unified=unified)
    plan = make_plan(ctx, "layers", "256MiB")
    assert plan.settings["n_seq_max"] == parallel and plan.settings["kv_unified"] is unified
    path = str(plan.save(tmp_path / "plan.json"))
    kw: dict[str, Any] = {"n_ctx": ctx.workload.n_ctx, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, "verbose": False}
    with contextlib.closing(Llama(str(tiny), placement=path, **kw)) as llm:
        assert llama_cpp.llama_n_seq_max(llm.ctx) == parallel
        rows = [m for m in _core.memory(llm.native_context) if m.device == own_server.device_name]
        got = {k: sum(int(getattr(m, k)) for m in rows) for k in ("model", "context", "compute")}
    assert got["context"] > 0 and got == {k: plan.memory[k] for k in got}
    with pytest.raises(PlanError, match=rf"n_seq_max=1 conflicts with the plan's n_seq_max={parallel}"):
        Llama(str(tiny), placement=path, n_seq_max=1, **kw)
    cmd = plan.stock_command()
    assert cmd[cmd.index("-np") + 1] == str(parallel) and ("--kv-unified" if unified else "--no-kv-unified") in cmd
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as other:  # a fresh rpc-server: one serves one client at a time
        args = [a.replace(own_server.endpoint, other.endpoint) for a in cmd[1:]]
        with stock_server([*args, "-v"], log):
            pass
    text = log.read_text(errors="replace")
    assert stock_context(text) == planned_context(plan)
    assert_memory_as_planned(plan, text, "RPC0")


def test_a_confirmation_measures_the_sequences_together(tiny: Path, own_server: rpc.RpcServer) -> None:
    """Confirming plans for 2 sequences runs each candidate's decode passes over both sequences
    (its loads hold them), as the stock server's slots would."""
    from oallama.planner import confirm as C
    from oallama.runtime.planfile import ConfirmOptions

    ctx = _context(tiny, own_server.device_name, 2)
    plans = {"layers": make_plan(ctx, "layers", 1), "optimal": make_plan(ctx, "layers", "256MiB")}
    conf = C.confirm(ctx, plans, ConfirmOptions(confirm_rounds=3), cache=False, progress=False)
    for c in conf.candidates:
        assert c.measured() is not None and c.measured()["sequences"] == 2 and c.measured()["tpot_ms"] > 0


def test_the_calibration_times_the_decode_pass_of_the_sequences(synth_model) -> None:
    """A workload of 4 sequences is calibrated on its own decode pass: 4 tokens with a row of logits
    each (the output matmul at 4 columns, most of such a pass on a large vocabulary), in the real
    graph and in both host layouts; its profile is keyed apart from the one-sequence profile's."""
    tiny = synth_model("tiny", "q4_0", n_layer=2)  # repacked by a default load: both layouts are timed
    one = profile_model(tiny, ["CPU"], threads=1, repeats=2, progress=False, cache=False, n_ctx=512)
    four = profile_model(tiny, ["CPU"], threads=1, repeats=2, progress=False, cache=False, n_ctx=512,
                         n_tokens=(1, 4, 32, 64, 128, 256, 512), decode_tokens=4)
    assert four.key != one.key and four.settings.decode_tokens == 4
    out = {p["cols"] for p in four.calibration.points if p["n_tokens"] == 4 and p["name"].startswith("result_output")}
    assert out == {4} and not any(p["n_tokens"] == 4 for p in one.calibration.points)
    assert four.calibration.layouts is not None and "4" in four.calibration.layouts["sizes"]
