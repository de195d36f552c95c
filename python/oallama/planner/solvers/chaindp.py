"""Optimal, by dynamic programming along the graph: the program of `optimal` solved exactly,
without branch and bound.

The MILP's hard part is proving its bound: a 48-layer mixture of experts has ~1.2k binaries whose
LP relaxation blends layers, and HiGHS spends seconds closing a gap under 1%. Its objective is
local along llama.cpp's graph order, though: a node's device depends on its own weight (or its
layer's KV, or a constant) and, for a node the scheduler spreads to, on the nearest pinned nodes
before and after it; a split starts where two consecutive nodes differ; a copy is charged where a
tensor is read on the other device, once per (tensor, direction). The memory budget is the only
term that spans the whole graph. So the placement is decided weight by weight in graph order (all
passes in step: a weight's decision holds in every pass), carrying only what later nodes can
still see:

  per pass   the device of the last node (splits) and of the last pinned node (spreading), and
             for every tensor read again later its device and whether its copy is already paid;
  globally   decisions still needed later (a weight read further on, a layer's KV) and the last
             layer's KV bit (n_gpu_layers counts the trailing layers).

Stage j decides one weight (on the accelerator; on the host, streamed from some batch on; never
streamed) or one layer's KV, then runs every node whose device is known (`chainwalk`). The stages
and carried states form a layered graph (`chaingraph.StageGraph`); its edges fix bytes, may stream
a weight (the compute buffer needs room for the largest streamed weight: `optimal`'s m) and add us. Layers alike are the
same stages shifted: a stage's runs are computed once per shape of layer, and a stage alike an
earlier one and reached from the same states (shifted) gets that stage's edges, so a 48-layer
graph costs about two layers of Python.

The least-time path within the budget is found by label setting (`_core.pareto_walk`, C++): per
state and largest streamed size, the Pareto front of (bytes, us), pruned by the budget (with the
least bytes the rest must fix) and against the best known placement with Lagrangian bounds: for a
price lambda of accelerator bytes (us per byte), the rest's least us + lambda * bytes, less lambda
times the bytes left, is a lower bound of the rest's us within the budget (`_core.pareto_bounds`;
the prices spread around the one whose bound at the start is highest, within 0.2-0.6% of the
optimum on a 48-layer MoE). Streaming fixes no bytes but needs room for the largest streamed
copy, so the bound is taken per size the path's largest streamed weight can end at: the rest
then streams nothing larger, and the bytes left shrink by that copy's growth (without this, a
64-layer 32B shape's fronts passed 400k entries). The best known placement comes from a heuristic walk first (fronts cut
to the 500 entries of least bound). And the walk without streaming options comes first: its optimum
bounds the walk with them, whose fronts it then prunes hard. The result is the program's optimum
(tests compare it with HiGHS's on real graphs).

What it costs, on the 48-layer Qwen3-30B-A3B shape here: ~60 states per stage without streaming
options, ~200 with them (passes can then differ: a weight streamed at prefill but not in decode);
the whole `optimal` (both offload modes, streaming options included) 0.6-1.1 s, where the fronts
without the bounds reached ~300k entries and 12-20 s. `NotDecomposable` says when a front or the
time limit runs out; `optimal.solve` then goes on with HiGHS.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..cost.schedmodel import NEVER, PassModel, Placement
from .chaingraph import StageGraph
from .chainwalk import ACC, NotDecomposable, Walk

__all__ = ["ACC", "BEAM_ENTRIES", "MAX_ENTRIES", "NEVER", "NotDecomposable", "Result", "solve", "stream_options"]

MAX_ENTRIES = 400_000  # front entries of one stage; beyond this the MILP is the better tool
BEAM_ENTRIES = 500  # front entries of one stage in the heuristic walk that bounds the exact one


@dataclass
class Result:
    placement: Placement
    objective_us: float
    stream_batches: dict[str, list[int]]


def stream_options(passes: Sequence[tuple[PassModel, float]], *, full: bool, stream: bool,
                   fixed: Mapping[str, bool], no_stream: Collection[str]) -> set[tuple[str, int]]:
    """(weight, batch) whose op may be streamed (`optimal`'s s variables)."""
    if not stream:
        return set()
    return {(k[1], k[4]) for pm, _ in passes for k in pm.kinds[full].values()
            if k[0] == "w" and k[2] and not fixed.get(k[1], False) and k[1] not in no_stream}


def solve(passes: Sequence[tuple[PassModel, float]], *, weight_bytes: Mapping[str, int],
          kv_bytes: Mapping[int, int], budget: int, reserve: int = 0, full: bool = False,
          stream: bool = True, fixed: Mapping[str, bool] | None = None, no_stream: Collection[str] = (),
          cutoff_us: float | None = None, start_us: float | None = None,
          max_entries: int = MAX_ENTRIES, time_limit: float = math.inf) -> Result | None:
    """The placement `optimal.solve` would return (same arguments), or None when nothing fits or
    nothing beats `cutoff_us`. start_us: the objective of a placement known to fit, if any (prunes).
    Raises NotDecomposable when a stage's fronts would grow beyond `max_entries` entries or the
    search would take longer than `time_limit` seconds."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    fixed = dict(fixed or {})
    n_layer = passes[0][0].n_layer
    weights = sorted(set().union(*(pm.weights for pm, _ in passes)))
    acc_ok = {w: all(pm.acc_ok.get(w, True) for pm, _ in passes) for w in weights}
    svars = stream_options(passes, full=full, stream=stream, fixed=fixed, no_stream=no_stream)
    walk = Walk(passes, full, svars)
    decided_w = {key[1] for key in walk.keys if key[0] == "w"}
    cap = budget - reserve  # bytes for weights, KV and the largest streamed copy
    base = 0
    for w in weights:  # weights no node reads: only their memory counts
        if w not in decided_w and fixed.get(w, False):
            if not acc_ok[w]:
                return None
            base += weight_bytes.get(w, 0)
    if full:
        base += sum(kv_bytes.values())
    if base > cap:
        return None
    batches: dict[str, set[int]] = {}
    for w, b in svars:
        batches.setdefault(w, set()).add(b)
    # a threshold whose copies cost more than streaming can save anywhere is never better than not
    # streaming (which needs no more bytes): not an option
    gain = walk.stream_gain()
    for w, bs in batches.items():
        for b in sorted(bs):
            copy = sum(gain.get((w, x), (0.0, 0.0))[0] for x in bs if x >= b)
            save = sum(gain.get((w, x), (0.0, 0.0))[1] for x in bs if x >= b)
            if copy >= save:
                bs.discard(b)

    def options(key: tuple) -> list[int]:
        if key[0] == "kv":
            return [0] if key[1] == 0 else [0, 1]
        w = key[1]
        opts = []
        if acc_ok[w] and fixed.get(w, True):
            opts.append(ACC)
        if not fixed.get(w, False):
            opts.append(NEVER)
            opts.extend(sorted(batches.get(w, ())))
        return opts

    kv_suffix = {layer: sum(kv_bytes.get(m, 0) for m in range(layer, n_layer)) for layer in range(n_layer + 1)}
    g = StageGraph(walk, options, weight_bytes, kv_suffix, cap, base, deadline)
    if g.empty:
        return None

    def result(found: tuple[float, dict[tuple, int]]) -> Result:
        obj, dec = found
        on_acc = frozenset(w for w in weights if dec.get(("w", w)) == ACC or (w not in decided_w and fixed.get(w, False)))
        on_layers = [layer for layer in range(n_layer) if dec.get(("kv", layer), 0)]
        kv_layers = n_layer if full else (n_layer - on_layers[0] if on_layers else 0)
        streamed: dict[str, list[int]] = {}
        for w, b in sorted(svars):
            opt = dec.get(("w", w), NEVER)
            if opt != ACC and b >= opt:
                streamed.setdefault(w, []).append(b)
        min_batch = {w: (min(streamed[w]) if w in streamed else NEVER) for w in weights if w not in on_acc}
        return Result(Placement(on_acc, kv_layers, min_batch), obj + walk.overhead, streamed)

    bound = min(x for x in (cutoff_us, start_us, math.inf) if x is not None) - walk.overhead
    streams = any(opt not in (ACC, NEVER) for key, opts in zip(walk.keys, g.opts, strict=True) if key[0] == "w"
                  for opt in opts)
    incumbent: Result | None = None
    for streaming in ((False, True) if streams else (False,)):
        # without streaming options first: far fewer fronts, and its optimum bounds the walk with them
        try:
            found = g.best(bound, max_entries, deadline, streaming=streaming, beam=BEAM_ENTRIES)
            if found is None and start_us is not None and (cutoff_us is None or start_us < cutoff_us):
                # the start was not a placement of this program (e.g. a baseline's default streaming)
                found = g.best((cutoff_us if cutoff_us is not None else math.inf) - walk.overhead, max_entries,
                               deadline, streaming=streaming, beam=BEAM_ENTRIES)
        except NotDecomposable as e:
            e.incumbent = incumbent
            raise
        if found is not None:
            incumbent = result(found)
            bound = found[0]
            start_us = None  # the bound is now a placement of this program
    if incumbent is None or (cutoff_us is not None and incumbent.objective_us >= cutoff_us * (1 - 1e-9)):
        return None
    return incumbent
