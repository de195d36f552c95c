"""oallama.synthetic: synthetic GGUFs that real llama.cpp loads, tokenizes and runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

import oallama
from oallama import _libs
from oallama.model import synthetic
from oallama.model.gguf_file import read
from oallama.model.synthetic import PRESETS

MakeModel = Callable[..., Path]

# the big presets are tested with real per-layer shapes but few layers (CI has 2 cores)
BIG = {"llama3-8b": 2, "qwq-32b": 1, "minicpm3-4b": 2, "phi3-mini": 2, "gemma3-270m": 2, "gemma3-4b": 1,
       "qwen3-8b": 1, "starcoder2-7b": 1}
VOCAB_TESTS = Path(__file__).resolve().parents[1] / "third_party/llama.cpp/src/models"


@pytest.fixture(scope="session")
def make_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeModel]:
    """write_model, cached per (preset, type, seed, n_layer) for the whole session; the files
    (~2.7 GB with the big presets) are removed at the end rather than kept by pytest."""
    root = tmp_path_factory.mktemp("synth")
    cache: dict[tuple[str, str, int, int | None], Path] = {}

    def make(preset: str = "tiny", qtype: str = "q8_0", seed: int = 0, n_layer: int | None = None) -> Path:
        key = (preset, qtype, seed, n_layer)
        if key not in cache:
            path = root / f"{preset}-{qtype}-s{seed}-l{n_layer}.gguf"
            cache[key] = synthetic.write_model(path, preset, qtype, seed=seed, n_layer=n_layer, progress=False)
        return cache[key]

    yield make
    for path in cache.values():
        path.unlink(missing_ok=True)


@contextmanager
def llama(path: Path, **kw: Any) -> Iterator[Any]:
    assert oallama  # imported first: it points llama_cpp at oallama's libraries
    import llama_cpp

    kw.setdefault("verbose", False)
    llm = llama_cpp.Llama(str(path), **kw)
    try:
        yield llm
    finally:
        llm.close()


def greedy(path: Path, prompt: bytes, steps: int, n_ctx: int = 512) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and, per step, the relative gap (top1 - top2) / |top1|; asserts finite logits."""
    with llama(path, n_ctx=n_ctx, logits_all=True, n_threads=2) as llm:
        llm.eval(llm.tokenize(prompt))
        out: list[int] = []
        gaps = []
        for step in range(steps):
            logits = llm.scores[llm.n_tokens - 1]
            assert np.isfinite(logits).all(), f"non-finite logits at step {step}"
            top2 = np.sort(logits)[-2:].astype(np.float64)
            gaps.append((top2[1] - top2[0]) / abs(top2[1]))
            out.append(int(np.argmax(logits)))
            llm.eval([out[-1]])
    return out, np.array(gaps)


# --------------------------------------------------------------------------------------------
# block generators
# --------------------------------------------------------------------------------------------

BLOCK_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K",  # generated as blocks
               "q5_K", "q5_0", "q4_1"]  # through ggml's quantizer


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_random_blocks_dequantize_to_target_std(type_name: str) -> None:
    qtype = GGMLQuantizationType[type_name.upper()]
    std = np.repeat(np.array([0.01, 0.5], np.float32), 32)  # 32 rows of each
    data = synthetic.random_blocks(qtype, std, 4096, np.random.SFC64(7))
    x = dequantize(data, qtype).astype(np.float64)
    assert x.shape == (64, 4096)
    assert np.isfinite(x).all()
    for target, rows in ((0.01, x[:32]), (0.5, x[32:])):
        assert abs(rows.mean()) < 0.02 * target
        assert rows.std() == pytest.approx(target, rel=0.03)
    # deterministic per bit generator state
    again = synthetic.random_blocks(qtype, std, 4096, np.random.SFC64(7))
    assert np.array_equal(data, again)


def test_random_blocks_rejects_partial_blocks() -> None:
    with pytest.raises(ValueError, match="multiple"):
        synthetic.random_blocks(GGMLQuantizationType.Q4_K, np.ones(2, np.float32), 100, np.random.SFC64(0))


# --------------------------------------------------------------------------------------------
# type mix: llama.cpp's own
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["q4_k_m", "q4_0", "q8_0", "q5_k_m"])
def test_type_mix_equals_llama_quantize(qtype: str, make_model: MakeModel, tmp_path: Path) -> None:
    src = make_model("tiny", "f16")
    out = tmp_path / "quantized.gguf"
    proc = subprocess.run([str(_libs.tool_path("llama-quantize")), str(src), str(out), qtype.upper()],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = {t.name: (t.type, t.shape) for t in read(out).tensors}
    plan = {t.name: (synthetic._type_name(t.type_id), t.shape) for t in synthetic.tensor_plan("tiny", qtype)}
    assert plan == theirs
    # and the file itself, both read by gguf-py

    def types(path: Path) -> dict[str, tuple[GGMLQuantizationType, tuple[int, ...]]]:
        return {t.name: (t.tensor_type, tuple(int(d) for d in t.shape)) for t in GGUFReader(path).tensors}

    assert types(make_model("tiny", qtype)) == types(out)


def test_llama3_8b_q4_k_m_plan_is_the_real_files() -> None:
    # Meta-Llama-3-8B-Instruct Q4_K_M: f32 65, q4_K 193, q6_K 33 tensors, 4.92 GB of weights
    plan = synthetic.tensor_plan("llama3-8b", "q4_k_m")
    assert Counter(synthetic._type_name(t.type_id) for t in plan) == {"f32": 65, "q4_K": 193, "q6_K": 33}
    assert sum(t.nbytes for t in plan) == pytest.approx(4.92e9, rel=0.01)


def test_f16_keeps_1d_tensors_f32() -> None:
    types = {t.name: synthetic._type_name(t.type_id) for t in synthetic.tensor_plan("qwq-32b", "f16", 1)}
    assert types["blk.0.attn_q.weight"] == "f16"
    assert types["blk.0.attn_q.bias"] == types["blk.0.attn_norm.weight"] == "f32"


# --------------------------------------------------------------------------------------------
# models run in llama.cpp
# --------------------------------------------------------------------------------------------


def _llama_ftype(llama_cpp: Any, qtype: str) -> int:
    return int(getattr(llama_cpp, "LLAMA_FTYPE_ALL_F32" if qtype == "f32" else f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}"))


@pytest.mark.parametrize("qtype", list(synthetic.FILE_TYPES))
def test_tiny_generates_finite_logits(qtype: str, make_model: MakeModel) -> None:
    import llama_cpp

    p = PRESETS["tiny"]
    path = make_model("tiny", qtype)
    info = read(path)
    assert info.architecture == p.arch
    assert info.metadata["general.name"] == "oallama synthetic tiny"
    # llama.h's LLAMA_FTYPE_* (through llama-cpp-python's bindings), not oallama's own table
    assert info.metadata["general.file_type"] == _llama_ftype(llama_cpp, qtype)
    assert info.hparam("block_count") == p.n_layer
    assert info.tensor("token_embd.weight").shape == (p.n_embd, p.n_vocab)
    assert path.stat().st_size < 20e6
    with llama(path, n_ctx=64) as llm:  # what llama.cpp loaded: every element and byte of the file's tensors
        reader = GGUFReader(path)
        assert llm._model.n_params() == sum(int(t.n_elements) for t in reader.tensors)
        assert llm._model.size() == sum(int(t.n_bytes) for t in reader.tensors)
    tokens, _ = greedy(path, b"Hello world", steps=32)
    assert len(tokens) == 32


def test_tiny_runs_a_few_hundred_tokens(make_model: MakeModel) -> None:
    tokens, _ = greedy(make_model("tiny", "q4_k_m"), b"Once upon a time", steps=300, n_ctx=512)
    assert len(set(tokens)) > 5


def test_logit_gap(make_model: MakeModel) -> None:
    # the output rows' log-normal gains keep the top logit clear of the runner-up (see
    # synthetic.OUTPUT_ROW_SPREAD): median relative gap ~0.1, few near-ties
    _, gaps = greedy(make_model("tiny", "q8_0"), b"The quick brown fox jumps over the lazy dog", steps=256)
    assert np.median(gaps) > 0.07
    assert np.mean(gaps < 1e-2) < 0.06


@pytest.mark.parametrize("preset", list(BIG))
def test_big_preset_runs(preset: str, make_model: MakeModel) -> None:
    p = PRESETS[preset]
    path = make_model(preset, "q4_k_m", n_layer=BIG[preset])
    info = read(path)
    assert info.architecture == p.arch
    assert info.hparam("block_count") == BIG[preset]
    assert info.hparam("embedding_length") == p.n_embd
    assert info.metadata["oallama.synthetic.preset"] == preset
    assert info.tensor("token_embd.weight").shape == (p.n_embd, p.n_vocab)
    assert ("output.weight" in {t.name for t in info.tensors}) != p.tied_output
    with llama(path, n_ctx=64, logits_all=True, n_threads=2) as llm:
        assert llm.n_vocab() == p.n_vocab
        assert llm.metadata["tokenizer.chat_template"] == p.chat_template
        llm.eval(llm.tokenize(b"Hello world, this is"))
        for _ in range(3):
            logits = llm.scores[llm.n_tokens - 1]
            assert np.isfinite(logits).all()
            assert logits.std() > 0.1
            llm.eval([int(np.argmax(logits))])


@pytest.mark.parametrize(("preset", "ops", "absent"), [("starcoder2-7b", {"NORM", "GELU"}, {"RMS_NORM", "SWIGLU"}),
                                                     ("qwen3-8b", {"RMS_NORM", "SWIGLU"}, {"NORM", "GELU"})])
def test_a_held_out_architecture_runs_its_own_graph(preset: str, ops: set[str], absent: set[str],
                                                   make_model: MakeModel) -> None:
    """Protocol v2's architectures (bench/heldout): llama.cpp builds each one's own graph from the file
    (starcoder2: LayerNorm, a GELU FFN without a gate, a bias on every projection; qwen3: a norm of each
    head's query and key), and every tensor the preset writes is one its loader reads."""
    from oallama.planner.graph import GraphSession

    path = make_model(preset, "q4_k_m", n_layer=1)
    with GraphSession(path, n_ctx=256, n_ubatch=8) as s:
        g = s.graph(8)
        kinds = {n.op for n in g.nodes}
        assert ops <= kinds and not absent & kinds
        loaded = {t.name for t in s.model_tensors()}
    assert loaded == {t.name for t in read(path).tensors}
    if preset == "starcoder2-7b":  # biases on the projections and norms, added in the graph
        assert {"blk.0.attn_q.bias", "blk.0.ffn_up.bias", "blk.0.attn_norm.bias", "output_norm.bias"} <= loaded
    else:
        assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= loaded


def test_gemma3_preset_is_the_real_files_tensor_for_tensor(gemma3_270m: Path, make_model: MakeModel) -> None:
    """The registry's real Gemma 3 270M and the preset of its name: the same tensors, shapes and
    types (what a plan sees), so that a machine without the registry (a GPU one) plans its twin."""
    real, twin = read(gemma3_270m), read(make_model("gemma3-270m", "q4_k_m"))
    assert [(t.name, t.shape, t.type) for t in sorted(twin.tensors, key=lambda t: t.name)] == \
        [(t.name, t.shape, t.type) for t in sorted(real.tensors, key=lambda t: t.name)]
    for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "attention.sliding_window"):
        assert twin.hparam(key) == real.hparam(key), key


def test_minicpm3_shapes(make_model: MakeModel) -> None:
    info = read(make_model("minicpm3-4b", "q4_k_m", n_layer=BIG["minicpm3-4b"]))
    # MLA: q 2560 -> 768 -> 40 x 96; kv 2560 -> 256 (+32 shared rope key) -> 40 x (64 nope + 64 v)
    assert info.tensor("blk.0.attn_q_a.weight").shape == (2560, 768)
    assert info.tensor("blk.0.attn_q_b.weight").shape == (768, 40 * 96)
    assert info.tensor("blk.0.attn_kv_a_mqa.weight").shape == (2560, 256 + 32)
    assert info.tensor("blk.0.attn_kv_b.weight").shape == (256, 40 * 128)
    assert info.tensor("blk.0.attn_output.weight").shape == (40 * 64, 2560)
    assert info.tensor("rope_factors_long.weight").shape == (16,)
    assert info.tensor("rope_factors_short.weight").type == "f32"


# --------------------------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------------------------


def _vocab_tests(vocab: str) -> list[tuple[str, list[int]]]:
    inp = VOCAB_TESTS / f"ggml-vocab-{vocab}.gguf.inp"
    if not inp.exists():
        pytest.skip(f"{inp} is not here (upstream source not fetched)")
    sep = "\n__ggml_vocab_test__\n"
    texts = inp.read_text(encoding="utf-8").split(sep)
    if texts and texts[-1] == "":
        texts.pop()
    lines = (VOCAB_TESTS / f"ggml-vocab-{vocab}.gguf.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines)
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


@pytest.mark.parametrize(("preset", "vocab"), [("llama3-8b", "llama-bpe"), ("qwq-32b", "qwen2"),
                                                ("minicpm3-4b", "llama-spm")])
def test_tokenizes_like_the_real_model(preset: str, vocab: str, make_model: MakeModel) -> None:
    cases = _vocab_tests(vocab)
    with llama(make_model(preset, "q4_k_m", n_layer=BIG[preset]), vocab_only=True) as llm:
        for text, ids in cases:  # the .out ids are without BOS
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids, text


def test_special_tokens(make_model: MakeModel) -> None:
    with llama(make_model("qwq-32b", "q4_k_m", n_layer=1), vocab_only=True) as llm:
        assert llm.token_eos() == 151645  # <|im_end|>
        assert llm.tokenize(b"<think>", add_bos=False, special=False) == [151667]
        assert llm.tokenize(b"<|im_start|>user", add_bos=False, special=True)[0] == 151644
    with llama(make_model("minicpm3-4b", "q4_k_m", n_layer=2), vocab_only=True) as llm:
        assert llm.tokenize(b"<|im_start|>", add_bos=False, special=True) == [73441]
    with llama(make_model("tiny", "q8_0"), vocab_only=True) as llm:
        assert llm.n_vocab() == PRESETS["tiny"].n_vocab
        # byte fallback: anything tokenizes, and round-trips
        text = "Grüße, 世界! 🦙".encode()
        assert llm.detokenize(llm.tokenize(text, add_bos=False)).removeprefix(b" ") == text


# --------------------------------------------------------------------------------------------
# determinism, errors, CLI
# --------------------------------------------------------------------------------------------


def test_same_seed_same_bytes(make_model: MakeModel, tmp_path: Path) -> None:
    a = make_model("tiny", "q4_k_m")
    b = synthetic.write_model(tmp_path / "again.gguf", "tiny", "q4_k_m", progress=False)
    assert a.read_bytes() == b.read_bytes()


def test_other_seed_other_data(make_model: MakeModel) -> None:
    a, b = make_model("tiny", "q4_k_m"), make_model("tiny", "q4_k_m", seed=1)
    ia, ib = read(a), read(b)
    assert ia.identity() == ib.identity()  # same names, shapes, types
    assert ib.metadata["oallama.synthetic.seed"] == 1
    da, db = a.read_bytes()[ia.data_offset:], b.read_bytes()[ib.data_offset:]
    assert len(da) == len(db) and da != db


def test_fewer_layers_same_layer_data(make_model: MakeModel) -> None:
    full, short = make_model("tiny", "q8_0"), make_model("tiny", "q8_0", n_layer=2)
    fi, si = read(full), read(short)
    # the same tensors, in the same order, less those of the layers cut off
    kept = [t.name for t in GGUFReader(full).tensors
            if (m := re.match(r"blk\.(\d+)\.", t.name)) is None or int(m[1]) < 2]
    assert si.hparam("block_count") == 2 and [t.name for t in si.tensors] == kept
    assert len(kept) < len(fi.tensors)
    t_full, t_short = fi.tensor("blk.1.ffn_up.weight"), si.tensor("blk.1.ffn_up.weight")
    raw_full = full.read_bytes()[fi.data_offset + t_full.offset:][: t_full.nbytes]
    raw_short = short.read_bytes()[si.data_offset + t_short.offset:][: t_short.nbytes]
    assert raw_full == raw_short
    # every tensor both files have holds the same bytes (gguf-py's view of each file's data)
    full_data = {t.name: t.data.tobytes() for t in GGUFReader(full).tensors}
    assert all(t.data.tobytes() == full_data[t.name] for t in GGUFReader(short).tensors)


@pytest.mark.parametrize(("kwargs", "match"), [({"preset": "gpt5"}, "tiny, mid, llama3-8b"),
                                               ({"qtype": "q3_x"}, "q4_k_m"),
                                               ({"n_layer": 0}, "n_layer")])
def test_bad_arguments(kwargs: dict[str, Any], match: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic.write_model(tmp_path / "x.gguf", **{"progress": False, **kwargs})
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = synthetic._tensor_data

    def failing(t: Any, *a: Any) -> Iterator[np.ndarray]:
        if t.name == "blk.2.attn_q.weight":
            raise KeyboardInterrupt
        yield from real(t, *a)

    monkeypatch.setattr(synthetic, "_tensor_data", failing)
    with pytest.raises(KeyboardInterrupt):
        synthetic.write_model(tmp_path / "x.gguf", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli(tmp_path: Path) -> None:
    import llama_cpp

    out = tmp_path / "cli.gguf"
    proc = subprocess.run([sys.executable, "-m", "oallama", "synth", "--preset", "tiny", "--type", "q4_0",
                           "-o", str(out), "--seed", "3", "--layers", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    n = len(GGUFReader(out).tensors)
    assert f"wrote {out}" in proc.stdout and f"{n} tensors" in proc.stdout
    assert f"synth: tensor {n}/{n}" in proc.stderr  # progress
    info = read(out)
    assert info.metadata["oallama.synthetic.seed"] == 3 and info.hparam("block_count") == 2
    assert info.metadata["general.file_type"] == _llama_ftype(llama_cpp, "q4_0")


def test_cli_rejects_unknown_preset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from oallama.cli import main

    with pytest.raises(SystemExit):
        main(["synth", "--preset", "nope", "-o", str(tmp_path / "x.gguf")])
    assert "qwq-32b" in capsys.readouterr().err
