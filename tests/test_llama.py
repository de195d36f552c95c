"""The drop-in `Llama`: llama-cpp-python's API unchanged, per-tensor placement across two real
devices (this process's CPU and a loopback rpc-server), and the errors a user sees.

Everything runs through real llama.cpp on the synthetic `tiny` model (4-layer llama, 4096-token
SentencePiece vocabulary, llama-2 style chat template)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter, format_llama2

from helpers import closed_port, raises_cleanly
from oallama import Llama, PlacementError, PlanError, RpcServerError, UnknownDeviceError
from oallama.model import gguf_file
from oallama.runtime import devices, rpc
from oallama.runtime.place import DEFAULT_RULE

N_CTX = 256
THREADS = 2
SEED = 1234
PROMPT = "The quick brown fox jumps over the lazy dog"
N_GREEDY = 16
NMSE_MAX = 1e-4  # llama.cpp test-backend-ops' default max normalised mean squared error


def _kwargs(**extra: Any) -> dict[str, Any]:
    return {"n_ctx": N_CTX, "verbose": False, "n_threads": THREADS, "n_threads_batch": THREADS, "seed": SEED,
            **extra}


def _greedy(llm: llama_cpp.Llama, tokens: list[int], n: int = N_GREEDY) -> list[int]:
    """n greedy tokens after `tokens`, EOS not special, the whole prompt evaluated afresh."""
    llm.reset()
    out: list[int] = []
    for tok in llm.generate(tokens, temp=0.0, reset=True):
        out.append(int(tok))
        if len(out) == n:
            break
    return out


def _scores(llm: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    """Logits of every position of `tokens` (needs logits_all=True), evaluated afresh."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float64)


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a - b) ** 2).sum() / (b**2).sum())


def _text(llm: llama_cpp.Llama, **kw: Any) -> str:
    llm.reset()
    out = llm(PROMPT, max_tokens=8, **kw)
    return str(out["choices"][0]["text"])


@pytest.fixture(scope="module")
def cpu_llm(tiny_q8: Path) -> Iterator[Llama]:
    llm = Llama(str(tiny_q8), logits_all=True, **_kwargs())
    yield llm
    llm.close()


@dataclass(frozen=True)
class Reference:
    tokens: list[int]
    scores: np.ndarray  # [n_tokens, n_vocab]
    greedy: list[int]


@pytest.fixture(scope="module")
def reference(cpu_llm: Llama) -> Reference:
    """The all-CPU load's logits and greedy tokens for PROMPT."""
    tokens = cpu_llm.tokenize(PROMPT.encode(), add_bos=True)
    return Reference(tokens, _scores(cpu_llm, tokens), _greedy(cpu_llm, tokens))


# --- 1. llama-cpp-python's API, unchanged ---------------------------------------------------


def test_llama_cpp_imported_first_loads_oallamas_libraries(tmp_path: Path) -> None:
    """llama-cpp-python has no libraries of its own here: the installed .pth points it at oallama's,
    so scripts that import llama_cpp before (or without) oallama work."""
    from oallama import _libs

    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    code = ("import pathlib, llama_cpp; print(pathlib.Path(llama_cpp.llama_cpp._lib._name).resolve().parent); "
            "import oallama; print(oallama.__version__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[0] == str(_libs.lib_dir().resolve())


def test_is_llama_cpp_pythons_llama_with_only_construction_replaced() -> None:
    assert issubclass(Llama, llama_cpp.Llama)
    overridden = {name for name, value in vars(Llama).items() if callable(value) and hasattr(llama_cpp.Llama, name)}
    assert overridden <= {"__init__", "close"}, overridden  # close: also for a Llama refused before loading
    # every stock constructor argument is still accepted, by name and in position
    stock = inspect.signature(llama_cpp.Llama.__init__).parameters
    ours = inspect.signature(Llama.__init__).parameters
    assert list(ours)[:2] == ["self", "model_path"]
    assert {p.kind for p in ours.values()} >= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    assert not set(stock) & {"devices", "placement", "gpu_budget", "device", "workload", "profile"}


def test_stock_arguments_take_effect_and_match_stock_llama_cpp(tiny_q8: Path, reference: Reference) -> None:
    kw = _kwargs(logits_all=True, n_batch=64, n_ubatch=32, use_mmap=False, last_n_tokens_size=32, n_gpu_layers=0)
    ours = Llama(str(tiny_q8), **kw)
    stock = llama_cpp.Llama(str(tiny_q8), **kw)
    try:
        for llm in (ours, stock):
            assert llm.n_batch == 64 and llm.context_params.n_ubatch == 32 and llm.n_ctx() == N_CTX
            assert llm.model_params.load_mode == llama_cpp.LLAMA_LOAD_MODE_NONE and llm.model_params.n_gpu_layers == 0
            assert llm.context_params.n_threads == THREADS and llm.last_n_tokens_size == 32
        np.testing.assert_array_equal(_scores(ours, reference.tokens), _scores(stock, reference.tokens))
        assert _greedy(ours, reference.tokens) == _greedy(stock, reference.tokens) == reference.greedy
    finally:
        ours.close()
        stock.close()


def test_completion(cpu_llm: Llama, tiny_q8: Path) -> None:
    cpu_llm.reset()
    out = cpu_llm(PROMPT, max_tokens=8, temperature=0)
    assert out["object"] == "text_completion"
    choice = out["choices"][0]
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("length", "stop")
    usage = out["usage"]
    assert usage["prompt_tokens"] == len(cpu_llm.tokenize(PROMPT.encode(), add_bos=True))
    assert 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # llama.cpp's view of the model against the file's, read by gguf-py
    fields = gguf.GGUFReader(tiny_q8).fields
    assert cpu_llm.n_vocab() == len(fields["tokenizer.ggml.tokens"].data)
    assert cpu_llm.n_embd() == fields["llama.embedding_length"].contents()
    assert cpu_llm.n_ctx() == N_CTX


def test_stream_concatenates_to_the_greedy_text(cpu_llm: Llama) -> None:
    whole = _text(cpu_llm, temperature=0)
    cpu_llm.reset()
    chunks = list(cpu_llm(PROMPT, max_tokens=8, temperature=0, stream=True))
    assert len(chunks) > 1 and all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert whole


def test_chat_completion_uses_the_gguf_chat_template(cpu_llm: Llama) -> None:
    messages: list[Any] = [{"role": "system", "content": "You are brief."},
                           {"role": "user", "content": "Name a colour."}]
    template = cpu_llm.metadata["tokenizer.chat_template"]
    assert cpu_llm.chat_format == "chat_template.default"  # llama-cpp-python's name for the GGUF's template
    # the prompt exactly as llama-cpp-python builds it from the GGUF's template (Llama.__init__ and
    # chat_formatter_to_chat_completion_handler): Jinja2ChatFormatter with the vocabulary's BOS/EOS
    # texts, tokenized without an added BOS and with special tokens parsed
    formatter = Jinja2ChatFormatter(template=template, eos_token=cpu_llm._model.token_get_text(cpu_llm.token_eos()),
                                    bos_token=cpu_llm._model.token_get_text(cpu_llm.token_bos()))
    rendered = formatter(messages=messages).prompt
    assert rendered.startswith("<s>[INST] <<SYS>>\nYou are brief.\n<</SYS>>")
    expected = cpu_llm.tokenize(rendered.encode(), add_bos=False, special=True)
    # the check can tell: llama-cpp-python's fallback format tokenizes differently
    fallback = format_llama2(messages=messages).prompt
    assert cpu_llm.tokenize(fallback.encode(), add_bos=True, special=True) != expected

    cpu_llm.reset()
    out: Any = cpu_llm.create_chat_completion(messages=messages, max_tokens=6, temperature=0)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    choice = out["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] in ("length", "stop")
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    usage = out["usage"]
    assert usage["prompt_tokens"] == len(expected)
    assert 0 < usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert [int(t) for t in cpu_llm.input_ids[: len(expected)]] == expected  # what was evaluated


@pytest.mark.parametrize("text", ["Hello world, this is a test.", "tabs\tand\nnewlines", "ünïcödé ✓ 12345"])
def test_tokenize_detokenize_round_trip(cpu_llm: Llama, text: str) -> None:
    tokens = cpu_llm.tokenize(text.encode(), add_bos=True)
    assert tokens[0] == cpu_llm.token_bos() and all(0 <= t < cpu_llm.n_vocab() for t in tokens)
    assert cpu_llm.tokenize(text.encode(), add_bos=False) == tokens[1:]
    assert cpu_llm.detokenize(tokens).decode() == text


def test_logits_of_every_position(cpu_llm: Llama, reference: Reference) -> None:
    scores = _scores(cpu_llm, reference.tokens)
    assert scores.shape == (len(reference.tokens), cpu_llm.n_vocab())
    assert np.isfinite(scores).all() and scores.std() > 0
    np.testing.assert_array_equal(scores, reference.scores)  # same load, same prompt: deterministic
    assert int(np.argmax(scores[-1])) == reference.greedy[0]


def test_seeds(cpu_llm: Llama) -> None:
    first = _text(cpu_llm, temperature=0.8, seed=1)
    assert _text(cpu_llm, temperature=0.8, seed=1) == first
    others = [_text(cpu_llm, temperature=0.8, seed=s) for s in (2, 3, 4, 5)]
    assert any(o != first for o in others), others


# --- 2. placement across CPU + an rpc-server ------------------------------------------------

_LAYER = re.compile(r"^blk\.(\d+)\.")


def _ffn_and_output(names: list[str], dev: str) -> dict[str, str]:
    return {n: dev for n in names if re.match(r"^blk\.\d+\.ffn_(gate|up|down)\.weight$", n) or n == "output.weight"}


def _odd_layers(names: list[str], dev: str) -> dict[str, str]:
    return {n: dev for n in names if (m := _LAYER.match(n)) and int(m[1]) % 2 == 1}


def _attention_only(names: list[str], dev: str) -> dict[str, str]:
    return {n: dev for n in names if re.match(r"^blk\.\d+\.attn_(q|k|v|output)\.weight$", n)}


def _random_mix(names: list[str], dev: str) -> dict[str, str]:
    rng = random.Random(7)  # names CPU explicitly too, and puts norms and embeddings anywhere
    return {n: rng.choice(["CPU", dev]) for n in names if rng.random() < 0.8}


def _single_tensor(names: list[str], dev: str) -> dict[str, str]:
    return {"blk.2.attn_v.weight": dev}


def _everything(names: list[str], dev: str) -> dict[str, str]:
    return dict.fromkeys(names, dev)


PLACEMENTS: dict[str, Callable[[list[str], str], dict[str, str]]] = {
    "ffn-all-layers+output": _ffn_and_output,
    "odd-layers": _odd_layers,
    "attention-only": _attention_only,
    "random-mix-seed7": _random_mix,
    "single-tensor": _single_tensor,
    "every-weight": _everything,
}


def _check_readback(llm: Llama, info: gguf_file.GGUFInfo, placement: Mapping[str, str]) -> None:
    got = llm.tensor_devices()
    assert set(got) == {t.name for t in info.tensors}
    wrong = {n: (got[n], d) for n, d in placement.items() if got[n] != d}
    assert not wrong, f"read back != requested: {wrong}"
    unnamed = {n: got[n] for n in got if n not in placement and got[n] != "CPU"}
    assert not unnamed, f"not on CPU although the placement does not name them ({DEFAULT_RULE}): {unnamed}"


@pytest.mark.parametrize("which", list(PLACEMENTS))
def test_placement_across_two_devices(tiny_q8: Path, rpc_server: rpc.RpcServer, reference: Reference,
                                      which: str) -> None:
    dev = rpc_server.device_name
    info = gguf_file.read(tiny_q8)
    placement = PLACEMENTS[which]([t.name for t in info.tensors], dev)
    assert dev in placement.values()
    llm = Llama(str(tiny_q8), devices=["CPU", dev], placement=placement, logits_all=True, **_kwargs())
    try:
        _check_readback(llm, info, placement)
        per_device = llm.bytes_per_device()
        assert sum(per_device.values()) == info.weight_bytes
        assert per_device[dev] == sum(info.tensor(n).nbytes for n, d in placement.items() if d == dev)
        # the host's weights in host buffer types (mapped, or repacked), the server's in its own
        per_buffer = llm.bytes_per_buffer_type()
        host_types = {t.buffer_type for t in llm.tensor_placements() if t.is_host}
        assert host_types <= {"CPU", "CPU_Mapped", "CPU_REPACK"}
        assert sum(per_buffer[b] for b in host_types) == info.weight_bytes - per_device[dev]
        assert sum(per_buffer.values()) == info.weight_bytes

        scores = _scores(llm, reference.tokens)
        assert scores.shape == reference.scores.shape and np.isfinite(scores).all()
        nmse = _nmse(scores, reference.scores)
        assert nmse < NMSE_MAX, f"logits differ from the all-CPU load: NMSE {nmse:.3g}"
        greedy = _greedy(llm, reference.tokens)
        assert greedy == reference.greedy, f"greedy tokens differ from the all-CPU load (NMSE {nmse:.3g})"
    finally:
        llm.close()


def test_placement_from_a_json_file(tiny_q8: Path, rpc_server: rpc.RpcServer, tmp_path: Path) -> None:
    dev = rpc_server.device_name
    info = gguf_file.read(tiny_q8)
    placement = _odd_layers([t.name for t in info.tensors], dev) | {"output.weight": dev}
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"placement": placement, "devices": ["CPU", dev],
                                "model": {"name": "tiny", "identity": info.identity()}}))
    llm = Llama(str(tiny_q8), placement=path, **_kwargs())  # no devices=: they come from the file
    try:
        _check_readback(llm, info, placement)
        assert sum(llm.bytes_per_device().values()) == info.weight_bytes
    finally:
        llm.close()


@pytest.mark.parametrize("embedding", ["host", "accelerator"])
@pytest.mark.parametrize("n_gpu_layers", [1, 4])
def test_a_tied_embedding_loads_where_the_placement_puts_it_whatever_n_gpu_layers(
        gemma3_270m: Path, rpc_server: rpc.RpcServer, n_gpu_layers: int, embedding: str) -> None:
    """Gemma 3's output is its input embedding: llama.cpp loads that weight twice, the second copy in
    the output layer, which n_gpu_layers >= 1 puts on the accelerator (plans load with n_gpu_layers
    for their KV cache). Placed on the host, both copies stay there (not 178 MB more on the
    accelerator); placed on the accelerator, the output copy goes there and the input copy, a lookup,
    stays on the host, as -ngl loads it (its bytes once)."""
    dev = rpc_server.device_name
    info = gguf_file.read(gemma3_270m)
    assert "output.weight" not in {t.name for t in info.tensors}
    n_layer = int(info.hparam("block_count"))
    last = {n for n in (t.name for t in info.tensors) if n.startswith(f"blk.{n_layer - 1}.")} | {"output_norm.weight"}
    if embedding == "accelerator":
        last.add("token_embd.weight")
    placement = {t.name: dev if t.name in last else "CPU" for t in info.tensors}  # every weight, as a plan
    with contextlib.closing(Llama(str(gemma3_270m), devices=["CPU", dev], placement=placement, n_ctx=256,
                                  n_gpu_layers=n_gpu_layers, n_threads=1, verbose=False)) as llm:
        embd = [t.device for t in llm.tensor_placements() if t.name == "token_embd.weight"]
        assert embd == (["CPU", dev] if embedding == "accelerator" else ["CPU"]), embd
        assert llm.tensor_devices()["token_embd.weight"] == (dev if embedding == "accelerator" else "CPU")
        assert llm.bytes_per_device()[dev] == sum(info.tensor(n).nbytes for n in last)
        assert len(llm.tokenize(b"hi")) > 0


# --- 3. bad input: a clear error naming the culprit -----------------------------------------


def test_placement_naming_a_missing_tensor(tiny_q8: Path) -> None:
    near = raises_cleanly(PlacementError, r"'blk\.0\.ffn_upp\.weight'.*did you mean 'blk\.0\.ffn_up\.weight'\?",
                          lambda: Llama(str(tiny_q8), placement={"blk.0.ffn_upp.weight": "CPU"}, **_kwargs()))
    assert tiny_q8.name in near
    far = raises_cleanly(PlacementError, r"names tensor 'nothing_like_it' .*does not have",
                         lambda: Llama(str(tiny_q8), placement={"nothing_like_it": "CPU"}, **_kwargs()))
    assert "did you mean" not in far
    both = raises_cleanly(PlacementError, r"\(and 1 more\)",
                          lambda: Llama(str(tiny_q8), placement={"a.weight": "CPU", "b.weight": "CPU"}, **_kwargs()))
    assert "'a.weight'" in both


@pytest.mark.parametrize("where", ["devices", "placement"])
def test_unknown_device_lists_the_known_ones(tiny_q8: Path, where: str) -> None:
    kw: dict[str, Any] = ({"devices": ["CPU", "NPU7"]} if where == "devices"
                          else {"placement": {"output.weight": "NPU7"}})
    raises_cleanly(UnknownDeviceError, r"unknown device 'NPU7' \(known devices: .*CPU",
                   lambda: Llama(str(tiny_q8), **kw, **_kwargs()))


def test_placement_device_not_in_devices(tiny_q8: Path, rpc_server: rpc.RpcServer) -> None:
    dev = rpc_server.device_name
    raises_cleanly(PlacementError, rf"device {re.escape(dev)}, which is not in devices=\['CPU'\]",
                   lambda: Llama(str(tiny_q8), devices=["CPU"], placement={"output.weight": dev}, **_kwargs()))


@pytest.mark.parametrize("where", ["devices", "placement"])
def test_unreachable_rpc_server_is_named_and_the_process_survives(tiny_q8: Path, where: str) -> None:
    dev = f"RPC[127.0.0.1:{closed_port(unregistered=True)}]"
    kw: dict[str, Any] = ({"devices": ["CPU", dev]} if where == "devices"
                          else {"placement": {"output.weight": dev}})
    endpoint = re.escape(dev[4:-1])
    raises_cleanly(RpcServerError, rf"cannot reach rpc-server at {endpoint}",
                   lambda: Llama(str(tiny_q8), **kw, **_kwargs()))
    # ggml-rpc would have aborted the process on a refused connection: still here, still working
    assert dev not in [d.name for d in devices.list_devices()]
    assert devices.resolve("CPU").name == "CPU"


def test_stopped_rpc_server(tiny_q8: Path) -> None:
    server = rpc.start_server(threads=1)
    dev = server.device_name
    server.stop()
    assert not server.alive()
    raises_cleanly(RpcServerError, rf"cannot reach rpc-server at {re.escape(server.endpoint)}",
                   lambda: Llama(str(tiny_q8), devices=["CPU", dev], placement={"output.weight": dev}, **_kwargs()))


def test_plan_file_for_another_model(tiny_q8: Path, tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"model": {"name": "other-model", "identity": "0123456789ab" * 5},
                                "placement": {"output.weight": "CPU"}, "devices": ["CPU"]}))
    message = raises_cleanly(PlanError, r"plan was made for model 'other-model' \(identity 0123456789ab\)",
                             lambda: Llama(str(tiny_q8), placement=str(path), **_kwargs()))
    assert str(path) in message and tiny_q8.name in message


@pytest.mark.parametrize("entry", [{"output.weight": 3}, {"output.weight": None}, {"output.weight": ["CPU"]},
                                   {7: "CPU"}], ids=["int-value", "none-value", "list-value", "int-key"])
def test_placement_entry_that_is_not_a_string(tiny_q8: Path, entry: dict[Any, Any]) -> None:
    (name, value), = entry.items()
    raises_cleanly(PlacementError, re.escape(f"must be str -> str, got {name!r} -> {value!r}"),
                   lambda: Llama(str(tiny_q8), placement=entry, **_kwargs()))


def test_refused_model_leaves_nothing_for_the_garbage_collector(tiny_q8: Path) -> None:
    # oallama's checks refuse before llama_cpp.Llama.__init__ runs: its __del__ -> close() must cope
    raises_cleanly(PlacementError, "nothing_like_it",
                   lambda: Llama(str(tiny_q8), placement={"nothing_like_it": "CPU"}, **_kwargs()))
    llm = Llama(str(tiny_q8), **_kwargs())
    llm.close()
    llm.close()  # idempotent, as llama_cpp.Llama.close is
    with pytest.raises(RuntimeError, match="closed"):
        llm.tensor_devices()


# --- 4. a server that dies mid-run ----------------------------------------------------------

_DIES_MID_RUN = textwrap.dedent("""
    import os, signal, sys, time
    from oallama import Llama
    from oallama.runtime import rpc

    server = rpc.start_server(threads=1)
    dev = server.device_name
    llm = Llama(sys.argv[1], devices=["CPU", dev], n_ctx=256, n_threads=2, verbose=False,
                placement={"output.weight": dev, "blk.1.ffn_down.weight": dev})
    assert llm.tensor_devices()["output.weight"] == dev
    print("loaded", flush=True)
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    print("server killed", flush=True)
    out = llm("The quick brown fox", max_tokens=8, temperature=0)
    print("GENERATED", out["choices"][0]["text"], flush=True)
""")


def test_rpc_server_dying_mid_run_is_reported_not_hung_on(tiny_q8: Path) -> None:
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # ggml's abort would otherwise attach gdb
    try:
        proc = subprocess.run([sys.executable, "-c", _DIES_MID_RUN, str(tiny_q8)], capture_output=True, text=True,
                              env=env, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"generation hung after the rpc-server died (no exit in 120 s); stderr: {e.stderr!r}")
    assert "loaded" in proc.stdout and "server killed" in proc.stdout, proc.stderr
    assert "GENERATED" not in proc.stdout
    assert proc.returncode != 0, proc.stderr
    # today ggml-rpc aborts (SIGABRT) with "Remote RPC server crashed or returned malformed response",
    # the documented behaviour; an RpcServerError naming the server would do as well
    assert re.search(r"RPC server crashed|RpcServerError: .*rpc-server", proc.stderr), proc.stderr
