"""Calibration in the real graph: what the one-op profile cannot see.

The profile times each weight-bearing matmul alone. A real pass also runs every other op
(norms, rope, attention's KQ / softmax / KQV over the KV cache, copies into the cache, glue),
pays a fixed cost outside the graph (graph build or reuse, inputs, logits back to the host,
sampling, Python), and its weight matmuls may run faster or slower than alone. Calibration
runs the model's real graph through llama.cpp with the scheduler's eval callback
(`_core.NodeTimer`) and fits, per device:

  node_overhead_us   what timing an op alone adds (its own launch + synchronisation), from the
                     same splits run node by node and whole (`node_overhead_us`);
  ops[op]            every other op:  us = a + b * work, least squares over the nodes seen on
                     that device (work = multiply-adds of an activation x activation matmul,
                     else bytes read + written; see `work`);
  matmul_scale       real-graph / profile compute time of the weight matmuls (ratio of sums; one
                     for every shape: a share per shape did no better on the held-out set,
                     bench/results/2026-11-26-vm-refit-ablation);
  anchor             both scaled so that the timed splits' nodes sum to the splits' measured
                     times (node-by-node times give each op's part, whole splits the totals);
  anchors            and then per pass size (tokens): where a node's time alone is mostly its
                     synchronisation (an rpc-server's round trip), the fits cannot tell a decode
                     op's few microseconds from a prompt op's hundreds; each pass size's splits
                     fix its own total (a pass of another size: the factors of the timed sizes
                     around it, interpolated on log tokens), with the lines its predictions use
                     where its node times were mostly that synchronisation (`calfit.sync_bound`);

and `pass_us = a + b * n_tokens`: a prompt pass's wall time outside its graph (llama.cpp's decode
around the graph, paired with the graph's own time within each split-mode run, plus sampling the
token), from the host load (with an accelerator, reading its results back is the model's copies).

The attention's growth with the KV cache is timed apart, in spans of the real graph run whole after
a short and a long cache (attnspan.py), when that is cheap (`SPANS_S`): the attention kinds' lines are
fitted to them (`calfit.span_lines`), as node-by-node times split a pass into ops noisily. A workload
that decodes after more cells than those has its decode spans timed after its own past too, once, added
to the cached calibration (`with_decode_tail`).

Split-mode runs of a pass that spread more than WIDE_SPREAD (a software GPU's threads sharing the
host's cores: lavapipe's decode pass 134-273 ms) are repeated, up to 4x, before their median is kept.

Two loads are timed: every layer on the host (op offload off: nothing streams), and every
layer that fits on the accelerator; token counts 1 (decode, at two KV lengths) and two prefill
sizes (the second, 4x the first, else 2x, when its passes are cheap; a pass between timed sizes
takes their factors interpolated). A decode pass reuses its predecessor's graph and a prompt pass
builds its own, so their times outside the graph are measured apart (`decode_us`). A third load
streams every host weight to the accelerator in a decode pass (`stream`):
weights leave from the memory llama.cpp loaded them into, which a one-op copy of a fresh buffer
does not see (on an H100 the profiled link moved 54 GB/s, weights streamed in real loads at 8
GB/s); the plan derives the rate from it in the model's own terms (`context.stream_link`).
A fourth load scatters the weights: every other weight matmul's weight on the host, the rest on the
accelerator, op offload off, so that a decode pass changes device at almost every weight, as the
planners' scattered placements do (`scatter`); what it takes beyond the model's terms is a cost per
split the one-op launch does not see (a CPU<->GPU synchronisation at each change of device: on an
H100, MiniCPM3's 353-split plan decoded 40 us per split slower than predicted;
`context.split_cost`). A mixture of experts' routing is recorded in one prompt pass on the host (how
many distinct experts a pass of n tokens touches per layer: what a streamed expert tensor copies;
routing.py). Every round also times the host's passes with the weights a default load repacks (ggml's
kernels' layout) repacked and in plain memory, alternating pass by pass in one load that holds both
(`layouts`, the round with the median ratio kept), and each pair a pass per size node by node in each (medians
kept): a plan that lays weights
out costs each shape's plain time at its ratio of node times, all scaled to the walls' ratio
(`context.plain_times`; the full 8B's decode ran 1.38x slower plain, where the one-op profile gave
1.09x, its attention matrices 1.67x against 1.11x). Calibration is a step of `profile` (cached with it;
`--no-calibrate` skips it).
This module measures; the fits are calfit.py's.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import _core
from ...errors import OallamaError, ProfileError
from ...runtime.kvcache import NO_FLASH_ATTN
from ..graph import AttentionLayers, attention_layers
from . import attnspan, outside
from .calfit import Calibration, fit, kind, line, refitted, work
from .realpass import (
    REPACK,
    VIEW_OPS,
    Run,
    decode_load_kwargs,
    layers_that_fit,
    measure_layouts,
    measure_scatter,
    measure_stream,
    timed_eval,
)
from .rounds import Round, merge_rounds
from .routing import measure as measure_routing

VERSION = 43  # of the method: part of a calibrated profile's cache key (what each version changed: git log,
# docs/accuracy.md; 32: no pass size's weight matmuls kept at their one-op time, no decode split bounded by a
# longer cache's: neither improved the held-out error, bench/results/2026-11-26-vm-ablation-sync-context; 33: a
# whole split timed as the generation loop runs it, reusing the graph (patch 0009, `timed_eval`'s lead pass), and
# a pass size whose node times were mostly synchronisation anchored with its own lines, `calfit.sync_bound`,
# bench/results/2026-11-26-vm-rpc-decode-anchor; 34: a transposed V cache's element-wise write its own kind
# (calfit.SCATTER) and a GET_ROWS's work the rows it gathers, bench/results/2026-11-27-h200-promptsplits; 35: the
# lines fitted to attention spans left out of the pass-size anchors, `calfit.DeviceCalibration.whole`; 36: a host
# curve for a prompt's attention past the spans' 1024 cells, removed in 37: it did not improve held-out TTFT; 37: the
# prompt spans timed in 512-token passes, llama.cpp's default ubatch, attnspan.PROMPT_TOKENS; both
# bench/results/2026-11-28-vm-attention-curve; 38, decode spans after 2048-16384 cells in a written KV cache, was
# tried and removed before it landed: held out, it made TPOT worse, bench/results/2026-11-28-vm-decode-tails; 39: the
# spans' 512-token prompt pass also run whole, its size's anchor (`_whole_passes`),
# bench/results/2026-11-28-vm-ubatch-anchor; 40: the prompt spans also after 3072 written cells, the prompt lines
# bent at 1024, attnspan.PROMPT_TAIL, bench/results/2026-11-28-vm-prompt-tail; 41: the decode spans also after
# the workload's own past, added to a cached calibration per workload, `with_decode_tail`,
# bench/results/2026-11-28-vm-decode-at-past; 42: the layouts' passes alternated in one dual load,
# `realpass.measure_layouts`, bench/results/2026-11-29-vm-paired-layouts; 43: a pass node by node in every pair
# of them, each shape's median kept, bench/results/2026-11-29-vm-paired-nodes; 44, a whole model's spans timed on a
# slice of its first layers, was tried and removed: held out, TTFT no better, bench/results/2026-11-29-vm-heldout-v4-sliced)
MAX_ROUNDS = 5  # measurements repeated (each pass's median round kept) while the rounds take under ROUNDS_S seconds
ROUNDS_S = 40.0
WIDE_SPREAD = 0.2  # split-mode runs further apart than this (slowest / fastest - 1) get more runs ...
WIDE_SECONDS = 3.0  # ... while they have taken less than this, up to 4x the repeats
SPLIT_SECONDS = 0.3  # split-mode runs per timed pass: up to this long, at most 4x the repeats
ROUTING_TOKENS = 512  # tokens of the pass a mixture of experts' routing is recorded in (at most n_ctx)
SPANS_S = 60.0  # the attention spans are timed when that takes under this many seconds (`_spans`; a decode tail's too)
DECODE_MATCH = 1 / 32  # a decode tail timed within this share of a workload's past stands for it (`with_decode_tail`)
BIG_PREFILL = 4  # the second prompt size: this many times n_prefill, when its passes take under max_fill_s / 2


# --- measuring ------------------------------------------------------------------------------


def _spread(runs: Sequence[Run]) -> float:
    """Slowest over fastest wall time of runs of one pass, less 1."""
    walls = [r.wall_us for r in runs]
    return max(walls) / max(min(walls), 1e-9) - 1 if walls else 0.0


def _span_us(nodes: Sequence[_core.NodeTime]) -> float:
    """Graph time: from the first node's start to the last stop (us)."""
    done = [r.done_us for r in nodes if r.done_us >= 0]
    return (max(done) - nodes[0].start_us) if done and nodes else 0.0


class _Load:
    """One timed load: node-mode and split-mode runs of each pass."""

    def __init__(self, llm: Any, tokens: list[int], reps: int) -> None:
        self.llm, self.tokens, self.reps = llm, tokens, reps
        self.node_runs: dict[tuple[int, int], list[Run]] = {}
        self.outside: dict[tuple[int, int], float] = {}  # (n_tokens, n_past) -> us of the eval outside its graph
        self.walls: dict[tuple[int, int], float] = {}  # (n_tokens, n_past) -> us of the eval (split mode)
        self.splits: list[dict[str, Any]] = []  # per split: device, its time, node-mode sums
        self.split_of: dict[tuple[int, int, int], int] = {}  # (n_tokens, n_past, node position) -> split

    def batch(self, n: int, n_past: int, k: int) -> list[int]:
        """The tokens of the k-th timed pass of n tokens after n_past: a prompt's are always the same;
        a decode pass takes another token each time, as a generation does (with a mixture of experts,
        the same token again reads the experts the pass before it left in the caches: the small MoE
        models' host decodes calibrated 12-15% faster than a generation ran them)."""
        rest = self.tokens[n_past:]
        if n != 1 or len(rest) < 2:
            return rest[:n]
        return [rest[k % len(rest)]]

    def measure(self, n: int, n_past: int, outputs: int = 1) -> None:
        """Time passes of n tokens after n_past (outputs: rows of logits, a decode pass of that
        many sequences)."""
        llm, toks = self.llm, self.tokens
        prefix = toks[:n_past]
        with _core.NodeTimer(llm.native_context) as timer:
            timed_eval(llm, timer, prefix, self.batch(n, n_past, 0), [], outputs)  # warm-up (graph build, allocation)
            runs = [timed_eval(llm, timer, prefix, self.batch(n, n_past, k), [], outputs)
                    for k in range(1, self.reps + 1)]
            stops = attnspan.split_ends(runs[0].nodes)
            # split mode: the same run as without a timer but for the stops; the eval's time
            # outside the graph, paired within each run (so a noisy machine mostly cancels)
            first = self.reps + 1
            split = [timed_eval(llm, timer, prefix, self.batch(n, n_past, first + k), stops, outputs)
                     for k in range(self._split_reps(runs))]
            # runs spread widely (a software GPU's threads sharing the host's cores: lavapipe's decode
            # pass 134-273 ms, median 181, where 3 runs gave 143): more of them before the median is kept
            while (len(split) < 4 * self.reps and _spread(split) > WIDE_SPREAD
                   and sum(r.wall_us for r in split) / 1e6 < WIDE_SECONDS):
                split.append(timed_eval(llm, timer, prefix, self.batch(n, n_past, first + len(split)), stops,
                                        outputs))
        self.node_runs[(n, n_past)] = runs
        self._splits(n, n_past, runs, split, stops)
        self.outside[(n, n_past)] = statistics.median(max(r.wall_us - _span_us(r.nodes), 0.0) for r in split)
        self.walls[(n, n_past)] = statistics.median(r.wall_us for r in split)  # stops at split ends only


    def _split_reps(self, runs: list[Run]) -> int:
        """Split-mode repeats: they fix the totals (anchors, outside), so short passes get more of
        them, up to SPLIT_SECONDS of runs (a slow run: +70% once in 3 decode passes of a small MoE)."""
        est_s = statistics.median(r.wall_us for r in runs) / 1e6  # node mode: no shorter than split mode
        return max(self.reps, min(4 * self.reps, int(SPLIT_SECONDS / max(est_s, 1e-6))))

    def outside_of(self, n: int, n_past: int) -> float:
        """Only the eval's time outside its graph (us; split mode, as `measure` takes it)."""
        llm, toks = self.llm, self.tokens
        prefix = toks[:n_past]
        with _core.NodeTimer(llm.native_context) as timer:
            stops = attnspan.split_ends(timed_eval(llm, timer, prefix, self.batch(n, n_past, 0), []).nodes)  # also warm-up
            split = [timed_eval(llm, timer, prefix, self.batch(n, n_past, k), stops) for k in range(1, self.reps + 1)]
        return statistics.median(max(r.wall_us - _span_us(r.nodes), 0.0) for r in split)

    def _splits(self, n: int, n_past: int, runs: list[Run], split: list[Run], stops: list[int]) -> None:
        """Per split: its time alone (split mode) and its nodes' node-mode times, split into
        views and ops: what timing a node alone adds is found from these (see `fit`)."""
        first = 0
        for idx, stop in enumerate(stops):
            for k in range(first, stop + 1):
                self.split_of[(n, n_past, k)] = idx
            rng = range(first, stop + 1)
            nodes = runs[0].nodes
            ops = [k for k in rng if nodes[k].op not in VIEW_OPS]
            self.splits.append({
                "n_tokens": n, "n_past": n_past, "split": idx, "device": nodes[stop].device, "n_ops": len(ops),
                "n_views": len(rng) - len(ops),
                "split_us": statistics.median(r.nodes[stop].range_us for r in split if stop < len(r.nodes)),
                "ops_us": statistics.median(sum(r.nodes[k].range_us for k in ops) for r in runs)})
            first = stop + 1


def _node_points(load: _Load, layers: AttentionLayers | None = None) -> list[dict[str, Any]]:
    """Every timed node of every pass: median over the repeats of its node-mode time. layers: the
    model's attention layers, whose windows bound what its flash attention nodes attend to (the
    k-th of a pass is layer layers.order[k]'s, where the counts agree)."""
    out = []
    for (n, n_past), runs in load.node_runs.items():
        us = [statistics.median(run.nodes[k].range_us for run in runs if k < len(run.nodes))
              for k in range(len(runs[0].nodes))]
        split = [load.split_of.get((n, n_past, k)) for k in range(len(runs[0].nodes))]
        out += _pass_points(runs[0].nodes, n, n_past, us, split, layers)
    return out


def _pass_points(nodes: Sequence[_core.NodeTime], n: int, n_past: int, us: Sequence[float],
                 split: Sequence[int | None], layers: AttentionLayers | None) -> list[dict[str, Any]]:
    """A pass's nodes as the fits read them; us, split: each node's time (node mode) and split."""
    fa = [k for k, r in enumerate(nodes) if r.op == "FLASH_ATTN_EXT"]
    layer_at = dict(zip(fa, layers.order, strict=True)) if layers and len(fa) == len(layers.order) else {}
    out = []
    for k, r in enumerate(nodes):
        cells = n_past + (n + 1) / 2  # the mean token's
        if layers is not None and k in layer_at:
            cells = layers.cells(layer_at[k], cells)
        w = work(r.op, r.ne, r.nbytes, r.src_ne, r.src_bytes, attended=cells)
        # the columns a weight matmul multiplies (the logits' matmul runs on the last token only)
        cols = r.ne[2] if r.op == "MUL_MAT_ID" else r.ne[1] * r.ne[2] * r.ne[3]
        out.append({"n_tokens": n, "n_past": n_past, "cols": cols, "split": split[k],
                    "name": r.name, "op": r.op, "kind": kind(r.op, r.ne), "device": r.device,
                    "weight_type": r.weight_type, "src0_ne": list(r.src_ne[0]) if r.src_ne else [],
                    # MUL_MAT_ID: experts per token (ne[0] of its ids, the third source)
                    "n_expert_used": r.src_ne[2][0] if r.op == "MUL_MAT_ID" and len(r.src_ne) > 2 else 0,
                    "work": w, "us": us[k]})
    return out


def _whole_passes(timed: Sequence[attnspan.WholePass], layers: AttentionLayers | None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The spans' whole prompt passes as points and splits marked `anchor_only` (calfit.fit: they fix their
    pass size's anchor and enter no line): a 512-token pass otherwise took the largest timed size's factor
    (128 tokens), on QwQ-32B 1L 0.72 where 512 tokens ran 1.48x the prediction
    (bench/results/2026-11-28-vm-decode-tails)."""
    points: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    for w in timed:
        ends = attnspan.split_ends(w.nodes)
        of = [next(i for i, e in enumerate(ends) if k <= e) for k in range(len(w.nodes))]
        us = [r.range_us for r in w.nodes]
        points += [{**p, "load": w.load, "anchor_only": True}
                   for p in _pass_points(w.nodes, w.n_tokens, w.n_past, us, of, layers)]
        first = 0
        for i, end in enumerate(ends):
            ops = [k for k in range(first, end + 1) if w.nodes[k].op not in VIEW_OPS]
            splits.append({"n_tokens": w.n_tokens, "n_past": w.n_past, "split": i, "device": w.nodes[end].device,
                           "n_ops": len(ops), "n_views": end + 1 - first - len(ops), "split_us": w.split_us[i],
                           "ops_us": sum(us[k] for k in ops), "load": w.load, "anchor_only": True})
            first = end + 1
    return points, splits


def calibrate(path: str | Path, devices: Sequence[str], profile: Any, *, threads: int, n_prefill: int = 32,
              n_ctx: int = 512, op_offload: bool = True, mmap: bool = True, reps: int = 3, max_fill_s: float = 10.0,
              progress: bool = True, max_rounds: int = MAX_ROUNDS, rounds_s: float = ROUNDS_S,
              attention: Mapping[str, Any] = NO_FLASH_ATTN, decode: int = 1) -> Calibration:
    """Time the real graph of `path` on `devices` (the CPU first, then at most one accelerator)
    and fit the terms the one-op profile cannot see (module docstring). `profile`: the one-op
    Profile of the same model and devices, for the matmul scale. attention: llama_cpp.Llama's flash
    attention and KV cache keywords (runtime.kvcache.llama_kwargs) every load takes. decode: the
    workload's decode pass (tokens: one of each of its sequences), timed too when above 1 (a
    4-token pass's layouts are not between the 1- and 32-token ones: the 8B's q4_K matrices ran
    1.12x slower plain there, where the timed sizes interpolated to 0.8x).

    A shared machine can run 1.4-1.7x slower for seconds to minutes at a time (the project's VM: a
    small MoE's decode at 4.2-4.8 ms instead of 2.6-2.9 ms, at any load average), and a pass timed
    inside such a window scales its terms by it (one model's every prediction 45% slow; another's
    decode timed at 4.8 ms after 32 tokens and 3.0 ms after 510 in one round). So the measurements
    are repeated while the rounds so far took less than `rounds_s` seconds, at most `max_rounds`
    times, and each timed pass is taken from the round of its median time (`merge_rounds`)."""
    t0 = time.perf_counter()
    rounds: list[Round] = []
    acc = devices[1] if len(devices) > 1 else None  # the CPU first
    refused = profile.refused(acc) if acc is not None and profile is not None else set()
    layers = attention_layers(path) if attention.get("flash_attn") else None  # its window layers, once
    for k in range(max(max_rounds, 1)):
        if progress and k:
            print(f"\rcalibrate: round {k + 1} (each pass's median round is kept)".ljust(100), end="",
                  file=sys.stderr, flush=True)
        rounds.append(_measure_round(path, devices, threads=threads, n_prefill=n_prefill, n_ctx=n_ctx,
                                     op_offload=op_offload, mmap=mmap, reps=reps, max_fill_s=max_fill_s,
                                     progress=progress, routing=k == 0, refused=refused, attention=attention,
                                     layers=layers, decode=decode))
        spent = time.perf_counter() - t0
        if spent + spent / (k + 1) > rounds_s:  # another round would end past rounds_s
            break
    # a round too long to repeat (a software GPU's load: lavapipe's MoE round took 82 s) would leave
    # the host's passes in whatever state the machine was in: the host load alone, when it is cheap,
    # is repeated for the rest of the rounds (its host decode 5.9 ms in such a round, 3.5 in another)
    spent_host = 0.0
    while len(rounds) < max_rounds and rounds[0].host_s > 0 and spent_host + rounds[0].host_s <= rounds_s:
        if progress:
            print(f"\rcalibrate: round {len(rounds) + 1}, the host load alone".ljust(100), end="", file=sys.stderr,
                  flush=True)
        t1 = time.perf_counter()
        rounds.append(_measure_round(path, devices, threads=threads, n_prefill=n_prefill, n_ctx=n_ctx,
                                     op_offload=op_offload, mmap=mmap, reps=reps, max_fill_s=max_fill_s,
                                     progress=False, routing=False, host_only=True, refused=refused,
                                     attention=attention, layers=layers, decode=decode))
        spent_host += time.perf_counter() - t1
    m = merge_rounds(rounds)
    timed = _spans(path, devices, m.splits, threads=threads, n_prefill=n_prefill, mmap=mmap, op_offload=op_offload,
                   attention=attention, progress=progress)
    points, splits = _whole_passes(timed.whole, layers)
    cal = fit(m.points + points, [(n, us) for (n, _), us in m.outside.items()], profile, m.splits + splits, m.routing,
              timed.spans)
    cal.detached, cal.stream, cal.scatter, cal.layouts = _detached_on(m), m.stream, m.scatter, m.layouts
    cal.rounds_outside = [{f"{n},{past}": us for (n, past), us in sorted(r.outside.items())} for r in rounds]
    cal.rounds_detached = [dict(r.detached) for r in rounds]
    cal.rounds_alone = [{acc: {f"{n},{past}": us for (n, past), us in sorted(a.items())} for acc, a in r.alone.items()}
                        for r in rounds]
    cal.elapsed_s = time.perf_counter() - t0
    if progress:
        print(f"\rcalibrate: {len(m.points)} timed nodes, {len(rounds)} round(s) in {cal.elapsed_s:.1f} s".ljust(100),
              file=sys.stderr, flush=True)
    return cal


def _spans(path: str | Path, devices: Sequence[str], splits: Sequence[dict[str, Any]], *, threads: int, n_prefill: int,
           mmap: bool, op_offload: bool, attention: Mapping[str, Any], progress: bool) -> attnspan.Timed:
    """The attention spans (attnspan.measure) when measuring them takes under SPANS_S seconds, as the
    timed prompt passes' time per token says (its prompt spans in 512-token passes, at 1 thread on this VM:
    a 1-layer 8B shape 32-42 s, a 2-layer StarCoder2-7B shape over 60 s; the whole 8B would take minutes:
    none, and the attention kinds keep their node-by-node lines, fitted on 32-128-token passes: on the whole
    MiniCPM3-4B 2.3x what the device model's span-fitted lines give at 512 tokens, which came within 9% of its
    prompts; bench/results/2026-11-29-vm-heldout-v3)."""
    per_token = defaultdict(float)  # load -> us per token of its n_prefill-token pass
    for s in splits:
        if s["n_tokens"] == n_prefill and s["n_past"] == 0:
            per_token[s["load"]] += s["split_us"] / n_prefill
    est = sum(attnspan.cost_s(us) for us in per_token.values())
    tail = sum(attnspan.tail_cost_s(us) for us in per_token.values())
    tails = est + tail <= SPANS_S  # the prompt tail only where it fits the budget too (QwQ-32B 1L: ~50 s without)
    if not per_token or est > SPANS_S:
        if progress and per_token:
            print(f"\rcalibrate: attention spans not timed (about {est:.0f} s, over {SPANS_S:.0f} s): attention "
                  "costed node by node (on the whole MiniCPM3-4B, 2.3x the device model's cost at 512 tokens)".ljust(100), file=sys.stderr, flush=True)
        return attnspan.Timed()
    if progress:
        also = f", prompts also after {attnspan.PROMPT_TAIL}" if tails else ""
        print(f"\rcalibrate: attention timed after {attnspan.SHORT_DECODE_PAST} and {attnspan.LONG_PAST} cells{also} "
              f"(about {est + tail * tails:.0f} s)".ljust(100), end="", file=sys.stderr, flush=True)
    return attnspan.measure(path, devices, threads=threads, mmap=mmap, op_offload=op_offload, attention=attention,
                            tails=tails)


def decode_tail_pasts(cal: Calibration) -> list[int]:
    """The pasts the calibration's decode spans were also timed after (`with_decode_tail`)."""
    return sorted({int(t["past"]) for sp in cal.spans if sp["n_tokens"] == 1 for t in sp.get("tails", ())})


def with_decode_tail(cal: Calibration, profile: Any, path: str | Path, devices: Sequence[str], past: int, *,
                     threads: int, mmap: bool = True, op_offload: bool = True,
                     attention: Mapping[str, Any] = NO_FLASH_ATTN, progress: bool = True) -> Calibration | None:
    """`cal` refitted with the decode spans also timed after `past` cells (attnspan.measure_decode), so that
    the decode lines bend through them (calfit.span_lines): a workload's decodes after more cells than the
    spans' long cache. None where nothing was added: `past` within the long cache or within DECODE_MATCH of
    a past timed before, no decode pass timed, a sliding-window model (found from its metadata, before any load:
    kvstate cannot write its caches), or the measurement over SPANS_S seconds. A decode
    span the calibration timed gets the tail; one it did not time (its spans were over budget) is added."""
    if past <= attnspan.LONG_PAST or any(abs(p - past) <= DECODE_MATCH * past for p in decode_tail_pasts(cal)):
        return None
    decode: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))  # load -> past -> us a decode pass
    for sp in cal.splits:
        if sp["n_tokens"] == 1 and not sp.get("anchor_only"):
            decode[sp["load"]][int(sp["n_past"])] += sp["split_us"]
    if not decode or attention_layers(path).window:  # a sliding window's two caches: kvstate writes neither
        return None
    est = sum(attnspan.decode_cost_s(by_past[min(by_past)], past) for by_past in decode.values())
    if est > SPANS_S:
        if progress:
            print(f"calibrate: decode not timed after {past} cells (about {est:.0f} s, over {SPANS_S:.0f} s): "
                  "its attention past the spans' cells is extrapolated", file=sys.stderr, flush=True)
        return None
    if progress:
        print(f"\rcalibrate: decode attention timed after {past} cells, the workload's (about {est:.0f} s)".ljust(100),
              end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    got = attnspan.measure_decode(path, devices, past, threads=threads, mmap=mmap, op_offload=op_offload,
                                  attention=attention)
    if not got:
        return None
    spans = [dict(sp) for sp in cal.spans]
    for new in got:
        old = next((sp for sp in spans if sp["n_tokens"] == 1 and sp["load"] == new["load"]
                    and sp["span"] == new["span"] and [n[0] for n in sp["nodes"]] == [n[0] for n in new["nodes"]]),
                   None)
        if old is None:  # the calibration's spans were not timed: this run's decode spans are its only ones
            spans.append(new)
        else:
            old["tails"] = [*(t for t in old.get("tails", ()) if t["past"] != past), *new["tails"]]
    out = refitted(replace(cal, spans=spans, elapsed_s=cal.elapsed_s + time.perf_counter() - t0), profile)
    if progress:
        print(f"\rcalibrate: decode attention timed after {past} cells in {time.perf_counter() - t0:.1f} s".ljust(100),
              file=sys.stderr, flush=True)
    return out


def _detached_on(m: Round) -> dict[str, list[float]]:
    """What a detached load saves, against the kept times outside the graph: each kept time less the
    kept time of the same pass without the accelerator (`Round.alone`: both the median over the
    rounds). A round's own difference of the two is noisier than either (a small MoE's: 0 us in one
    round, 620 in the next; bench/results/2026-11-24-vm-outside/outside_rounds_gptoss_pre.txt), and
    the least of each round's attached time less its own line is biased low (method 19: tiny's
    host-only decode pass 24-31 us outside its graph; bench/results/2026-11-24-vm-method19)."""
    out = {acc: list(line(outside.saved(m.outside, alone))) for acc, alone in m.alone.items() if alone}
    return {**m.detached, **out}


def _measure_round(path: str | Path, devices: Sequence[str], *, threads: int, n_prefill: int, n_ctx: int,
                   op_offload: bool, mmap: bool, reps: int, max_fill_s: float, progress: bool,
                   routing: bool = True, host_only: bool = False,
                   refused: Collection[tuple[str, tuple[int, ...]]] = (),
                   attention: Mapping[str, Any] = NO_FLASH_ATTN, layers: AttentionLayers | None = None,
                   decode: int = 1) -> Round:
    """One round of `calibrate`'s measurements (routing: also record a mixture of experts' routing,
    which does not change between rounds; host_only: the host load's passes alone; refused: weights
    (type, shape) the accelerator refused to run when profiled, never streamed to it)."""
    from ...model import gguf_file
    from ...runtime import devices as devmod
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    info = gguf_file.check_model(path)
    n_layer = int(info.hparam("block_count", 0))
    accs = [devmod.resolve(d) for d in devices if not devmod.resolve(d).is_host]
    n_prefill = max(1, min(n_prefill, n_ctx // 2))
    n_big = min(BIG_PREFILL * n_prefill, n_ctx // 2)
    loads: list[tuple[str, dict[str, Any]]] = [("host", {"n_gpu_layers": 0, "op_offload": False})]
    if accs and not host_only:
        loads.append(("accelerator", {"n_gpu_layers": layers_that_fit(info, accs[0], n_layer),
                                      "op_offload": op_offload}))
    points: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    host_outside: dict[tuple[int, int], float] = {}
    host_s = 0.0  # seconds the host load took
    host_sizes: list[int] = []  # the pass sizes the host load timed
    # the weights the host load repacked (name -> bytes) when it is the layouts' own default load (the CPU alone;
    # with an accelerator's pinned buffers in the list, llama.cpp may place host weights otherwise): None to find them
    repacked: dict[str, int] | None = None
    for i, (what, kw) in enumerate(loads):
        t_load = time.perf_counter()
        if progress:
            print(f"\rcalibrate: real graph, {what} load ({i + 1}/{len(loads)})".ljust(100), end="",
                  file=sys.stderr, flush=True)
        try:
            llm = Llama(str(path), devices=[a.name for a in accs] or None, n_ctx=n_ctx, n_batch=n_big,
                        n_ubatch=n_big, n_threads=threads, n_threads_batch=threads, use_mmap=mmap,
                        verbose=False, **attention, **decode_load_kwargs(decode), **kw)
        except (OallamaError, ValueError, RuntimeError) as e:  # report which load failed
            raise ProfileError(f"calibration: could not load {path} ({what} load): {e}") from None
        try:
            tokens = prompt_tokens(llm, n_ctx)
            load = _Load(llm, tokens, reps)
            load.measure(n_prefill, 0)
            # a second prompt size, when its passes are cheap: prompt ops and matmuls grow unlike
            # tokens (a small MoE's weight matmuls cost 0.64x their 32-token time per token at 128 in the
            # real graph, 0.74x in the one-op profile), and a workload's ubatch is rarely the calibrated one
            # (4x, else 2x: lavapipe's 32-token pass of a tiny model took 176 ms, too slow for 128 tokens,
            # and its 64-token ubatch ran 1.3x what the 32-token fits gave)
            per_run_s = load.walls[(n_prefill, 0)] / 1e6 / n_prefill * (2 + 2 * reps)  # per token of the size
            if second := next((n for n in (n_big, min(2 * n_prefill, n_big)) if n > n_prefill
                               and per_run_s * n < max_fill_s / 2), None):
                load.measure(second, 0)
            load.measure(1, n_prefill)
            if 1 < decode < n_prefill:  # the workload's decode pass of several sequences: a row of logits each
                load.measure(decode, n_prefill, outputs=decode)
            # attention over a long KV cache, when filling it costs little (a few prompt passes)
            per_token_s = load.walls[(n_prefill, 0)] / 1e6 / n_prefill
            if per_token_s * (n_ctx - n_prefill) < max_fill_s:
                load.measure(1, n_ctx - 2)
            points += [{**p, "load": what} for p in _node_points(load, layers)]
            splits += [{**s, "load": what} for s in load.splits]
            if what == "host":  # with an accelerator, reading its results back is the model's copies
                host_outside = outside.overheads(llm, load.outside, reps)
                host_sizes = sorted({n for n, _ in load.walls})
                if not accs:  # none found (None): the layouts' own default load looks again
                    repacked = {t.name: t.nbytes for t in llm.tensor_placements() if t.buffer_type == REPACK} or None
        finally:
            llm.close()
        if what == "host":
            host_s = time.perf_counter() - t_load
    # the host's weights repacked and in plain memory, every round (alternated in one load where host memory
    # holds both copies, else two loads one after the other; the rounds' median ratio is kept: qwen3moe-small's one pair gave plain/repacked 0.93 / 1.25 / 0.98
    # at 1 / 32 / 128 tokens, this CPU's decode moving by a third between minutes)
    if progress:
        print("\rcalibrate: real graph, host weights repacked and plain".ljust(100), end="", file=sys.stderr,
              flush=True)
    layouts = measure_layouts(path, sizes=host_sizes, n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap,
                              reps=reps, attention=attention, decode=decode, repacked=repacked)
    if host_only:
        return Round(points, splits, host_outside, host_s=host_s, layouts=layouts)
    stream: dict[str, dict[str, Any]] = {}
    if accs and op_offload:
        if progress:
            print(f"\rcalibrate: real graph, every host weight streamed ({len(loads) + 1}/{len(loads) + 1})".ljust(100),
                  end="", file=sys.stderr, flush=True)
        st = measure_stream(path, accs[0].name, n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap,
                             reps=reps, refused=refused, attention=attention)
        if st is not None:
            stream[accs[0].name] = st
    scatter: dict[str, dict[str, Any]] = {}
    if accs:
        if progress:
            print("\rcalibrate: real graph, weights scattered over both devices".ljust(100), end="", file=sys.stderr,
                  flush=True)
        sc = measure_scatter(path, info, accs[0].name, n_gpu_layers=layers_that_fit(info, accs[0], n_layer),
                              n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap, reps=reps,
                              attention=attention)
        if sc is not None:
            scatter[accs[0].name] = sc
    n_expert = int(info.hparam("expert_count", 0) or 0)
    routes = (measure_routing(path, n_expert, n_tokens=min(n_ctx, ROUTING_TOKENS), threads=threads, mmap=mmap,
                              progress=progress) if n_expert > 0 and routing else None)
    detached: dict[str, list[float]] = {}
    alone: dict[str, dict[tuple[int, int], float]] = {}
    if accs and accs[0].kind == "rpc":  # the runtime loads a placement that uses no rpc-server without it
        if progress:
            print("\rcalibrate: host load without the accelerator".ljust(100), end="", file=sys.stderr, flush=True)
        alone[accs[0].name] = outside.alone_us(
            path, host_outside, lambda llm, k: _Load(llm, prompt_tokens(llm, n_ctx), reps).outside_of(*k),
            n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap, reps=reps, attention=attention)
        detached[accs[0].name] = list(line(outside.saved(host_outside, alone[accs[0].name])))
    return Round(points, splits, host_outside, stream, scatter, routes, detached, host_s, alone, layouts)

