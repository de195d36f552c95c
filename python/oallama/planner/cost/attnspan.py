"""Attention's growth with the KV cache, from spans of the real graph timed whole at two KV
lengths: what calibration fits the attention kinds' lines to (calfit.span_lines).

A calibration fits each op kind's line through node-by-node times, each node timed alone less
what timing a node alone adds (calfit.node_overhead_us), and that subtraction's noise lands in the
lines: two characterisations of this VM's CPU (2 threads) put the attention matmuls at 1.11e-5 and
2.16e-5 us per multiply-add (bench/results/2026-11-26-vm-heldout-devicemodel-v4), and one fresh
calibration of Phi-3 fitted its decode KQ / KQV flat, so that a decode after 2048 tokens cost what
one after 256 does (bench/results/2026-11-26-vm-heldout-method29).

The same pass over a short and a long KV cache differs only in the nodes whose work grows with
the cache (KQ, softmax, KQV; flash attention's one node). Each layer's run of them is timed as
one span (a stop before it and one at its end: nothing synchronised inside), at both lengths,
short-long-short. The calibration's fit (calfit.span_factors, calfit.span_lines) scales the lines of
those kinds, per device and pass kind (a decode pass, "1"; a prompt pass, "n"), so that they give the
spans' growth and their short times; the per-node overhead is in both lengths' spans alike and
cancels.

  measure   the spans of a decode pass and of a prompt pass in a model's host load and, with an
            accelerator, in its accelerator load; the prompt pass's spans also after PROMPT_TAIL cells
            written (runtime.kvstate); and that prompt pass's splits run whole after no cache, a pass
            size (the workloads' ubatch) the calibration's loads do not time
  measure_decode  the decode pass's spans also after a workload's own past (cells), in a cache written
            from a short one: a decode's attention jumps where its K and V leave the CPU's caches, at a
            past no fixed one tells (calibrate.with_decode_tail)
  cost_s    what measuring them takes, estimated from a prompt pass's time per token (decode_cost_s:
            measure_decode's, from a decode pass's time)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ... import _core
from ...errors import OallamaError, ProfileError
from .calfit import kind, work
from .realpass import VIEW_OPS, layers_that_fit, timed_eval

T = TypeVar("T")

LONG_PAST = 1024  # KV cells before the long passes
SHORT_DECODE_PAST = 32  # ... before the short decode pass (a short prompt pass: none)
PROMPT_TOKENS = 512  # tokens of the prompt pass: llama.cpp's default ubatch (the workloads'); a line through 0 and
# 1024 cells gives the attention after 3584 22-23% short in 512-token passes, 34-43% in 128-token ones (mid 2L,
# Llama-3-8B 1L, alternated in one load): bench/results/2026-11-28-vm-attention-curve
REPS = 5  # timed runs of each pass, each length, each of the short-long-short blocks
PROMPT_TAIL = 3072  # KV cells before the prompt pass's further spans, in a cache written from the long one
# (runtime.kvstate): the prompt lines bend at the long pass's work to pass through them (calfit.span_lines)


@dataclass
class WholePass:
    """A pass timed in the spans' load: its nodes (one node-by-node run) and each split's time run whole
    (us, median; splits as `split_ends` cuts the nodes)."""

    load: str
    n_tokens: int
    n_past: int
    nodes: list[_core.NodeTime]
    split_us: list[float]


@dataclass
class Timed:
    """What `measure` timed: the attention spans (dicts, as calfit.span_factors reads them) and the whole
    prompt passes."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    whole: list[WholePass] = field(default_factory=list)


def cost_s(prompt_us_per_token: float) -> float:
    """Seconds `measure` takes in one load without tails, about: the long prefix filled twice and each
    block's passes."""
    return prompt_us_per_token / 1e6 * (2 * LONG_PAST + 3 * REPS * (PROMPT_TOKENS + 1))


def tail_cost_s(prompt_us_per_token: float) -> float:
    """Seconds the prompt tail adds, about: the long prefix filled again, a long block and a tail block (its
    passes' attention up to PROMPT_TAIL / LONG_PAST times the long ones': counted twice)."""
    return prompt_us_per_token / 1e6 * (LONG_PAST + 3 * REPS * PROMPT_TOKENS)


def works(nodes: Sequence[_core.NodeTime], n_tokens: int, n_past: int) -> list[float]:
    cells = n_past + (n_tokens + 1) / 2  # the mean token's attended cells (flash attention)
    return [work(r.op, r.ne, r.nbytes, r.src_ne, r.src_bytes, attended=cells) for r in nodes]


def spans(short: Sequence[_core.NodeTime], long: Sequence[_core.NodeTime], n_tokens: int, short_past: int,
          long_past: int) -> list[tuple[int, int]]:
    """(first, last) node positions of each run of nodes whose work grows with the KV cache (views
    between them aside; a layer's KQ, softmax and KQV, or its flash attention node) on one device:
    the same pass after short_past and after long_past cells, node by node."""
    if [r.op for r in short] != [r.op for r in long]:
        raise ProfileError("attention spans: the pass's graph differs between the two KV lengths")
    ws, wl = works(short, n_tokens, short_past), works(long, n_tokens, long_past)
    out: list[tuple[int, int]] = []
    first = last = -1
    for k, r in enumerate(short):
        if r.op in VIEW_OPS:
            continue
        if wl[k] > ws[k] and first >= 0 and r.device == short[last].device:
            last = k
            continue
        if first > 0:
            out.append((first, last))
        first = last = k if wl[k] > ws[k] else -1
    if first > 0:
        out.append((first, last))
    return out


def time_stops(llm: Any, tokens: list[int], n: int, n_past: int, stops: list[int], reps: int) -> list[list[float]]:
    """reps runs of the pass of n tokens after n_past, stopped at `stops`: per run, the range of each
    stop (us)."""
    prefix, toks = tokens[:n_past], tokens[n_past:n_past + n]
    with _core.NodeTimer(llm.native_context) as timer:
        runs = [timed_eval(llm, timer, prefix, toks, stops) for _ in range(reps)]
    return [[r.nodes[k].range_us for k in stops] for r in runs]


def node_list(llm: Any, tokens: list[int], n: int, n_past: int) -> list[_core.NodeTime]:
    """The pass's nodes, run node by node (also its warm-up: graph built, buffers allocated)."""
    with _core.NodeTimer(llm.native_context) as timer:
        return list(timed_eval(llm, timer, tokens[:n_past], tokens[n_past:n_past + n], []).nodes)


def _tails(llm: Any, tokens: list[int], n: int, nodes: Sequence[_core.NodeTime], stops: list[int], reps: int
           ) -> dict[int, tuple[list[_core.NodeTime], list[list[float]]]]:
    """The n-token pass after LONG_PAST cells, then after PROMPT_TAIL in a cache written from those
    (kvstate.widen), then after LONG_PAST again: per past its node list and its runs' stop ranges (us;
    LONG_PAST's both times). Empty where the cache's state is a layout kvstate does not know."""
    from ...runtime import kvstate

    llm.reset()
    llm.eval(tokens[:LONG_PAST])
    real = kvstate.seq_state(llm)
    wide = kvstate.widen(real, PROMPT_TAIL)
    if wide is None:
        return {}
    out: dict[int, tuple[list[_core.NodeTime], list[list[float]]]] = {}
    for past in (LONG_PAST, PROMPT_TAIL, LONG_PAST):
        kvstate.restore(llm, real if past == LONG_PAST else wide, tokens[:past])
        listed = node_list(llm, tokens, n, past)
        if [r.op for r in listed] != [r.op for r in nodes]:
            raise ProfileError(f"attention spans: the {n}-token pass's graph after {past} cells differs")
        runs = time_stops(llm, tokens, n, past, stops, reps)
        out[past] = (listed, out[past][1] + runs if past in out else runs)
    return out


def split_ends(nodes: Sequence[_core.NodeTime]) -> list[int]:
    """Positions of the last node before each change of device, and of the last node."""
    return [k for k, r in enumerate(nodes) if k == len(nodes) - 1 or nodes[k + 1].device != r.device]


def _whole(nodes: Sequence[_core.NodeTime], stops: list[int], runs: Sequence[Sequence[float]]) -> list[float]:
    """Per split of a pass (its nodes, `split_ends`), the median over `runs` (each stop's range, us) of
    its stops' ranges summed: the split's time run whole (ranges start where the last one stopped)."""
    out, first = [], -1
    for end in split_ends(nodes):
        cols = [i for i, k in enumerate(stops) if first < k <= end]
        out.append(statistics.median(sum(r[i] for i in cols) for r in runs))
        first = end
    return out


def _measure_load(llm: Any, tokens: list[int], what: str, reps: int, tails: bool) -> Timed:
    passes = [(PROMPT_TOKENS, 0), (1, SHORT_DECODE_PAST)]
    # node lists, short passes first (the long prefix is filled once, below), and each pass's spans and stops
    shorts = {n: node_list(llm, tokens, n, past) for n, past in passes}
    longs = {n: node_list(llm, tokens, n, LONG_PAST) for n, _ in passes}
    found = {n: spans(shorts[n], longs[n], n, past, LONG_PAST) for n, past in passes}
    stops = {n: sorted({k for a, b in sp for k in (a - 1, b)}) for n, sp in found.items()}
    # the prompt pass also stops at its splits' ends: its splits' times run whole, a pass size the calibration's
    # own loads do not reach (they time 32-128 tokens; the workloads' passes are 512)
    inside = {k for a, b in found[PROMPT_TOKENS] for k in range(a, b)}  # a span is timed as one range
    stops[PROMPT_TOKENS] = sorted({*stops[PROMPT_TOKENS], *(set(split_ends(shorts[PROMPT_TOKENS])) - inside)})
    times: dict[tuple[int, str], list[list[float]]] = defaultdict(list)
    for block, kv in (("short", None), ("long", LONG_PAST), ("short", None)):
        for n, past in passes:
            if found[n]:
                times[(n, block)] += time_stops(llm, tokens, n, past if kv is None else kv, stops[n], reps)
    n = PROMPT_TOKENS
    tail = _tails(llm, tokens, n, longs[n], stops[n], reps) if tails and found[n] else {}
    tail_works = works(tail[PROMPT_TAIL][0], n, PROMPT_TAIL) if tail else []
    out = []
    for n, past in passes:
        ws, wl = works(shorts[n], n, past), works(longs[n], n, LONG_PAST)
        for i, (a, b) in enumerate(found[n]):
            col = stops[n].index(b)
            keep = [k for k in range(a, b + 1) if shorts[n][k].op not in VIEW_OPS]
            span = {"load": what, "n_tokens": n, "short_past": past, "long_past": LONG_PAST, "span": i,
                    "device": shorts[n][b].device, "nodes": [[kind(shorts[n][k].op, shorts[n][k].ne), ws[k], wl[k]]
                                                             for k in keep],
                    "short_us": statistics.median(r[col] for r in times[(n, "short")]),
                    "long_us": statistics.median(r[col] for r in times[(n, "long")])}
            if n == PROMPT_TOKENS and tail:  # the tail's block against the long passes around it (calfit._span_tails)
                span["tail_base_us"] = statistics.median(r[col] for r in tail[LONG_PAST][1])
                span["tails"] = [{"past": PROMPT_TAIL, "us": statistics.median(r[col] for r in tail[PROMPT_TAIL][1]),
                                  "works": [tail_works[k] for k in keep]}]
            out.append(span)
    whole = []
    if found[PROMPT_TOKENS]:
        n = PROMPT_TOKENS
        whole.append(WholePass(what, n, 0, shorts[n], _whole(shorts[n], stops[n], times[(n, "short")])))
    return Timed(out, whole)


def measure(path: str | Path, devices: Sequence[str], *, threads: int, mmap: bool = True,
            op_offload: bool = True, attention: Mapping[str, Any], reps: int = REPS, tails: bool = True) -> Timed:
    """The attention spans of the model at `path` in a decode pass and a prompt
    pass after a short and a long KV cache: its host load and, with an accelerator (devices: the CPU
    first), the load with every layer that fits on it. Per span: its load, pass, device, non-view
    nodes [kind (calfit.kind), work short, work long] and median times at both lengths (us); and per
    load, the prompt pass after no cache: its nodes and its splits' times run whole. tails: the prompt spans
    also after PROMPT_TAIL cells (a span's "tails", "tail_base_us"), where kvstate can write its cache."""
    n_ctx = -(-((PROMPT_TAIL if tails else LONG_PAST) + PROMPT_TOKENS + 1) // 256) * 256
    out = Timed([], [])
    for got in _each_load(path, devices, n_ctx, lambda llm, tokens, what: _measure_load(llm, tokens, what, reps, tails),
                          threads=threads, mmap=mmap, op_offload=op_offload, attention=attention):
        out.spans += got.spans
        out.whole += got.whole
    return out


def measure_decode(path: str | Path, devices: Sequence[str], past: int, *, threads: int, mmap: bool = True,
                   op_offload: bool = True, attention: Mapping[str, Any], reps: int = REPS) -> list[dict[str, Any]]:
    """The decode pass's attention spans after SHORT_DECODE_PAST, LONG_PAST and `past` cells, in the loads
    `measure` takes: span dicts as `measure` gives them and "decode_past", each with a tail at `past` ("tails":
    past, us, its nodes' works, and "base_us", the LONG_PAST time of the same run). Empty where kvstate cannot write
    the cache (a sliding window's second cache).

    Why per workload: a decode's attention jumps 6-8x between 4096 and 8192 cells on some models and not
    on others, and lines bent at fixed pasts put half that jump between them, where whole passes show none
    (bench/results/2026-11-28-vm-decode-tails): a decode is timed at the past the workload decodes at."""
    return [s for got in _each_load(path, devices, -(-(past + 2) // 256) * 256,
                                    lambda llm, tokens, what: _decode_load(llm, tokens, what, past, reps),
                                    threads=threads, mmap=mmap, op_offload=op_offload, attention=attention)
            for s in got]


def decode_cost_s(decode_us: float, past: int) -> float:
    """Seconds `measure_decode` takes in one load, about, from a decode pass's time after few cells: its
    timed passes (a pass after `past` cells taken as up to past / LONG_PAST times the attention's growth,
    counted as that many short passes at most) and their node-by-node runs."""
    return decode_us / 1e6 * (5 * REPS + 3) * (1 + min(past / LONG_PAST, 8) / 4)


def _decode_load(llm: Any, tokens: list[int], what: str, past: int, reps: int) -> list[dict[str, Any]]:
    """measure_decode in one load: a real SHORT_DECODE_PAST-cell cache, written on to `past` cells
    (kvstate.widen), the LONG_PAST passes run in its first LONG_PAST cells; blocks short, long, tail,
    long, short."""
    from ...runtime import kvstate

    llm.reset()
    llm.eval(tokens[:SHORT_DECODE_PAST])
    wide = kvstate.widen(kvstate.seq_state(llm), past)
    if wide is None:
        return []
    pasts = {"short": SHORT_DECODE_PAST, "long": LONG_PAST, "tail": past}
    listed: dict[str, list[_core.NodeTime]] = {}
    for block in ("short", "long", "tail"):
        if block != "short":  # a pass after fewer cells than written evaluates on from its first ones (timed_eval)
            kvstate.restore(llm, wide, tokens[:past])
        listed[block] = node_list(llm, tokens, 1, pasts[block])
    if not [r.op for r in listed["short"]] == [r.op for r in listed["long"]] == [r.op for r in listed["tail"]]:
        raise ProfileError(f"attention spans: the decode pass's graph after {past} cells differs")
    found = spans(listed["short"], listed["long"], 1, SHORT_DECODE_PAST, LONG_PAST)
    stops = sorted({k for a, b in found for k in (a - 1, b)})
    times: dict[str, list[list[float]]] = defaultdict(list)
    for block in ("short", "long", "tail", "long", "short"):
        if block != "short":
            kvstate.restore(llm, wide, tokens[:past])
        times[block] += time_stops(llm, tokens, 1, pasts[block], stops, reps)
    w = {b: works(listed[b], 1, pasts[b]) for b in pasts}
    out = []
    for i, (a, b) in enumerate(found):
        col = stops.index(b)
        keep = [k for k in range(a, b + 1) if listed["short"][k].op not in VIEW_OPS]
        us = {blk: statistics.median(r[col] for r in runs) for blk, runs in times.items()}
        out.append({"load": what, "n_tokens": 1, "short_past": SHORT_DECODE_PAST, "long_past": LONG_PAST, "span": i,
                    "decode_past": past, "device": listed["short"][b].device,
                    "nodes": [[kind(listed["short"][k].op, listed["short"][k].ne), w["short"][k], w["long"][k]]
                              for k in keep],
                    "short_us": us["short"], "long_us": us["long"],
                    "tails": [{"past": past, "us": us["tail"], "works": [w["tail"][k] for k in keep],
                               "base_us": us["long"]}]})
    return out


def _each_load(path: str | Path, devices: Sequence[str], n_ctx: int, fn: Callable[[Any, list[int], str], T], *,
               threads: int, mmap: bool, op_offload: bool, attention: Mapping[str, Any]) -> list[T]:
    """fn(llama, n_ctx prompt tokens, load) in the model's host load ("host") and, with an accelerator
    (devices: the CPU first), the load with every layer that fits on it ("accelerator"), one at a time."""
    from ...model import gguf_file
    from ...runtime import devices as devmod
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    info = gguf_file.check_model(path)
    n_layer = int(info.hparam("block_count", 0))
    accs = [devmod.resolve(d) for d in devices if not devmod.resolve(d).is_host]
    loads: list[tuple[str, dict[str, Any]]] = [("host", {"n_gpu_layers": 0, "op_offload": False})]
    if accs:
        loads.append(("accelerator", {"n_gpu_layers": layers_that_fit(info, accs[0], n_layer),
                                      "op_offload": op_offload}))
    out = []
    for what, kw in loads:
        try:
            llm = Llama(str(path), devices=[a.name for a in accs] or None, n_ctx=n_ctx, n_batch=PROMPT_TOKENS,
                        n_ubatch=PROMPT_TOKENS, n_threads=threads, n_threads_batch=threads, use_mmap=mmap,
                        verbose=False, **attention, **kw)
        except (OallamaError, ValueError, RuntimeError) as e:
            raise ProfileError(f"attention spans: could not load {path} ({what} load): {e}") from None
        try:
            out.append(fn(llm, prompt_tokens(llm, n_ctx), what))
        finally:
            llm.close()
    return out
