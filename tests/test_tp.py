"""oallama.collective.tp: the tensor-parallel llama decoder. Its single-process form is checked
against llama.cpp; its distributed form (2 hosts x 2 ranks, gloo on loopback) against the
single-process one, for every all-reduce algorithm, both norm orders and with the layer-streaming
manager. The distributed tests need torch (process groups) and skip without it."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

import oallama  # noqa: F401  (llama_cpp on oallama's libraries)
from oallama import collective as C
from oallama.collective.tp.decoder import TPDecoder, TPOptions, run_distributed
from oallama.collective.tp.memory import GGUFSource, LlamaConfig, Shard, load_layer
from oallama.model.gguf_file import read

PROMPT = [1, 450, 996, 1354, 1701, 2916, 432, 1204, 975, 278, 1366, 203]  # ids < 4096 (tiny's vocab)
N_GEN = 6
TOPO = C.Topology.uniform(2, 2)


@pytest.fixture(scope="module")
def tiny_f16(synth_model) -> Path:
    return synth_model("tiny", "f16")


@pytest.fixture(scope="module")
def tiny_q8_0(synth_model) -> Path:
    return synth_model("tiny", "q8_0")


@pytest.fixture(scope="module")
def reference(tiny_q8_0: Path):
    """Single-process numpy reference on tiny q8_0: tokens and logits [N_GEN, n_vocab]."""
    dec = TPDecoder(tiny_q8_0, None, TPOptions(n_ctx=128))
    res = dec.generate(PROMPT, N_GEN, keep_logits=True)
    dec.close()
    return res.tokens, np.stack(res.logits)


@pytest.fixture
def needs_torch() -> None:
    pytest.importorskip("torch", reason="distributed ranks need torch.distributed: pip install 'oallama[tp]'")


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """Normalised mean squared error of a against the reference b (test-backend-ops' measure)."""
    return float(np.mean((a.astype(np.float64) - b) ** 2) / np.mean(np.asarray(b, np.float64) ** 2))


# --------------------------------------------------------------------------------------------
# sharding and reading
# --------------------------------------------------------------------------------------------


def test_shards_cover_the_model(tiny_q8_0: Path) -> None:
    cfg = LlamaConfig.from_gguf(read(tiny_q8_0))
    assert (cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (256, 4, 2, 64)
    for world in (1, 2, 3, 4):
        shards = [Shard.split(cfg, r, world) for r in range(world)]
        for key, n in (("q_heads", cfg.n_head), ("ff", cfg.n_ff), ("vocab", cfg.n_vocab)):
            spans = [getattr(s, key) for s in shards]
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), (key, spans)
        for s in shards:  # every query head's KV head is on the same rank (GQA: 2 q heads per kv head)
            assert s.kv_heads == (s.q_heads[0] // 2, (s.q_heads[1] - 1) // 2 + 1)
    with pytest.raises(ValueError, match="attention heads"):
        Shard.split(cfg, 0, 5)


@pytest.mark.parametrize("qtype", ["q8_0", "f16"])
def test_source_rows_and_cols_equal_full_dequantization(synth_model, qtype: str) -> None:
    path = synth_model("tiny", qtype)
    src = GGUFSource(path)
    t = src.info.tensor("blk.1.ffn_down.weight")  # ne = [n_ff 512, n_embd 256]: numpy [256, 512]
    with open(path, "rb") as f:
        f.seek(src.info.data_offset + t.offset)
        raw = np.frombuffer(f.read(t.nbytes), np.uint8)
    full = dequantize(raw.reshape(t.shape[1], -1), GGMLQuantizationType(t.type_id)).reshape(t.shape[1], t.shape[0])
    assert np.array_equal(src.rows(t.name, 10, 50), full[10:50])
    assert np.array_equal(src.cols(t.name, 128, 384), full[:, 128:384])  # block-aligned columns
    assert np.array_equal(src.cols(t.name, 5, 77), full[:, 5:77])  # not aligned
    src.close()


# --------------------------------------------------------------------------------------------
# the single-process reference against llama.cpp
# --------------------------------------------------------------------------------------------


def _llama_cpp_greedy(path: Path, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=128, logits_all=True, n_threads=2, verbose=False)
    try:
        llm.eval(prompt)
        toks, logits = [], []
        for _ in range(steps):
            row = np.array(llm.scores[llm.n_tokens - 1], np.float32)
            logits.append(row)
            toks.append(int(np.argmax(row)))
            llm.eval([toks[-1]])
    finally:
        llm.close()
    return toks, np.stack(logits)


def test_reference_equals_llama_cpp_f16(tiny_f16: Path) -> None:
    """f16 weights: llama.cpp and the numpy decoder agree to float rounding; same greedy tokens."""
    theirs_tok, theirs = _llama_cpp_greedy(tiny_f16, PROMPT, 12)
    dec = TPDecoder(tiny_f16, None, TPOptions(n_ctx=128))
    res = dec.generate(PROMPT, 12, keep_logits=True)
    dec.close()
    assert res.tokens == theirs_tok
    assert nmse(np.stack(res.logits), theirs) < 1e-5


def test_reference_close_to_llama_cpp_q8_0(tiny_q8_0: Path) -> None:
    """q8_0: llama.cpp also rounds the activations to q8_0 for its dot products, so the logits
    differ by ~4e-5 NMSE. Teacher-forced on llama.cpp's own tokens; argmax equal where the top-2
    gap is not a near-tie."""
    toks, theirs = _llama_cpp_greedy(tiny_q8_0, PROMPT, 12)
    dec = TPDecoder(tiny_q8_0, None, TPOptions(n_ctx=128))
    ours = dec.forward(PROMPT + toks, all_logits=True)[len(PROMPT) - 1 : len(PROMPT) - 1 + 12]
    dec.close()
    assert nmse(ours, theirs) < 1e-3
    for o, t in zip(ours, theirs, strict=True):
        top2 = np.sort(t)[-2:]
        if (top2[1] - top2[0]) / abs(top2[1]) > 1e-2:
            assert np.argmax(o) == np.argmax(t)


# --------------------------------------------------------------------------------------------
# the layer-streaming memory manager (in process)
# --------------------------------------------------------------------------------------------


def test_streaming_equals_resident_and_holds_less(tiny_q8_0: Path, reference) -> None:
    tokens, logits = reference
    dec = TPDecoder(tiny_q8_0, None, TPOptions(n_ctx=128, stream=True))
    try:
        res = dec.generate(PROMPT, N_GEN, keep_logits=True)
        res2 = dec.generate(PROMPT, N_GEN, keep_logits=True)  # reset() then the same again
        st = dec.store
        assert res.tokens == tokens == res2.tokens
        assert np.array_equal(np.stack(res.logits), logits)
        # the prefetch thread did the loading, except layer 0 of each generation's first pass
        assert any(n.startswith("oallama-prefetch") for n in st.load_threads)
        assert threading.current_thread().name in st.load_threads
        # at most two layers (current + prefetched) with their KV, never all four; whether the
        # prefetch was in flight at the peak is timing, so the lower bound is one layer
        layer_bytes = load_layer(dec.src, dec.cfg, dec.shard, 0).nbytes
        kv_bytes = 2 * (len(PROMPT) + N_GEN) * dec.shard.n_kv * dec.cfg.head_dim * 4
        assert layer_bytes <= st.acct.peak <= 2 * (layer_bytes + kv_bytes)
        for fut in st._pending.values():
            fut.result()
        assert layer_bytes <= st.acct.current <= layer_bytes + kv_bytes  # only layer 0, prefetched for the next step
    finally:
        dec.close()
    full = TPDecoder(tiny_q8_0, None, TPOptions(n_ctx=128))
    try:
        assert full.store.acct.peak >= 4 * layer_bytes
    finally:
        full.close()


# --------------------------------------------------------------------------------------------
# distributed: 2 hosts x 2 ranks over gloo on loopback
# --------------------------------------------------------------------------------------------

CASES = [
    pytest.param("tree", False, "allreduce", id="tree"),
    pytest.param("tree", True, "reduce_bcast", id="tree-stream-megatron"),
    pytest.param("ring", True, "allreduce", id="ring-stream"),
    pytest.param("star", False, "allreduce", id="star"),
]


@pytest.mark.usefixtures("needs_torch")
@pytest.mark.parametrize(("alg", "stream", "norm"), CASES)
def test_tensor_parallel_equals_reference(tiny_q8_0: Path, reference, tmp_path: Path, alg: str,
                                          stream: bool, norm: str) -> None:
    tokens, logits = reference
    run = run_distributed(tiny_q8_0, PROMPT, N_GEN, TOPO, TPOptions(algorithm=alg, stream=stream, norm=norm, n_ctx=128),
                          out_dir=tmp_path, save_logits=True, timeout_s=180)
    assert run.tokens == tokens
    assert run.logits is not None and run.logits.shape == logits.shape
    assert nmse(run.logits, logits) < 1e-10
    assert np.max(np.abs(run.logits - logits)) < 1e-4
    assert all(r["tokens"] == tokens for r in run.reports)  # every rank decoded the same text
    tot = run.totals()
    cfg = LlamaConfig.from_gguf(read(tiny_q8_0))
    if norm == "allreduce":
        calls = tot.allreduce_calls // TOPO.world_size
        assert calls == 2 * cfg.n_layer * N_GEN  # one after attention, one after the FFN, per layer
        # every all-reduce is [T, n_embd]: T = the prompt's length in the first pass, then 1
        def msgs(T: int) -> int:
            return C.expected_counts(alg, TOPO, T * cfg.n_embd)["inter_msgs"]

        assert tot.inter_msgs == 2 * cfg.n_layer * (msgs(len(PROMPT)) + (N_GEN - 1) * msgs(1))
    else:
        assert tot.allreduce_calls == 0  # reduce + broadcast instead
        assert tot.inter_msgs == 2 * 2 * cfg.n_layer * N_GEN  # tree: 1 up + 1 down per reduce/bcast
    mem = [r["memory"] for r in run.reports]
    assert all(m["held_peak"] > 0 and m["rss_anon_peak"] >= m["rss_anon_base"] for m in mem)


@pytest.mark.usefixtures("needs_torch")
def test_all_reduce_norm_equals_reduce_norm_broadcast(tiny_q8_0: Path, tmp_path: Path) -> None:
    """All-Reduce + LayerNorm on every rank == Reduce + LayerNorm on rank 0 + Broadcast: the same
    sums in the same order (the tree), so the same bits."""
    runs = {norm: run_distributed(tiny_q8_0, PROMPT, N_GEN, TOPO, TPOptions(norm=norm, n_ctx=128),
                                  out_dir=tmp_path / norm, save_logits=True, timeout_s=180)
            for norm in ("allreduce", "reduce_bcast")}
    a, b = runs["allreduce"], runs["reduce_bcast"]
    assert a.tokens == b.tokens
    assert a.logits is not None and b.logits is not None
    np.testing.assert_array_equal(a.logits, b.logits)
    # Megatron's order moves twice the bytes down (h and its norm) and serialises the norm on rank 0
    assert b.totals().inter_bytes > a.totals().inter_bytes


@pytest.mark.usefixtures("needs_torch")
def test_streaming_lowers_peak_memory_across_ranks(tiny_q8_0: Path, tmp_path: Path) -> None:
    held = {}
    for stream in (False, True):
        run = run_distributed(tiny_q8_0, PROMPT, 2, TOPO, TPOptions(stream=stream, n_ctx=128),
                              out_dir=tmp_path / str(stream), timeout_s=180)
        held[stream] = max(r["memory"]["layers_peak"] for r in run.reports)
        if stream:
            assert all(r["stream"]["load_s"] > 0 for r in run.reports)
    assert held[True] < 0.6 * held[False]  # 2 of 4 layers resident (+ KV)
