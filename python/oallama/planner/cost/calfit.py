"""The calibration's fits: the terms of calibrate.py's module docstring, from its measurements.

  work / OpFit         what a non-weight op's time grows with, and a line through its times;
  DeviceCalibration    one device's fitted terms (node overhead, other ops, weight matmul scale,
                       pass-size anchors);
  Calibration          every device's, the time outside the graph, and the measurements behind them;
  fit                  the fits from node-mode and split-mode times (see calibrate.py);
  span_factors,        the attention kinds' lines fitted to spans of the real graph timed whole at
  span_lines           two KV lengths (attnspan.py).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ...errors import ProfileError
from ..graph import node_layer
from .realpass import MATMUL_OPS, VIEW_OPS
from .routing import Routing

ANCHOR_OPS = 0.5  # a pass size gets its own factor on a device where it timed at least this share of the ops
# of the device's fullest timed pass (`_anchored`)
SYNC_SHARE = 2.0  # a pass size whose nodes timed one by one took this many times its splits run whole: mostly
# the timing's own synchronisation (an rpc-server's round trip per node); its anchor is taken with the lines its
# predictions use (`_anchored`)

def work(op: str, ne: Sequence[int], nbytes: int, src_ne: Sequence[Sequence[int]], src_bytes: int,
         attended: float | None = None) -> float:
    """What a non-weight op's time grows with: multiply-adds for a matmul of two activations
    (KQ, KQV: K = src0's row length) and for flash attention (q [D, n_tokens, n_head], k [D, n_kv],
    v [Dv, n_kv]: KQ and KQV fused over the cells each token attends to, n_tokens * n_head * cells *
    (D + Dv)), else bytes read + written. ggml's flash attention skips the cells the mask hides
    (the cache's unused cells, a prompt's later tokens): its cells are `attended` (the pass's mean
    over its tokens) where known, else the whole KV view (n_kv). Without flash attention the KQ
    matmul multiplies the whole view: a decode pass after 32 tokens costs it 256 cells.

    Two kinds count bytes where their multiply-adds or their result would mislead (`kind`):
    - a matmul of two activations with one column per head (a decode pass's KQ and KQV: a
      matrix-vector product) streams its K or V and multiplies little: the K or V elements it reads
      (in the cache's types: a calibration's, and a device model's, are fixed by its settings; Phi-3's
      32 K/V heads cost 3x what Llama 3's 8 shared by 32 queries cost per multiply-add). Not its
      sources' bytes: the V view of a cache without flash attention spans every cell of the context;
    - SET_ROWS (a pass's new K or V rows into the cache) reads its rows and their indices and writes
      the rows: its result and third source are the whole cache, whose size grows with the context
      and not with the work (Phi-3's 4 in a decode pass: 1 ms by the cache's bytes, 35-60 us measured).
      bench/results/2026-11-26-vm-setrows;
    - GET_ROWS (a token embedding's lookup) reads the rows it gathers, not its whole table.

    (A V cache without flash attention is written element by element: its own kind, `SCATTER`.)"""
    if op == "SET_ROWS" and len(src_ne) >= 3 and tuple(src_ne[2]) == tuple(ne):
        written = math.prod(src_ne[0]) * nbytes / max(math.prod(ne), 1)  # src0's elements in the cache's type
        return float(src_bytes - nbytes + written)
    if op == "GET_ROWS" and len(src_ne) >= 2:
        # the rows gathered, not the whole table (a token embedding's: a 151936-row vocabulary); its
        # indices are I32
        idx = 4 * math.prod(src_ne[1])
        rows = math.prod(src_ne[0][1:])
        return float(nbytes + idx + (src_bytes - idx) * math.prod(ne[1:]) / max(rows, 1))
    if kind(op, ne) == VEC and src_ne:
        return float(math.prod(src_ne[0]))
    if op in MATMUL_OPS and src_ne:
        return float(src_ne[0][0]) * math.prod(ne)
    if op == "FLASH_ATTN_EXT" and len(src_ne) >= 3:
        q, k, v = src_ne[0], src_ne[1], src_ne[2]
        cells = min(attended, k[1]) if attended is not None else k[1]
        return float(math.prod(q) // max(q[0], 1)) * cells * (q[0] + v[0])
    return float(nbytes + src_bytes)


VEC = "MUL_MAT:vec"  # the kind of a matmul of two activations with one column per head (`kind`)
SCATTER = "SET_ROWS:scatter"  # the kind of a cache write in rows of one element (`kind`)


def kind(op: str, ne: Sequence[int]) -> str:
    """The line a node's time is fitted on and costed by: its op, but
    - a MUL_MAT whose result has one column (a decode pass's KQ and KQV, per head and sequence) is
      VEC, whose work is the K or V elements it reads (`work`);
    - a SET_ROWS into rows of one element is SCATTER: llama.cpp keeps the V cache transposed without
      flash attention and writes a pass's V element by element, each to a row of the context's cells.
      On the K cache's line a prompt's V write cost 2.3x a K write by its bytes; it took 21-48x (Llama 3
      8B's widths, 256 tokens: 1.2-2.3 ms against 0.05-0.08 on the project's VM), and a 512-token
      prompt's four writes 16-19 ms on an H200 host's 8 threads where that line gave 7.5
      (bench/results/2026-11-27-h200-promptsplits)."""
    if op == "MUL_MAT" and len(ne) > 1 and ne[1] == 1:
        return VEC
    return SCATTER if op == "SET_ROWS" and ne and ne[0] == 1 else op


def byte_work(op: str) -> bool:
    """Whether `work` counts an op's bytes (else its multiply-adds)."""
    return op not in MATMUL_OPS and op != "FLASH_ATTN_EXT"


def unseen_op_fit(fits: Mapping[str, OpFit]) -> OpFit | None:
    """The line "*" that costs an op kind the calibration did not see (a device model costing
    another model's graph: Gemma 3's GEGLU and SCALE on Llama 3's reference): the median kind's
    intercept and slope over the kinds whose work is bytes. One line through every node put each
    unseen op at the attention matmuls' intercept, and one through the byte ops at the KV copies'
    (Gemma 3's 19 SCALE nodes of a decode pass at 1.1-1.3 ms, under 0.01 ms in its own calibration;
    bench/results/2026-11-26-vm-devicemodel-unseen-ops)."""
    kinds = [f for op, f in fits.items() if byte_work(op.split(":")[0]) and op != "*"]  # keys: `op_key`
    if not kinds:
        return None
    return OpFit(statistics.median(f.a_us for f in kinds), statistics.median(f.b_us for f in kinds),
                 sum(f.n for f in kinds))


def op_key(op: str, n_tokens: int | None) -> str:
    """The fit a node's time is taken from: its op, but flash attention in a one-token pass apart
    ("FLASH_ATTN_EXT:1"). One query row per head streams its K and V rows once for that row alone,
    where a prompt's rows share them (ggml's CPU kernel: tiles of query rows); one line through
    both put a decode's attention after 4000 tokens at half its time."""
    return f"{op}:1" if op == "FLASH_ATTN_EXT" and n_tokens == 1 else op


@dataclass
class OpFit:
    """us = a_us + b_us * work, fitted on n nodes (max relative residual kept for the record); past each
    knot's work the slope changes by its us per unit of work (a prompt's attention past 1024 cells,
    `span_factors`' tails)."""

    a_us: float
    b_us: float
    n: int
    max_rel_err: float = 0.0
    knots: list[tuple[float, float]] = field(default_factory=list)  # (work, slope change, us per unit of work)

    def time_us(self, w: float) -> float:
        return self.a_us + self.b_us * w + sum(d * (w - k) for k, d in self.knots if w > k)

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


@dataclass
class DeviceCalibration:
    node_overhead_us: float  # us added by timing one node alone
    ops: dict[str, OpFit]  # non-weight op -> fit; "*": an op kind not seen (`unseen_op_fit`)
    matmul_scale: float  # real-graph / profile time of weight matmuls (ratio of sums; 1.0 if none seen)
    n_matmuls: int = 0
    anchor: float = 1.0  # the factor that made the fitted costs sum to the measured split times
    anchors: dict[int, float] = field(default_factory=dict)  # n_tokens -> that pass size's further factor
    # line keys fitted to attention spans timed whole (`span_lines`): they give whole-run times already, so
    # neither the anchor nor a pass size's factor scales them (`_anchored`)
    whole: list[str] = field(default_factory=list)

    def factor(self, n_tokens: int | None) -> float:
        """The pass-size factor for a pass of n_tokens: between two timed sizes, interpolated on a
        log scale of tokens; beyond them, the nearest one's."""
        return interpolated(self.anchors, n_tokens)

    def scale_for(self, n_tokens: int | None) -> float:
        """Real-graph / profile time of weight matmuls in a pass of n_tokens. One ratio for every
        shape: a ratio per shape (calibration method 18-26) did no better on the held-out set, and
        a little worse (bench/results/2026-11-26-vm-refit-ablation)."""
        return self.matmul_scale * interpolated(self.anchors, n_tokens)

    def line(self, op: str, n_tokens: int | None = None) -> OpFit | None:
        """The line an op's node takes in a pass of n_tokens: a one-token pass's own where the kind has
        one ("<op>:1": flash attention's fit apart, `op_key`; the attention kinds' decode lines fitted
        to spans, `span_lines`), else the kind's; an op kind not seen: "*" for one whose work is bytes,
        the attention matmuls' line for one in multiply-adds."""
        key = self.line_key(op, n_tokens)
        return self.ops[key] if key is not None else None

    def line_key(self, op: str, n_tokens: int | None = None) -> str | None:
        """The key of `line`'s fit in `ops` (None: no line)."""
        for key in ((f"{op}:1",) if n_tokens == 1 else ()) + (op, "*" if byte_work(op) else "MUL_MAT"):
            if key in self.ops:
                return key
        return None

    def node_time_us(self, op: str, w: float, n_tokens: int | None = None) -> float:
        if op in VIEW_OPS:
            return 0.0
        key = self.line_key(op, n_tokens)
        if key is None:
            return 0.0
        t = self.ops[key].time_us(w)
        return t if key in self.whole else t * self.factor(n_tokens)


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
    # loads without it (an rpc-server: a placement that does not use it; outside.alone_us, outside.saved)
    detached: dict[str, list[float]] = field(default_factory=dict)
    # us outside the graph of a 1-token pass, which reuses the previous decode pass's graph (a prompt
    # pass builds its own: 0.6-1.3 ms at 8-128 tokens against 0.3 ms for a small MoE's decode);
    # None in a profile of method <= 12, whose one line ran through both
    decode_us: float | None = None
    # per round: "n_tokens,n_past" -> us outside the graph, and the accelerator -> its detached line
    # (the record behind pass_a_us, pass_b_us, decode_us and detached: rounds.merge_rounds)
    rounds_outside: list[dict[str, float]] = field(default_factory=list)
    rounds_detached: list[dict[str, list[float]]] = field(default_factory=list)
    # per round: the accelerator -> "n_tokens,n_past" -> us outside the graph without it attached
    rounds_alone: list[dict[str, dict[str, float]]] = field(default_factory=list)
    # the host's passes with its repackable weights repacked and in plain memory (`realpass.measure_layouts`;
    # None: nothing repacked, or a profile of method <= 21)
    layouts: dict[str, Any] | None = None
    # accelerator -> terms carried already derived, by a device model (devicemodel.py): split_us (a change
    # of device, us), stream_latency_us and stream_bytes_per_us (streamed weights' link)
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    # attention spans timed whole at two KV lengths (attnspan.measure), which the attention kinds' lines are
    # fitted to (`span_lines`); empty where measuring them would have taken too long
    spans: list[dict[str, Any]] = field(default_factory=list)

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
                                     list(v.get("whole") or []))
                for d, v in doc["devices"].items()}
        known = {f.name for f in fields(Calibration)} - {"devices", "routing"}  # a field absent or null: its default
        return Calibration(devs, routing=Routing.from_json(doc["routing"]) if doc.get("routing") else None,
                           **{k: v for k, v in doc.items() if k in known and v is not None})

    def renamed(self, ren: dict[str, str]) -> Calibration:
        """The same with its devices renamed (`ren`: old -> new name) wherever a device names an entry."""
        def by_dev(d: dict[str, Any]) -> dict[str, Any]:
            return {ren.get(k, k): v for k, v in d.items()}

        return replace(self, devices=by_dev(self.devices), stream=by_dev(self.stream), scatter=by_dev(self.scatter),
                       detached=by_dev(self.detached), links=by_dev(self.links),
                       rounds_detached=[by_dev(r) for r in self.rounds_detached],
                       rounds_alone=[by_dev(r) for r in self.rounds_alone],
                       spans=[{**sp, "device": ren.get(sp["device"], sp["device"])} for sp in self.spans])


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
        splits: Sequence[dict[str, Any]] = (), routing: Routing | None = None,
        spans: Sequence[dict[str, Any]] = ()) -> Calibration:
    """The calibration's fits from its measurements (see the module docstring); spans: attention
    spans timed whole (attnspan.measure), which the attention kinds' lines are fitted to before the
    anchors (`span_lines`).

    Node-mode times give each node's share; split-mode times, taken without synchronising inside
    a split, give the totals: a device's fitted costs are scaled so that they sum to its measured
    split times (`anchor`), so a machine whose synchronisations are slow (a busy one) cannot shift
    the totals, only the shares."""
    # passes timed whole only to fix their size's anchor (calibrate._whole_passes: one node-by-node run, a
    # span's stops inside) enter no line, no node overhead and no synchronisation test
    anchor_pts = [p for p in points if p.get("anchor_only")]
    anchor_splits = [s for s in splits if s.get("anchor_only")]
    points = [p for p in points if not p.get("anchor_only")]
    splits = [s for s in splits if not s.get("anchor_only")]
    by_dev: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_dev[p["device"]].append(p)
    devs: dict[str, DeviceCalibration] = {}
    for dev, pts in by_dev.items():
        views = [p["us"] for p in pts if p["op"] in VIEW_OPS]
        view_us = statistics.median(views) if views else 0.0
        ops_us = sorted(p["us"] for p in pts if p["op"] not in VIEW_OPS)
        dev_splits = [s for s in splits if s["device"] == dev]
        # at most what a cheap op (no weight) of the smallest pass took alone: its compute is next to
        # nothing, so that is the overhead as a node usually pays it
        n_min = min((p["n_tokens"] for p in pts), default=1)
        cheap = [p["us"] for p in pts if p["n_tokens"] == n_min and p["op"] not in VIEW_OPS
                 and not (p["weight_type"] and p["op"] in MATMUL_OPS)]
        h = min(node_overhead_us(view_us, dev_splits), statistics.median(cheap) if cheap else
                (ops_us[len(ops_us) // 10] if ops_us else view_us))
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
            per_op[op_key(p.get("kind", p["op"]), p["n_tokens"])].append((p["work"], us))
        fits = {op: OpFit.fit(v) for op, v in per_op.items()}
        if star := unseen_op_fit(fits):
            fits["*"] = star
        dc = DeviceCalibration(h, fits, real / prof if prof > 0 else 1.0, n_mm)
        spanned = span_lines(dc, span_factors({dev: dc}, spans).get(dev, {}))
        dc.ops.update(spanned)
        # a pass kind whose node times were mostly synchronisation keeps its span lines anchored (`_anchored`)
        own = {pass_kind(n) for n in sync_bound(dev_splits)}
        dc.whole = sorted(k for k in spanned if pass_kind(1 if k.endswith(":1") else None) not in own)
        devs[dev] = _anchored(dc, dev, pts, dev_splits, view_us, profile, routing,
                              [p for p in anchor_pts if p["device"] == dev],
                              [s for s in anchor_splits if s["device"] == dev])
    # outside the graph: a decode pass reuses its predecessor's graph, a prompt pass builds its own
    # (one line through both put 21 us a token on a small MoE's prompt: 3.7 ms at 128 tokens, sampling
    # included, where 32- and 128-token passes timed give 2.0 ms; bench/results/2026-11-23-vm-method14)
    decode = [us for n, us in overheads if n == 1]
    prompt = [(n, us) for n, us in overheads if n > 1]
    a, b = line(prompt or overheads)
    return Calibration(devs, a, b, points=points + anchor_pts, splits=splits + anchor_splits, routing=routing,
                       decode_us=statistics.median(decode) if decode and prompt else None, spans=list(spans))


def refitted(cal: Calibration, profile: Any) -> Calibration:
    """`cal` with its devices' terms fitted again by this code from the node and split times it keeps,
    everything else as measured: a change of the fit scored on stored measurements, nothing run
    (bench/heldout/refit.py, bench/scripts/repredict.py). Points stored by calibration method 28 or
    before carry that method's works (a SET_ROWS node's the whole cache's, a decode pass's KQ and KQV
    in multiply-adds, no "kind"): bench/results/2026-11-26-vm-setrows/setrows_refit.py converts f16
    caches' (`rows_work`, `vec_points`)."""
    return replace(cal, devices=fit(cal.points, [], profile, cal.splits, cal.routing, cal.spans).devices)


def _anchored(dc: DeviceCalibration, dev: str, pts: Sequence[dict[str, Any]], splits: Sequence[dict[str, Any]],
              view_us: float, profile: Any, routing: Routing | None = None, anchor_pts: Sequence[dict[str, Any]] = (),
              anchor_splits: Sequence[dict[str, Any]] = ()) -> DeviceCalibration:
    """`dc` scaled so that its costs of the timed splits' nodes sum to their measured times; anchor_pts,
    anchor_splits: passes that fix their own size's factor only, not the device's `anchor`."""
    key = ("load", "n_tokens", "n_past", "split")
    own = sync_bound(splits)
    timed = {int(s["n_tokens"]) for s in splits}  # a size the loads timed keeps their factor
    anchor_splits = [s for s in anchor_splits if int(s["n_tokens"]) not in timed]
    anchor_pts = [p for p in anchor_pts if int(p["n_tokens"]) not in timed]
    extra = {tuple(s.get(k) for k in key) for s in anchor_splits}
    pts = [*pts, *anchor_pts]
    splits = [*splits, *anchor_splits]
    measured = {tuple(s.get(k) for k in key): s["split_us"] - view_us for s in splits}
    # A node whose line was fitted to spans timed whole (`dc.whole`) costs its run time already: that time is taken
    # out of the measured split and the anchors scale the rest. Anchored with them, a decode anchor of 0.36 (its
    # nodes timed alone summed to 2.7x the pass) shrank tiny's flash attention after 4000 cells to a third of its
    # spans' growth (bench/results/2026-11-28-vm-long-context-spans). The other nodes of a pass are modelled with
    # each kind's prompt line, a decode pass's too. Not where the pass's nodes timed alone were mostly
    # synchronisation (`sync_bound`): there a span's time less one node's overhead is the round trip's noise, its
    # lines' intercepts with it, so they are not `whole` and only the anchor taken with their own lines makes the
    # timed pass cost what it measured (the mid model's decode with every layer on a loopback rpc-server: 2.35-4.19
    # ms over six calibrations, 4.00 measured; 3.67-4.23 so; bench/results/2026-11-26-vm-rpc-decode-anchor).
    modelled: dict[tuple, float] = defaultdict(float)
    for p in pts:
        k = tuple(p.get(f) for f in key)
        if k not in measured or p["op"] in VIEW_OPS:
            continue
        if p["weight_type"] and p["op"] in MATMUL_OPS:
            modelled[k] += _profile_us(profile, dev, p, routing) * dc.matmul_scale
            continue
        n, op = int(p["n_tokens"]), p.get("kind", p["op"])
        line = dc.line_key(op, n)
        if line in dc.whole:
            measured[k] -= dc.ops[line].time_us(p["work"])
        else:
            modelled[k] += dc.node_time_us(op, p["work"], n if n in own else None)
    total_m = sum(max(v, 0.0) for k, v in measured.items() if k in modelled and k not in extra)
    total_f = sum(v for k, v in modelled.items() if k not in extra)
    if total_m <= 0 or total_f <= 0:
        return dc
    r = total_m / total_f
    ops = {op: f if op in dc.whole else replace(f, a_us=f.a_us * r, b_us=f.b_us * r,
                                                knots=[(k, d * r) for k, d in f.knots]) for op, f in dc.ops.items()}
    # then per pass size: its splits' measured total over its (globally scaled) modelled total
    by_n: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k, v in modelled.items():
        by_n[int(k[1])][0] += max(measured[k], 0.0)
        by_n[int(k[1])][1] += v * r
    # a pass size the device ran only a sliver of stays unanchored (the factors of the sizes around it
    # apply): lavapipe's 64-token accelerator load left the host one GET_ROWS (36 us measured, 15
    # modelled), and its factor 2.4 priced every host op of a 64-token pass at 2.4x (tiny's host-only
    # 128-token prompt at 27.7 ms, measured 11.9; bench/results/2026-11-24-vm-vulkan-method21)
    ops_by_pass: dict[tuple, int] = defaultdict(int)  # (load, n_tokens, n_past) -> non-view nodes timed
    for p in pts:
        if p["op"] not in VIEW_OPS and tuple(p.get(f) for f in key) in measured:
            ops_by_pass[(p.get("load"), int(p["n_tokens"]), p.get("n_past"))] += 1
    ops_by_n: dict[int, int] = defaultdict(int)
    for (_, n, _), c in ops_by_pass.items():
        ops_by_n[n] = max(ops_by_n[n], c)
    most = max(ops_by_n.values(), default=0)
    anchors = {n: m / f for n, (m, f) in by_n.items() if m > 0 and f > 0 and ops_by_n[n] >= ANCHOR_OPS * most}
    return DeviceCalibration(dc.node_overhead_us, ops, dc.matmul_scale * r, dc.n_matmuls, r, anchors, dc.whole)


def sync_bound(splits: Sequence[dict[str, Any]]) -> set[int]:
    """Pass sizes (tokens) whose nodes, timed one by one, took SYNC_SHARE x or more the time of their splits
    run whole (one device's splits): what those node times hold is mostly the timing's synchronisation."""
    timed: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in splits:
        timed[int(s["n_tokens"])][0] += s["ops_us"]
        timed[int(s["n_tokens"])][1] += s["split_us"]
    return {n for n, (ops, whole) in timed.items() if whole > 0 and ops >= SYNC_SHARE * whole}


def pass_kind(n_tokens: int | None) -> str:
    """A pass's kind for the span factors: "1" a one-token (decode) pass, "n" a prompt pass."""
    return "1" if n_tokens == 1 else "n"


def span_factors(devs: Mapping[str, DeviceCalibration], spans: Sequence[Mapping[str, Any]]
                 ) -> dict[str, dict[str, dict[str, Any]]]:
    """Per device and pass kind ("1", "n"), the factors on the lines of the op kinds whose work grows
    in the spans ("kinds") that make those lines give the spans' measured times: "factor" on their
    slopes, the spans' growth from the short to the long KV cache over the growth the lines give;
    "intercept" on their intercepts, the short spans' times (less what a timed stop adds, the
    device's node overhead) over what the lines, slopes scaled, give. A device or pass kind whose
    measured or modelled growth is not positive gets none.

    Why: node-by-node times put the attention's cost in its growth or in its intercept by the noise
    of what timing a node alone adds. Two characterisations of this VM's CPU gave the attention
    matmuls' line slopes 2x apart, and a decode KQ 80 us by its intercept where the span of KQ,
    softmax and KQV took 104 us (bench/results/2026-11-26-vm-heldout-devicemodel-v5)."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for s in spans:
        dc = devs.get(s["device"])
        if dc is None:
            continue
        key, n = (s["device"], pass_kind(s["n_tokens"])), int(s["n_tokens"])
        sums[key][0] += s["long_us"] - s["short_us"]
        sums[key][1] += sum(dc.node_time_us(op, wl, n) - dc.node_time_us(op, ws, n) for op, ws, wl in s["nodes"])
        kinds[key] |= {op for op, ws, wl in s["nodes"] if wl > ws}
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (dev, pk), (m, f) in sums.items():
        if m > 0 and f > 0:
            ks = kinds[(dev, pk)]
            out[dev][pk] = {"factor": m / f, "kinds": sorted(ks), "measured_us": m, "modelled_us": f,
                            "intercept": _span_intercept(devs[dev], spans, dev, pk, m / f, ks),
                            "tails": _span_tails(devs[dev], spans, dev, pk, m / f)}
    return dict(out)


def _span_tails(dc: DeviceCalibration, spans: Sequence[Mapping[str, Any]], dev: str, pk: str,
                factor: float) -> list[dict[str, Any]]:
    """Per segment between the long KV cache and each longer one the spans were timed after (a prompt
    pass's, attnspan.PROMPT_TAIL; a decode pass's, the workloads' pasts, attnspan.measure_decode), its
    measured growth over the growth the slopes (scaled by `factor`) give: "ratio", and each kind's work
    where the segment starts ("from": kind -> work, the median over the spans' nodes). A tail's growth is
    taken against the long passes of its own run ("base_us"; else the span's "tail_base_us"): tails
    timed in separate runs, minutes apart, do not mix the VM's drift into a segment. A 512-token pass's attention past 1024 cells grows about 1.4x faster per unit of work
    than below (this VM's CPU, `mid` 2L and Llama-3-8B 1L: the line through 0 and 1024 cells 22-23% short
    after 3584; bench/results/2026-11-28-vm-attention-curve)."""
    segs: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])  # past -> measured, modelled growth (us)
    starts: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        if s["device"] != dev or pass_kind(s["n_tokens"]) != pk or not s.get("tails"):
            continue
        n = int(s["n_tokens"])
        prev_g, prev_w = 0.0, [wl for _, _, wl in s["nodes"]]  # growth past the long cache (us), works there
        for t in sorted(s["tails"], key=lambda t: t["past"]):
            seg = segs[int(t["past"])]
            g = t["us"] - float(t.get("base_us", s.get("tail_base_us", 0.0)))  # against its own run's long passes
            seg[0] += g - prev_g
            for (op, _, _), w0, w1 in zip(s["nodes"], prev_w, t["works"], strict=True):
                if w1 > w0:  # as span_factors models the growth, slopes scaled by `factor`
                    seg[1] += factor * (dc.node_time_us(op, w1, n) - dc.node_time_us(op, w0, n))
                    starts[int(t["past"])][op].append(w0)
            prev_g, prev_w = g, t["works"]
    return [{"past": p, "ratio": max(m / f, 0.0), "measured_us": m, "modelled_us": f,
             "from": {op: statistics.median(ws) for op, ws in starts[p].items()}}
            for p, (m, f) in sorted(segs.items()) if f > 0]


def _span_intercept(dc: DeviceCalibration, spans: Sequence[Mapping[str, Any]], dev: str, pk: str, factor: float,
                    kinds: set[str]) -> float:
    """The factor on the kinds' intercepts that makes the short spans' modelled times (slopes scaled by
    `factor`) their measured ones; at least 0."""
    rest = base = 0.0  # us: measured less modelled; the kinds' intercepts as modelled
    for s in spans:
        if s["device"] != dev or pass_kind(s["n_tokens"]) != pk:
            continue
        n = int(s["n_tokens"])
        model = 0.0
        for op, ws, _ in s["nodes"]:
            f = dc.line(op, n)
            if op in kinds and f is not None:
                model += (f.a_us + f.b_us * factor * ws) * dc.factor(n)
                base += f.a_us * dc.factor(n)
            else:
                model += dc.node_time_us(op, ws, n)
        rest += s["short_us"] - dc.node_overhead_us - model
    return max(1.0 + rest / base, 0.0) if base > 0 else 1.0


def span_lines(dc: DeviceCalibration, by_kind: Mapping[str, Mapping[str, Any]]) -> dict[str, OpFit]:
    """The device's attention lines with their slopes and intercepts scaled by `span_factors`' entry for
    it: a decode pass's under "<kind>:1" (from its own line where it has one), a prompt pass's under
    the kind's own key."""
    out: dict[str, OpFit] = {}
    for pk in ("1", "n"):  # "1" first: it starts from the kind's line before "n" scales it
        a = by_kind.get(pk)
        for op in a["kinds"] if a else ():
            base = dc.line(op, 1 if pk == "1" else None)
            if base is not None:
                b = base.b_us * float(a["factor"])
                tails = [t for t in a.get("tails", ()) if op in t["from"]]
                ratios = [1.0] + [float(t["ratio"]) for t in tails]  # each segment's slope over the first's
                knots = [(float(t["from"][op]), b * (r - r0)) for t, r0, r in zip(tails, ratios[:-1], ratios[1:], strict=True)]
                out[f"{op}:1" if pk == "1" else op] = replace(base, a_us=base.a_us * float(a["intercept"]), b_us=b,
                                                              knots=knots)
        if pk == "1":
            dc = replace(dc, ops={**dc.ops, **out})
    return out


def interpolated(by_size: Mapping[int, float], n_tokens: int | None) -> float:
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


def line(pts: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """us = a + b * n through (n, us) points, a, b >= 0 (a single size: all of it per pass)."""
    if not pts:
        return 0.0, 0.0
    f = OpFit.fit([(float(n), max(us, 0.0)) for n, us in pts])
    return f.a_us, f.b_us
