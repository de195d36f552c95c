"""`oallama.run`: timed generation, and the `oallama run` command with a placement across this
process's CPU and a loopback rpc-server."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from oallama import Llama, cli
from oallama.runtime.generate import timed_generate

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(tiny_q8: Path) -> Iterator[Llama]:
    model = Llama(str(tiny_q8), n_ctx=256, verbose=False, n_threads=2, n_threads_batch=2, seed=1234)
    yield model
    model.close()


@pytest.mark.parametrize("n", [1, 8])
def test_timed_generate_gives_exactly_n_tokens_with_their_times(llm: Llama, n: int) -> None:
    gen = timed_generate(llm, PROMPT, n)
    assert len(gen.tokens) == n and len(gen.token_times_s) == n
    assert gen.prompt_tokens == len(llm.tokenize(PROMPT.encode(), add_bos=True))
    assert gen.text == llm.detokenize(gen.tokens).decode(errors="replace")
    assert gen.ttft_s > 0 and gen.ttft_s == gen.token_times_s[0]
    assert all(b > a for a, b in zip(gen.token_times_s, gen.token_times_s[1:], strict=False))
    assert gen.e2e_s == gen.token_times_s[-1]
    if n == 1:
        assert math.isnan(gen.tpot_s)  # no gap to average
    else:
        assert gen.tpot_s > 0


def test_timed_generate_is_the_greedy_continuation(llm: Llama) -> None:
    gen = timed_generate(llm, PROMPT, 8)
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True)
    llm.reset()
    greedy: list[int] = []
    for tok in llm.generate(tokens, temp=0.0, reset=True):
        greedy.append(int(tok))
        if len(greedy) == 8:
            break
    assert gen.tokens == greedy
    assert timed_generate(llm, tokens, 8).tokens == greedy  # a token list works as the prompt too


def test_timed_generate_with_a_seed_is_reproducible(llm: Llama) -> None:
    first = timed_generate(llm, PROMPT, 8, temperature=0.8, seed=7)
    assert timed_generate(llm, PROMPT, 8, temperature=0.8, seed=7).tokens == first.tokens


def test_run_command_with_a_local_rpc_server(tiny_q8: Path) -> None:
    # a subprocess: the command starts and stops its own rpc-server, which must not stay registered
    # (as a dead device) in the test process
    proc = subprocess.run([sys.executable, "-m", "oallama", "run", str(tiny_q8), "--rpc-local", "--split", "ffn",
                           "-n", "8", "--threads", "2", "--ctx", "256", "-p", PROMPT],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    m = re.search(r"started rpc-server (\S+) as device (RPC\[\S+\])", proc.stderr)
    assert m, proc.stderr
    dev = m[2]
    # --split ffn: the feed-forward matrices of every layer and the output head on the rpc-server [B],
    # everything else (attention, norms, embedding) on the CPU [A]; counted from the file (gguf-py)
    tensors = gguf.GGUFReader(tiny_q8).tensors
    ffn = {"ffn_gate", "ffn_up", "ffn_down"}

    def side(name: str) -> str:
        kind = name.split(".")[2] if name.startswith("blk.") else name
        return "B" if kind in ffn or name == "output.weight" else "A"

    for tag, device in (("A", "CPU"), ("B", dev)):
        mine = [t for t in tensors if side(t.name) == tag]
        mib = sum(int(t.n_bytes) for t in mine) / 2**20
        assert re.search(rf"^\s+\[{tag}\] {re.escape(device)}\s+{len(mine)} tensors\s+{mib:.1f} MiB\s+\(.*\)$", out, re.M), out
    # one line per layer: each of the layer's weights with its side
    layers = sorted({int(t.name.split(".")[1]) for t in tensors if t.name.startswith("blk.")})
    assert len(layers) == int(gguf.GGUFReader(tiny_q8).fields["llama.block_count"].contents())
    for i in layers:
        line = re.search(rf"^\s+blk\.{i}\s+(.*)$", out, re.M)
        assert line, f"no line for layer {i}:\n{out}"
        cells = dict(re.findall(r"(\S+)\[([AB])\]", line[1]))
        mine = [t.name for t in tensors if t.name.startswith(f"blk.{i}.")]
        assert cells == {n.split(".")[2]: side(n) for n in mine}, line[0]
        assert {"attn_q", "ffn_up"} <= set(cells) and len(set(cells.values())) == 2  # both sides in every layer
    other = re.search(r"^\s+-\s+(.*)$", out, re.M)
    assert other and dict(re.findall(r"(\S+)\[([AB])\]", other[1])) == {
        t.name: side(t.name) for t in tensors if not t.name.startswith("blk.")}, out
    assert re.search(r"TTFT [\d.]+ ms\s+TPOT [\d.]+ ms/token\s+8 tokens", out), out
    assert f"prompt: {PROMPT!r}" in out


@pytest.mark.parametrize("devices", [None, "CPU"], ids=["no-devices", "devices-CPU-only"])
def test_split_without_a_second_device(tiny_q8: Path, capsys: pytest.CaptureFixture[str],
                                       devices: str | None) -> None:
    argv = ["run", str(tiny_q8), "--split", "ffn", "-n", "2"] + (["--devices", devices] if devices else [])
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert "oallama run: error: --split needs a second device (--devices CPU,DEV or --rpc-local)" in captured.err
    assert "TTFT" not in captured.out
