"""llama-server's batches for several slots (`runtime.slots`): every token once, each batch within
n_batch; the ubatches llama.cpp's real decode splits them into, read from its graphs' nodes; and a
replay that generates what one sequence alone does."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from oallama import Llama, _core
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.slots import Split, replay, server_batches, split


@pytest.fixture(scope="module")
def tiny(synth_model) -> Path:
    return synth_model("tiny", "f16", n_layer=2)


@pytest.mark.parametrize(("n_seqs", "prompt", "gen", "n_batch", "later"),
                         [(1, 40, 5, 16, 0), (4, 40, 6, 16, 0), (4, 10, 6, 64, 0), (4, 10, 6, 64, 1), (3, 7, 1, 8, 0),
                          (8, 3, 4, 4, 0)],
                         ids=["np1", "np4-long-prompts", "np4-short-prompts", "np4-first-alone", "np3-gen1",
                              "np8-batch-below-slots"])
def test_the_server_batches_every_token_once(n_seqs: int, prompt: int, gen: int, n_batch: int, later: int) -> None:
    """Each sequence's prompt in order, then gen - 1 decode tokens each after the last; a token is
    sampled gen times per sequence; a batch holds at most n_batch prompt tokens beside its decode
    tokens, and its ubatches hold every token and output once."""
    batches = server_batches(n_seqs, prompt, gen, n_batch, later)
    for s in range(n_seqs):
        parts = [p for b in batches for p in b if p.seq == s]
        prompt_parts = [p for p in parts if not p.decode]
        assert [p.pos for p in prompt_parts] == [sum(q.n_tokens for q in prompt_parts[:k])
                                                 for k in range(len(prompt_parts))]
        assert sum(p.n_tokens for p in prompt_parts) == prompt and all(not p.decode for p in parts[:len(prompt_parts)])
        assert [p.pos for p in parts if p.decode] == list(range(prompt, prompt + gen - 1))
        assert sum(p.out for p in parts) == gen
    for b in batches:
        decode = sum(p.n_tokens for p in b if p.decode)
        assert sum(p.n_tokens for p in b) <= max(n_batch, decode)
        for unified in (False, True):
            ub = split(b, 8, unified)
            assert sum(u.n_tokens for u in ub) == sum(p.n_tokens for p in b)
            assert sum(u.n_outputs for u in ub) == sum(p.out for p in b)
            assert all(u.n_tokens <= 8 for u in ub)
    if n_seqs == 1:  # one slot: its prompt in batches of n_batch, then one decode token a loop
        assert len(batches) == -(-prompt // n_batch) + gen - 1


def _seen_ubatches(timer: _core.NodeTimer) -> list[tuple[int, int, int]]:
    """(tokens, query rows per stream, streams) of each ubatch a real decode ran: its token
    embeddings' columns and its first layer's attention scores [n_kv, rows, n_head, streams]."""
    nodes = timer.times()
    tokens = [r.ne[1] for r in nodes if r.name == "embd"]
    scores = [(r.ne[1], r.ne[3]) for r in nodes if r.name == "kq_soft_max-0"]
    assert len(tokens) == len(scores)
    return [(n, rows, streams) for n, (rows, streams) in zip(tokens, scores, strict=True)]


@pytest.mark.parametrize("unified", [False, True], ids=["streams", "unified"])
@pytest.mark.parametrize(("prompt", "later"), [(20, 0), (9, 0), (9, 1)], ids=["p20", "p9", "p9-first-alone"])
def test_the_ubatches_are_llama_cpp_s(unified: bool, prompt: int, later: int, tiny: Path) -> None:
    """3 slots, n_batch 32, n_ubatch 16: every batch the server would submit, decoded through a real
    load, runs as the ubatches `split` says -- a stream per sequence: equal tokens of consecutive
    sequences; one unified stream: the tokens in order."""
    n_seqs, n_ubatch = 3, 16
    batches = server_batches(n_seqs, prompt, 4, 32, later)
    want = []
    for b in batches:
        for u in split(b, n_ubatch, unified):
            want.append((u.n_tokens, u.n_tokens, 1) if unified else (u.n_tokens, u.n_tokens // u.n_seqs, u.n_seqs))
    with contextlib.closing(Llama(str(tiny), n_ctx=768, n_batch=32, n_ubatch=n_ubatch, n_threads=1, verbose=False,
                                  n_seq_max=n_seqs, kv_unified=unified)) as llm:
        toks = prompt_tokens(llm, prompt)
        with _core.NodeTimer(llm.native_context) as timer:
            replay(llm, toks, batches)
            seen = _seen_ubatches(timer)
    assert seen == want


def test_a_replay_generates_what_one_sequence_does(tiny: Path) -> None:
    """Each of 4 slots, their decode tokens batched beside later prompts, generates the
    one-sequence greedy tokens; its first token comes no later than its last."""
    with contextlib.closing(Llama(str(tiny), n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=1, verbose=False,
                                  n_seq_max=4, kv_unified=False)) as llm:
        toks = prompt_tokens(llm, 40)
        g = replay(llm, toks, server_batches(4, 40, 8, 32))
        alone = timed_generate(llm, toks, 8).tokens
    assert g.tokens == [alone] * 4
    assert all(0 < f <= e <= g.wall_s for f, e in zip(g.first_s, g.end_s, strict=True))
    assert g.first_s == sorted(g.first_s)  # slot by slot


def test_split_makes_llama_cpp_s_equal_split_of_a_mixed_batch() -> None:
    """A decode token of sequence 0 beside 20 prompt tokens of sequence 1, n_ubatch 16: one token of
    each (2 tokens), then the rest of the prompt alone (16, then 2)."""
    batches = server_batches(2, 20, 3, 21)  # 0's prompt and 1 token of 1's; then 0's token beside 19 of 1's
    assert [[(p.seq, p.n_tokens, p.decode) for p in b] for b in batches[:2]] == [
        [(0, 20, False), (1, 1, False)], [(0, 1, True), (1, 19, False)]]
    assert split(batches[1], 16, unified=False) == [Split(2, 2, 1), Split(16, 1, 0), Split(2, 1, 1)]
