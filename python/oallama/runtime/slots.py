"""The batches llama-server runs for several slots, the ubatches llama.cpp splits them into, and
their replay through a load.

llama-server (continuous batching, its default) forms one batch per loop of `update_slots`
(tools/server/server-context.cpp): first the last sampled token of every slot that is generating,
then prompt tokens of the slots still reading their prompt, slot after slot, while the batch holds
fewer than n_batch tokens. llama_decode splits a batch into ubatches (src/llama-batch.cpp): over one
KV stream (`--kv-unified`, or one sequence) the tokens in order, n_ubatch at a time
(`split_simple`); with a stream per sequence, the same number of tokens of each of a run of
consecutive sequence ids, as many as n_ubatch holds (`split_equal`, sequential).

So N requests do not run as N prompts and then decode passes of N tokens (what
`generate.timed_parallel` runs): the first prompt runs alone, then every batch carries the earlier
slots' next tokens beside the next prompt's, and the slots finish one loop apart
(bench/results/2026-11-27-vm-server-slots: with 4 slots, the lockstep's wall within the machine's
spread but a 1.24-1.29x mean time to first token; this module's replay within 2.2% of the stock
server's on both over 6 rounds, within 4.4% and 17% in a later 4-round run)::

    >>> batches = server_batches(n_seqs=2, prompt=3, gen=2, n_batch=4)
    >>> [[(p.seq, p.n_tokens) for p in b] for b in batches]
    [[(0, 3), (1, 1)], [(0, 1), (1, 2)], [(1, 1)]]
    >>> [split(b, n_ubatch=4, unified=False) for b in batches]
    [[Split(n_tokens=2, n_seqs=2, n_outputs=0), Split(n_tokens=2, n_seqs=1, n_outputs=1)], ...]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .generate import SeqBatch


@dataclass(frozen=True)
class Part:
    """One sequence's tokens in a batch: n_tokens after `pos` cells of its stream; `out`: the last
    one's logits are read (a token is sampled); `decode`: the sequence's last sampled token (else
    prompt tokens)."""

    seq: int
    pos: int
    n_tokens: int
    out: bool
    decode: bool


class Split(NamedTuple):
    """A ubatch: n_tokens of n_seqs sequences, n_outputs rows of logits read."""

    n_tokens: int
    n_seqs: int
    n_outputs: int


def server_batches(n_seqs: int, prompt: int, gen: int, n_batch: int, later: int = 0) -> list[list[Part]]:
    """The batches llama-server's update_slots forms for n_seqs requests (slot s takes request s),
    each a prompt of `prompt` tokens generating `gen`. The requests are there before its first loop;
    or, later > 0, the first alone and the others `later` loops after it (requests sent together
    reach the server a few ms apart: a short prompt's first loop may run before the others are in)."""
    if n_seqs < 1 or prompt < 1 or gen < 1 or n_batch < 1:
        raise ValueError(f"server_batches: need n_seqs, prompt, gen and n_batch >= 1 (got {n_seqs}, {prompt}, "
                         f"{gen}, {n_batch})")
    read = [0] * n_seqs  # prompt tokens decoded
    sampled = [0] * n_seqs  # tokens generated
    out: list[list[Part]] = []
    while True:
        batch = [Part(s, prompt + sampled[s] - 1, 1, True, True) for s in range(n_seqs)
                 if read[s] == prompt and 0 < sampled[s] < gen]
        size = len(batch)
        for s in range(n_seqs):
            if size >= n_batch or (s > 0 and len(out) < later):
                continue
            if read[s] < prompt:
                take = min(prompt - read[s], n_batch - size)
                batch.append(Part(s, read[s], take, read[s] + take == prompt, False))
                size += take
        if not batch:
            return out
        for p in batch:
            if p.decode:
                sampled[p.seq] += 1
            else:
                read[p.seq] += p.n_tokens
                sampled[p.seq] = 1 if read[p.seq] == prompt else 0
        out.append(batch)


def split(batch: Sequence[Part], n_ubatch: int, unified: bool) -> list[Split]:
    """The ubatches llama_decode makes of `batch`: split_simple over one KV stream (unified), else
    split_equal(n_ubatch, sequential)."""
    toks = [(p.seq, p.out and i == p.n_tokens - 1) for p in batch for i in range(p.n_tokens)]
    if unified:
        chunks = [toks[a:a + n_ubatch] for a in range(0, len(toks), n_ubatch)]
        return [Split(len(c), len({s for s, _ in c}), sum(o for _, o in c)) for c in chunks]
    used = [False] * len(toks)
    by_seq: dict[int, list[int]] = {}
    for i, (s, _) in enumerate(toks):
        by_seq.setdefault(s, []).append(i)
    out = []
    while not all(used):
        cur: list[int] = []  # sequences of the ubatch: consecutive ids, in batch order
        for i, (s, _) in enumerate(toks):
            if not used[i] and s not in cur and (not cur or s == cur[-1] + 1):
                cur.append(s)
                if len(cur) > n_ubatch:  # as llama.cpp stops looking (a pass of one token each)
                    break
        left = {s: [i for i in by_seq[s] if not used[i]] for s in cur}
        take = 0  # tokens of each sequence
        while all(take < len(left[s]) for s in cur):
            for s in cur:
                used[left[s][take]] = True
            take += 1
            if (take + 1) * len(cur) > n_ubatch:
                break
        out.append(Split(take * len(cur), len(cur), sum(toks[i][1] for s in cur for i in left[s][:take])))
    return out


@dataclass
class SlotsGeneration:
    """What `replay` generated and when: each sequence's tokens; the seconds from the first batch
    to each sequence's first and last token; the wall of every batch."""

    tokens: list[list[int]]
    first_s: list[float]
    end_s: list[float]
    wall_s: float


def replay(llm: Any, prompt: Sequence[int], batches: Sequence[Sequence[Part]]) -> SlotsGeneration:
    """Decode `batches` (every sequence's prompt is `prompt`) through oallama's load `llm` as
    llama-server submits them, each batch in one llama_decode, greedy tokens. The context holds as
    many sequences as the batches name (oallama.Llama's n_seq_max); its memory is cleared before
    and after."""
    import llama_cpp
    import numpy as np

    ctx = llm.ctx
    n_vocab = llm.n_vocab()
    mem = llama_cpp.llama_get_memory(ctx)
    llama_cpp.llama_memory_clear(mem, True)
    n_seqs = 1 + max(p.seq for b in batches for p in b)
    tokens: list[list[int]] = [[] for _ in range(n_seqs)]
    first = [0.0] * n_seqs
    end = [0.0] * n_seqs
    sb = SeqBatch(max(sum(p.n_tokens for p in b) for b in batches))
    try:
        t0 = time.perf_counter()
        for b in batches:
            items, outs = [], []
            for p in b:
                for i in range(p.n_tokens):
                    read = p.out and i == p.n_tokens - 1
                    if read:
                        outs.append((p.seq, len(items)))
                    items.append((tokens[p.seq][-1] if p.decode else prompt[p.pos + i], p.pos + i, p.seq, read))
            sb.decode(llm, items)
            now = time.perf_counter() - t0
            for s, i in outs:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                tokens[s].append(int(logits.argmax()))
                first[s] = first[s] or now
                end[s] = now
        return SlotsGeneration(tokens, first, end, time.perf_counter() - t0)
    finally:
        sb.close()
        llama_cpp.llama_memory_clear(mem, True)
