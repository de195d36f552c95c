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
  matmul_scale       real-graph / profile compute time of the weight matmuls (ratio of sums);
  anchor             both scaled so that the timed splits' nodes sum to the splits' measured
                     times (node-by-node times give the shares, whole splits the totals);
  anchors            and then per pass size (tokens): where a node's time alone is mostly its
                     synchronisation (an rpc-server's round trip), the fits cannot tell a decode
                     op's few microseconds from a prompt op's hundreds; each pass size's splits
                     fix its own total (a pass of another size: the factors of the timed sizes
                     around it, interpolated on log tokens); a decode split timed slower than
                     the same pass over a longer KV cache ran in a slow phase of the machine and
                     is bounded by it first (`context_bounded`); and where a pass size's nodes
                     timed one by one took SYNC_BOUND x the pass run whole (a small model on a
                     loopback rpc-server: 16-34x), its weight matmuls keep their one-op time and
                     only the other ops are anchored (`mm_anchors`): there the nodes' times are the
                     round trip's noise, and scaling the matmuls with them priced a 1.6-ms output
                     matmul at 0.4 ms;

and `pass_us = a + b * n_tokens`: a prompt pass's wall time outside its graph (llama.cpp's decode
around the graph, paired with the graph's own time within each split-mode run, plus sampling the
token), from the host load (with an accelerator, reading its results back is the model's copies).

Split-mode runs of a pass that spread more than WIDE_SPREAD (a software GPU's threads sharing the
host's cores: lavapipe's decode pass 134-273 ms) are repeated, up to 4x, before their median is kept.

Two loads are timed: every layer on the host (op offload off: nothing streams), and every
layer that fits on the accelerator; token counts 1 (decode, at two KV lengths) and two prefill
sizes (the second, 4x the first, when its passes are cheap; a pass between timed sizes takes
their factors interpolated). A decode pass reuses its predecessor's graph and a prompt pass
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
routing.py). Calibration is a step of `profile` (cached with it; `--no-calibrate` skips it).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import OallamaError, ProfileError
from . import outside
from .graph import node_layer
from .realpass import (
    MATMUL_OPS,
    VIEW_OPS,
    Run,
    layers_that_fit,
    measure_scatter,
    measure_stream,
    timed_eval,
)
from .rounds import Round, context_bounded, merge_rounds
from .routing import Routing
from .routing import measure as measure_routing

VERSION = 17  # of the method: part of a calibrated profile's cache key (8: streamed weights timed; 9: scattered;
# 10: a mixture of experts' routing recorded; 11: sampling as the generation loop samples, a host pass without
# an rpc-server attached; 12: short calibrations repeated, the round with the fastest host passes kept;
# 13: a second prompt size, a decode pass's time outside the graph apart from a prompt's; 14: up to 5
# rounds, each timed pass from the round it ran fastest in; 15: a device's decode split no slower than
# the same pass over a longer KV cache, `context_bounded`; 16: split-mode runs that spread more than 20%
# repeated, and the host load alone repeated when whole rounds cannot be; 17: a pass size whose nodes timed
# one by one were mostly synchronisation keeps its weight matmuls at their one-op time, SYNC_BOUND)
MAX_ROUNDS = 5  # measurements repeated (each pass's fastest kept) while the rounds take under ROUNDS_S seconds
ROUNDS_S = 40.0
WIDE_SPREAD = 0.2  # split-mode runs further apart than this (slowest / fastest - 1) get more runs ...
WIDE_SECONDS = 3.0  # ... while they have taken less than this, up to 4x the repeats
SPLIT_SECONDS = 0.3  # split-mode runs per timed pass: up to this long, at most 4x the repeats
ROUTING_TOKENS = 512  # tokens of the pass a mixture of experts' routing is recorded in (at most n_ctx)
SYNC_BOUND = 4.0  # a pass size's nodes timed one by one over its splits run whole beyond which its node times are
# mostly synchronisation (its weight matmuls then at their one-op time, `_anchored`; an H100's passes: 1.6-3.2)
BIG_PREFILL = 4  # the second prompt size: this many times n_prefill, when its passes take under max_fill_s / 2


def work(op: str, ne: Sequence[int], nbytes: int, src_ne: Sequence[Sequence[int]], src_bytes: int) -> float:
    """What a non-weight op's time grows with: multiply-adds for a matmul of two activations
    (KQ, KQV: K = src0's row length), else bytes read + written."""
    if op in MATMUL_OPS and src_ne:
        return float(src_ne[0][0]) * math.prod(ne)
    return float(nbytes + src_bytes)


@dataclass
class OpFit:
    """us = a_us + b_us * work, fitted on n nodes (max relative residual kept for the record)."""

    a_us: float
    b_us: float
    n: int
    max_rel_err: float = 0.0

    def time_us(self, w: float) -> float:
        return self.a_us + self.b_us * w

    @staticmethod
    def fit(points: Sequence[tuple[float, float]]) -> OpFit:
        """Least squares with a >= 0, b >= 0 (points: (work, us))."""
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in points) / var if var > 0 else 0.0
        if b < 0:
            b = 0.0
        a = my - b * mx
        if a < 0:  # through the origin
            a = 0.0
            sxx = sum(x * x for x in xs)
            b = sum(x * y for x, y in points) / sxx if sxx > 0 else 0.0
        err = max((abs(a + b * x - y) / y for x, y in points if y > 0), default=0.0)
        return OpFit(a, b, len(points), err)


def _interpolated(by_size: dict[int, float], n_tokens: int | None) -> float:
    """A per-pass-size factor for a pass of n_tokens: between two timed sizes, interpolated on a log
    scale of tokens; beyond them, the nearest one's; 1 with none."""
    if n_tokens is None or not by_size:
        return 1.0
    sizes = sorted(by_size)
    if n_tokens <= sizes[0] or n_tokens >= sizes[-1]:
        return by_size[sizes[0] if n_tokens <= sizes[0] else sizes[-1]]
    hi = next(n for n in sizes if n >= n_tokens)
    lo = max(n for n in sizes if n < n_tokens)
    t = (math.log(n_tokens) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return by_size[lo] + t * (by_size[hi] - by_size[lo])


@dataclass
class DeviceCalibration:
    node_overhead_us: float  # us added by timing one node alone
    ops: dict[str, OpFit]  # non-weight op -> fit; "*" fits all of them together (fallback)
    matmul_scale: float  # real-graph / profile time of weight matmuls (ratio of sums; 1.0 if none seen)
    n_matmuls: int = 0
    anchor: float = 1.0  # the factor that made the fitted costs sum to the measured split times
    anchors: dict[int, float] = field(default_factory=dict)  # n_tokens -> that pass size's further factor
    # n_tokens -> the weight matmuls' own factor where it is not `anchors`' (a pass size whose node-by-node
    # times were mostly synchronisation: its matmuls at their one-op time, `_anchored`)
    mm_anchors: dict[int, float] = field(default_factory=dict)

    def factor(self, n_tokens: int | None) -> float:
        """The pass-size factor for a pass of n_tokens: between two timed sizes, interpolated on a
        log scale of tokens; beyond them, the nearest one's."""
        return _interpolated(self.anchors, n_tokens)

    def scale_for(self, n_tokens: int | None) -> float:
        """Real-graph / profile time of weight matmuls in a pass of n_tokens."""
        return self.matmul_scale * _interpolated({**self.anchors, **self.mm_anchors}, n_tokens)

    def node_time_us(self, op: str, w: float, n_tokens: int | None = None) -> float:
        if op in VIEW_OPS:
            return 0.0
        f = self.ops.get(op) or self.ops.get("*")
        return f.time_us(w) * self.factor(n_tokens) if f is not None else 0.0


@dataclass
class Calibration:
    devices: dict[str, DeviceCalibration]
    pass_a_us: float  # us per prompt pass outside the graph
    pass_b_us: float  # us per token of a prompt pass outside the graph
    elapsed_s: float = 0.0
    points: list[dict[str, Any]] = field(default_factory=list)  # the measurements the fits come from
    splits: list[dict[str, Any]] = field(default_factory=list)  # per timed split (node_overhead_us)
    # accelerator -> a decode pass with every host weight streamed to it (`realpass.measure_stream`)
    stream: dict[str, dict[str, Any]] = field(default_factory=dict)
    # accelerator -> a decode pass with the weights scattered over host and accelerator (`realpass.measure_scatter`)
    scatter: dict[str, dict[str, Any]] = field(default_factory=dict)
    routing: Routing | None = None  # a mixture of experts' routing in a real pass (routing.py)
    # accelerator -> (a, b): us = a + b * n_tokens a pass that runs nothing on it saves when the runtime
    # loads without it (an rpc-server: a placement that does not use it; outside.detached_us)
    detached: dict[str, list[float]] = field(default_factory=dict)
    # us outside the graph of a 1-token pass, which reuses the previous decode pass's graph (a prompt
    # pass builds its own: 0.6-1.3 ms at 8-128 tokens against 0.3 ms for a small MoE's decode);
    # None in a profile of method <= 12, whose one line ran through both
    decode_us: float | None = None

    def pass_overhead_us(self, n_tokens: int) -> float:
        if n_tokens == 1 and self.decode_us is not None:
            return self.decode_us
        return self.pass_a_us + self.pass_b_us * n_tokens

    def detached_us(self, acc: str | None, n_tokens: int) -> float:
        """What a pass running nothing on `acc` saves when the runtime loads without it (us)."""
        a, b = self.detached.get(acc or "", (0.0, 0.0))
        return a + b * n_tokens

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "routing": self.routing.to_json() if self.routing is not None else None}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Calibration:
        devs = {d: DeviceCalibration(v["node_overhead_us"], {k: OpFit(**f) for k, f in v["ops"].items()},
                                     v["matmul_scale"], v.get("n_matmuls", 0), v.get("anchor", 1.0),
                                     {int(n): float(r) for n, r in (v.get("anchors") or {}).items()},
                                     {int(n): float(r) for n, r in (v.get("mm_anchors") or {}).items()})
                for d, v in doc["devices"].items()}
        return Calibration(devs, doc["pass_a_us"], doc["pass_b_us"], doc.get("elapsed_s", 0.0), doc.get("points", []),
                           doc.get("splits", []), dict(doc.get("stream") or {}), dict(doc.get("scatter") or {}),
                           Routing.from_json(doc["routing"]) if doc.get("routing") else None,
                           {d: list(v) for d, v in (doc.get("detached") or {}).items()}, doc.get("decode_us"))

    def renamed(self, ren: dict[str, str]) -> Calibration:
        return Calibration({ren.get(k, k): v for k, v in self.devices.items()}, self.pass_a_us, self.pass_b_us,
                           self.elapsed_s, self.points, self.splits,
                           {ren.get(k, k): v for k, v in self.stream.items()},
                           {ren.get(k, k): v for k, v in self.scatter.items()}, self.routing,
                           {ren.get(k, k): v for k, v in self.detached.items()}, self.decode_us)


# --- measuring ------------------------------------------------------------------------------


def _split_stops(nodes: Sequence[_core.NodeTime]) -> list[int]:
    """Positions of the last node before each change of device (and the last node)."""
    return [r.index for k, r in enumerate(nodes) if k == len(nodes) - 1 or nodes[k + 1].device != r.device]


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

    def measure(self, n: int, n_past: int) -> None:
        llm, toks = self.llm, self.tokens
        prefix, batch = toks[:n_past], toks[n_past:n_past + n]
        with _core.NodeTimer(llm.native_context) as timer:
            timed_eval(llm, timer, prefix, batch, [])  # warm-up (graph build, allocation)
            runs = [timed_eval(llm, timer, prefix, batch, []) for _ in range(self.reps)]
            stops = _split_stops(runs[0].nodes)
            # split mode: the same run as without a timer but for the stops; the eval's time
            # outside the graph, paired within each run (so a noisy machine mostly cancels)
            split = [timed_eval(llm, timer, prefix, batch, stops) for _ in range(self._split_reps(runs))]
            # runs spread widely (a software GPU's threads sharing the host's cores: lavapipe's decode
            # pass 134-273 ms, median 181, where 3 runs gave 143): more of them before the median is kept
            while (len(split) < 4 * self.reps and _spread(split) > WIDE_SPREAD
                   and sum(r.wall_us for r in split) / 1e6 < WIDE_SECONDS):
                split.append(timed_eval(llm, timer, prefix, batch, stops))
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
        prefix, batch = toks[:n_past], toks[n_past:n_past + n]
        with _core.NodeTimer(llm.native_context) as timer:
            stops = _split_stops(timed_eval(llm, timer, prefix, batch, []).nodes)  # also the warm-up
            split = [timed_eval(llm, timer, prefix, batch, stops) for _ in range(self.reps)]
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


def _node_points(load: _Load) -> list[dict[str, Any]]:
    """Every timed node of every pass: median over the repeats of its node-mode time."""
    out = []
    for (n, n_past), runs in load.node_runs.items():
        for k, r in enumerate(runs[0].nodes):
            us = statistics.median(run.nodes[k].range_us for run in runs if k < len(run.nodes))
            w = work(r.op, r.ne, r.nbytes, r.src_ne, r.src_bytes)
            # the columns a weight matmul multiplies (the logits' matmul runs on the last token only)
            cols = r.ne[2] if r.op == "MUL_MAT_ID" else r.ne[1] * r.ne[2] * r.ne[3]
            out.append({"n_tokens": n, "n_past": n_past, "cols": cols, "split": load.split_of.get((n, n_past, k)),
                        "name": r.name, "op": r.op, "device": r.device,
                        "weight_type": r.weight_type, "src0_ne": list(r.src_ne[0]) if r.src_ne else [],
                        # MUL_MAT_ID: experts per token (ne[0] of its ids, the third source)
                        "n_expert_used": r.src_ne[2][0] if r.op == "MUL_MAT_ID" and len(r.src_ne) > 2 else 0,
                        "work": w, "us": us})
    return out


def calibrate(path: str | Path, devices: Sequence[str], profile: Any, *, threads: int, n_prefill: int = 32,
              n_ctx: int = 512, op_offload: bool = True, mmap: bool = True, reps: int = 3, max_fill_s: float = 10.0,
              progress: bool = True, max_rounds: int = MAX_ROUNDS, rounds_s: float = ROUNDS_S) -> Calibration:
    """Time the real graph of `path` on `devices` (the CPU first, then at most one accelerator)
    and fit the terms the one-op profile cannot see (module docstring). `profile`: the one-op
    Profile of the same model and devices, for the matmul scale.

    A shared machine can run 1.4-1.7x slower for seconds to minutes at a time (the project's VM: a
    small MoE's decode at 4.2-4.8 ms instead of 2.6-2.9 ms, at any load average), and a pass timed
    inside such a window scales its terms by it (one model's every prediction 45% slow; another's
    decode timed at 4.8 ms after 32 tokens and 3.0 ms after 510 in one round). So the measurements
    are repeated while the rounds so far took less than `rounds_s` seconds, at most `max_rounds`
    times, and each timed pass is taken from the round it ran fastest in (`merge_rounds`)."""
    t0 = time.perf_counter()
    rounds: list[Round] = []
    for k in range(max(max_rounds, 1)):
        if progress and k:
            print(f"\rcalibrate: round {k + 1} (each pass's fastest round is kept)".ljust(100), end="",
                  file=sys.stderr, flush=True)
        rounds.append(_measure_round(path, devices, threads=threads, n_prefill=n_prefill, n_ctx=n_ctx,
                                     op_offload=op_offload, mmap=mmap, reps=reps, max_fill_s=max_fill_s,
                                     progress=progress, routing=k == 0))
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
                                     progress=False, routing=False, host_only=True))
        spent_host += time.perf_counter() - t1
    m = merge_rounds(rounds)
    cal = fit(m.points, [(n, us) for (n, _), us in m.outside.items()], profile, m.splits, m.routing)
    cal.detached, cal.stream, cal.scatter = m.detached, m.stream, m.scatter
    cal.elapsed_s = time.perf_counter() - t0
    if progress:
        print(f"\rcalibrate: {len(m.points)} timed nodes, {len(rounds)} round(s) in {cal.elapsed_s:.1f} s".ljust(100),
              file=sys.stderr, flush=True)
    return cal


def _measure_round(path: str | Path, devices: Sequence[str], *, threads: int, n_prefill: int, n_ctx: int,
                   op_offload: bool, mmap: bool, reps: int, max_fill_s: float, progress: bool,
                   routing: bool = True, host_only: bool = False) -> Round:
    """One round of `calibrate`'s measurements (routing: also record a mixture of experts' routing,
    which does not change between rounds; host_only: the host load's passes alone)."""
    from ..model import gguf_file
    from ..runtime import devices as devmod
    from ..runtime.generate import prompt_tokens
    from ..runtime.llama import Llama

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
    for i, (what, kw) in enumerate(loads):
        t_load = time.perf_counter()
        if progress:
            print(f"\rcalibrate: real graph, {what} load ({i + 1}/{len(loads)})".ljust(100), end="",
                  file=sys.stderr, flush=True)
        try:
            llm = Llama(str(path), devices=[a.name for a in accs] or None, n_ctx=n_ctx, n_batch=n_big,
                        n_ubatch=n_big, n_threads=threads, n_threads_batch=threads, use_mmap=mmap,
                        flash_attn=False, verbose=False, **kw)
        except (OallamaError, ValueError, RuntimeError) as e:  # report which load failed
            raise ProfileError(f"calibration: could not load {path} ({what} load): {e}") from None
        try:
            tokens = prompt_tokens(llm, n_ctx)
            load = _Load(llm, tokens, reps)
            load.measure(n_prefill, 0)
            # a second prompt size, when its passes are cheap: prompt ops and matmuls grow unlike
            # tokens (a small MoE's weight matmuls cost 0.64x their 32-token time per token at 128 in the
            # real graph, 0.74x in the one-op profile), and a workload's ubatch is rarely the calibrated one
            est_s = load.walls[(n_prefill, 0)] / 1e6 * n_big / n_prefill * (2 + 2 * reps)
            if n_big > n_prefill and est_s < max_fill_s / 2:
                load.measure(n_big, 0)
            load.measure(1, n_prefill)
            # attention over a long KV cache, when filling it costs little (a few prompt passes)
            per_token_s = load.walls[(n_prefill, 0)] / 1e6 / n_prefill
            if per_token_s * (n_ctx - n_prefill) < max_fill_s:
                load.measure(1, n_ctx - 2)
            points += [{**p, "load": what} for p in _node_points(load)]
            splits += [{**s, "load": what} for s in load.splits]
            if what == "host":  # with an accelerator, reading its results back is the model's copies
                host_outside = outside.overheads(llm, load.outside, reps)
        finally:
            llm.close()
        if what == "host":
            host_s = time.perf_counter() - t_load
    if host_only:
        return Round(points, splits, host_outside, host_s=host_s)
    stream: dict[str, dict[str, Any]] = {}
    if accs and op_offload:
        if progress:
            print(f"\rcalibrate: real graph, every host weight streamed ({len(loads) + 1}/{len(loads) + 1})".ljust(100),
                  end="", file=sys.stderr, flush=True)
        st = measure_stream(path, accs[0].name, n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap,
                             reps=reps)
        if st is not None:
            stream[accs[0].name] = st
    scatter: dict[str, dict[str, Any]] = {}
    if accs:
        if progress:
            print("\rcalibrate: real graph, weights scattered over both devices".ljust(100), end="", file=sys.stderr,
                  flush=True)
        sc = measure_scatter(path, info, accs[0].name, n_gpu_layers=layers_that_fit(info, accs[0], n_layer),
                              n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap, reps=reps)
        if sc is not None:
            scatter[accs[0].name] = sc
    n_expert = int(info.hparam("expert_count", 0) or 0)
    routes = (measure_routing(path, n_expert, n_tokens=min(n_ctx, ROUTING_TOKENS), threads=threads, mmap=mmap,
                              progress=progress) if n_expert > 0 and routing else None)
    detached: dict[str, list[float]] = {}
    if accs and accs[0].kind == "rpc":  # the runtime loads a placement that uses no rpc-server without it
        if progress:
            print("\rcalibrate: host load without the accelerator".ljust(100), end="", file=sys.stderr, flush=True)
        detached[accs[0].name] = list(_line(outside.detached_us(
            path, host_outside, lambda llm, k: _Load(llm, prompt_tokens(llm, n_ctx), reps).outside_of(*k),
            n_ctx=n_ctx, n_prefill=n_prefill, threads=threads, mmap=mmap, reps=reps)))
    return Round(points, splits, host_outside, stream, scatter, routes, detached, host_s)


class _Op:
    """The profile lookup's view of a timed weight matmul (op, weight type, shape, columns)."""

    def __init__(self, p: dict[str, Any]) -> None:
        self.op = p["op"]
        self.weight_type = p["weight_type"]
        shape = list(p["src0_ne"])
        while len(shape) > 2 and shape[-1] == 1:
            shape.pop()
        self.weight_shape = tuple(shape)
        self.n_tokens = p.get("cols", p["n_tokens"])
        self.n_expert_used = int(p.get("n_expert_used", 0))
        self.layer = node_layer(p.get("name", ""))


def node_overhead_us(view_us: float, splits: Sequence[dict[str, Any]]) -> float:
    """What timing an op alone adds on a device (us). A split run at once costs one launch
    (about a view's time alone, `view_us`) plus its ops' compute; run node by node each op
    also pays this overhead:  sum(op times alone) - (split time - view_us) = n_ops * h."""
    n_ops = sum(s["n_ops"] for s in splits)
    if n_ops == 0:
        return view_us
    extra = sum(s["ops_us"] - (s["split_us"] - view_us) for s in splits)
    return max(extra / n_ops, view_us)


def _profile_us(profile: Any, dev: str, p: dict[str, Any], routing: Routing | None = None) -> float:
    """The one-op profile's compute time of a timed weight matmul (0 when it has none); of a
    MUL_MAT_ID at the distinct experts the recorded routing touches, as the pass model costs it."""
    op = _Op(p)
    act = None
    if routing is not None and op.op == "MUL_MAT_ID" and len(op.weight_shape) == 3:
        act = routing.active(op.weight_shape[2], op.n_expert_used, op.layer, op.n_tokens)
    try:
        return float(profile.compute_us(dev, op, active=act)) if profile is not None else 0.0
    except ProfileError:
        return 0.0


def fit(points: Sequence[dict[str, Any]], overheads: Sequence[tuple[int, float]], profile: Any,
        splits: Sequence[dict[str, Any]] = (), routing: Routing | None = None) -> Calibration:
    """The calibration's fits from its measurements (see the module docstring).

    Node-mode times give each node's share; split-mode times, taken without synchronising inside
    a split, give the totals: a device's fitted costs are scaled so that they sum to its measured
    split times (`anchor`), so a machine whose synchronisations are slow (a busy one) cannot shift
    the totals, only the shares."""
    raw_splits, splits = list(splits), context_bounded(splits)
    by_dev: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_dev[p["device"]].append(p)
    devs: dict[str, DeviceCalibration] = {}
    for dev, pts in by_dev.items():
        views = [p["us"] for p in pts if p["op"] in VIEW_OPS]
        view_us = statistics.median(views) if views else 0.0
        ops_us = sorted(p["us"] for p in pts if p["op"] not in VIEW_OPS)
        dev_splits = [s for s in splits if s["device"] == dev]
        # at most the 10th percentile of the ops' times alone: no op computes in less than nothing
        h = min(node_overhead_us(view_us, dev_splits), ops_us[len(ops_us) // 10] if ops_us else view_us)
        per_op: dict[str, list[tuple[float, float]]] = defaultdict(list)
        real = prof = 0.0
        n_mm = 0
        for p in pts:
            if p["op"] in VIEW_OPS:
                continue
            us = max(p["us"] - h, 0.0)
            if p["weight_type"] and p["op"] in MATMUL_OPS:
                t = _profile_us(profile, dev, p, routing)
                if t > 0:  # a ratio of sums: the big matmuls, whose times are well measured, weigh most
                    real, prof, n_mm = real + us, prof + t, n_mm + 1
                continue
            per_op[p["op"]].append((p["work"], us))
            per_op["*"].append((p["work"], us))
        dc = DeviceCalibration(h, {op: OpFit.fit(v) for op, v in per_op.items()}, real / prof if prof > 0 else 1.0,
                               n_mm)
        devs[dev] = _anchored(dc, dev, pts, dev_splits, view_us, profile, routing)
    # outside the graph: a decode pass reuses its predecessor's graph, a prompt pass builds its own
    # (one line through both put 21 us a token on a small MoE's prompt: 3.7 ms at 128 tokens, sampling
    # included, where 32- and 128-token passes timed give 2.0 ms; bench/results/2026-11-23-vm-method14)
    decode = [us for n, us in overheads if n == 1]
    prompt = [(n, us) for n, us in overheads if n > 1]
    a, b = _line(prompt or overheads)
    return Calibration(devs, a, b, points=list(points), splits=raw_splits, routing=routing,
                       decode_us=statistics.median(decode) if decode and prompt else None)


def _anchored(dc: DeviceCalibration, dev: str, pts: Sequence[dict[str, Any]], splits: Sequence[dict[str, Any]],
              view_us: float, profile: Any, routing: Routing | None = None) -> DeviceCalibration:
    """`dc` scaled so that its costs of the timed splits' nodes sum to their measured times."""
    key = ("load", "n_tokens", "n_past", "split")
    measured = {tuple(s.get(k) for k in key): s["split_us"] - view_us for s in splits}
    modelled: dict[tuple, float] = defaultdict(float)
    mm_by_n: dict[int, float] = defaultdict(float)  # n_tokens -> the timed weight matmuls' one-op time
    for p in pts:
        k = tuple(p.get(f) for f in key)
        if k not in measured or p["op"] in VIEW_OPS:
            continue
        if p["weight_type"] and p["op"] in MATMUL_OPS:
            t = _profile_us(profile, dev, p, routing)
            modelled[k] += t * dc.matmul_scale
            mm_by_n[int(k[1])] += t
        else:
            modelled[k] += dc.node_time_us(p["op"], p["work"])
    total_m = sum(max(v, 0.0) for k, v in measured.items() if k in modelled)
    total_f = sum(modelled.values())
    if total_m <= 0 or total_f <= 0:
        return dc
    r = total_m / total_f
    ops = {op: OpFit(f.a_us * r, f.b_us * r, f.n, f.max_rel_err) for op, f in dc.ops.items()}
    # then per pass size: its splits' measured total over its (globally scaled) modelled total
    by_n: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k, v in modelled.items():
        by_n[int(k[1])][0] += max(measured[k], 0.0)
        by_n[int(k[1])][1] += v * r
    anchors = {n: m / f for n, (m, f) in by_n.items() if m > 0 and f > 0}
    # A pass size whose nodes, timed one by one, took SYNC_BOUND x its splits run whole was mostly
    # synchronisation (a small model's decode pass on a loopback rpc-server: 16-34x): what is left of a
    # node's time after the overhead h is the round trip's noise, and the shares it gives are noise too
    # (qwen3moe-small: its 151936-row output matmul at 0.42 ms on the rpc-server, 1.86 ms alone, when all
    # its decode ops together were anchored to the pass). There the weight matmuls keep their one-op
    # time, which the profile measures apart from the round trip, and the other ops take the rest.
    mm_anchors: dict[int, float] = {}
    node_mode: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in splits:
        node_mode[int(s["n_tokens"])][0] += s["ops_us"]
        node_mode[int(s["n_tokens"])][1] += s["split_us"]
    for n, (m, _) in by_n.items():
        timed, whole = node_mode.get(n, (0.0, 0.0))
        mm = mm_by_n.get(n, 0.0)  # the one-op profile's time of the pass's timed weight matmuls
        rest = by_n[n][1] - mm * dc.matmul_scale * r  # the other ops, globally scaled
        if whole <= 0 or timed < SYNC_BOUND * whole or mm <= 0 or rest <= 0 or m < mm:
            continue
        anchors[n] = (m - mm) / rest
        mm_anchors[n] = 1.0 / (dc.matmul_scale * r)
    return DeviceCalibration(dc.node_overhead_us, ops, dc.matmul_scale * r, dc.n_matmuls, r, anchors, mm_anchors)


def _line(pts: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """us = a + b * n through (n, us) points, a, b >= 0 (a single size: all of it per pass)."""
    if not pts:
        return 0.0, 0.0
    f = OpFit.fit([(float(n), max(us, 0.0)) for n, us in pts])
    return f.a_us, f.b_us
