"""What ggml's scheduler does with a placement, and what the result costs.

A `PassModel` abstracts one graph (one ubatch of n tokens, as llama.cpp builds it) for the host
CPU and one accelerator. For a placement -- which weights live on the accelerator, which layers'
KV cache does (llama.cpp's n_gpu_layers puts the *last* k layers' KV there), and from which
batch each host weight's op is streamed to the accelerator (patch 0001) -- it reproduces the
scheduler's node -> device assignment (ggml-backend.cpp, ggml_backend_sched_split_graph):

  pass 1  a node in pre-allocated memory runs where that memory is (KV cache writes and views);
          a graph input runs on the CPU; a node reading a weight runs where the weight is,
          except that a host weight's op moves to the accelerator when it is streamed at this
          batch (ROPE and FLASH_ATTN_EXT are never pinned by their small weights);
  pass 2  every other node, views skipped, runs on the accelerator if the nearest pass-1 node
          before it or after it (graph order) does and the accelerator supports it, else on
          the CPU ("expand gpu down/up", then "expand rest").

and then costs the assignment (microseconds):

  compute  each weight matmul at its profiled time on its device, less the launch that time
           includes (`Profile.compute_us`), times the device's real-graph scale for a pass of
           this size; with a calibration (calibrate.py), every other non-view op too, at its
           device's fitted cost for this pass size (attention grows with the KV length of the
           graph the pass model was built for);
  copies   each tensor read on a device other than its own is copied once to that device, and
           the logits, when computed on the accelerator, are read back to the host:
           T'(bytes) from that direction's measured curve (`profile.Link`; profiled: to the device
           as handed over, back as waited for); a streamed weight is such a copy of the whole weight,
           on the link the calibration measured weights streaming at in a real load (`stream`,
           `set_stream`; the h2d link without one) -- but of a streamed expert tensor (MUL_MAT_ID)
           the scheduler copies only the experts the pass's tokens were routed to
           (ggml_backend_sched_compute_splits): the share of its layer's experts the model's
           recorded routing touches in a pass of this size (`routing.Routing.share`, calibrated),
           uniform routing's `expert_fraction` without a calibration;
  splits   each change of device along the graph order starts a split: the device's issue cost
           (a graph handed over; profiled), plus what a change costs beyond it in a real pass (a
           CPU<->accelerator synchronisation; calibrated, `set_split_cost`; the first split follows
           no change);
  outside  the pass's time outside its graph (calibrated: a + b * n_tokens), less what an attached
           accelerator's synchronisations cost when the pass runs nothing on it and the runtime
           loads without it (an rpc-server no weight uses; `outside.detached_us`).

tests/test_plan.py checks the assignment against the real scheduler on random placements.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...runtime.place import TIED, tied_output
from ...runtime.planfile import NEVER  # noqa: F401  (planner modules use schedmodel.NEVER)
from ..graph import AttentionLayers, Graph, Node, class_key, layer_of, node_layer
from .calfit import Calibration, kind, work
from .profile import DUAL, HOST_LAYOUTS, PLAIN, REPACK, Link, Profile
from .routing import Routing

HOST = "CPU"
_KV_LEAF = re.compile(r"^cache_[a-z]+_l(\d+)$")
_NOT_PINNED_BY_WEIGHT = ("ROPE", "FLASH_ATTN_EXT")


def op_batch(node: Node) -> int:
    """Batch size of an op for offload decisions (same as ggml-cuda and patch 0001)."""
    if node.op == "GET_ROWS":
        return 0
    if node.op == "MUL_MAT":
        return node.ne[1]
    if node.op == "MUL_MAT_ID":
        return node.ne[2]
    return node.ne[1] * node.ne[2] * node.ne[3]


def expert_fraction(n_expert: int, n_used: int, n_tokens: int) -> float:
    """Expected share of a [k, m, n_expert] expert tensor that n_tokens tokens, each routed to
    n_used distinct experts, touch: 1 - (1 - n_used/n_expert)^n_tokens (routing taken as uniform;
    exact at one token). ggml's scheduler copies only those experts when it streams the tensor."""
    if n_expert <= 0 or n_used <= 0:
        return 1.0
    return 1.0 - (1.0 - min(n_used, n_expert) / n_expert) ** max(n_tokens, 1)


def expert_shares(graph: Graph, routing: Routing | None) -> dict[str, float]:
    """Expert tensor -> the share of it a pass of this graph copies when the tensor is streamed:
    the experts its MUL_MAT_ID's tokens are routed to, by the recorded routing (calibrated), else
    uniform routing's `expert_fraction`."""
    out: dict[str, float] = {}
    for n in graph.nodes:
        if n.op == "MUL_MAT_ID" and n.weight and len(n.srcs) > 2 and n.weight_slot == 0:
            w, ids = graph.tensor(n.srcs[0]), graph.tensor(n.srcs[2])  # [k, m, n_expert], [n_used, n_tokens]
            active = routing.active(w.ne[2], ids.ne[0], layer_of(n.weight), n.ne[2]) if routing else None
            out[n.weight] = active / w.ne[2] if active is not None else expert_fraction(w.ne[2], ids.ne[0], n.ne[2])
    return out


@dataclass(frozen=True)
class Placement:
    """A planner's decision for one model on (CPU, accelerator)."""

    on_acc: frozenset[str] = frozenset()  # weights in accelerator memory
    kv_layers: int = 0  # the last kv_layers layers are "on the accelerator": their KV cache, and
    #                     the nodes llama.cpp pins to a layer's device (see n_gpu_layers)
    min_batch: Mapping[str, int] = field(default_factory=dict)  # host weight -> stream at batch >= this
    # host weight -> its layout (profile.HOST_LAYOUTS or DUAL); absent: the default load's
    layouts: Mapping[str, str] = field(default_factory=dict)
    dual_max_batch: int = 0  # DUAL weights: ops of fewer columns use the repacked copy (patch 0006)

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's n_gpu_layers giving kv_layers: it counts the output layer first. With no KV
        layer on the accelerator, 1 where the input embedding is placed there: of a tied model, the
        load then puts its output copy there alone (place.explicit)."""
        return self.kv_layers + 1 if self.kv_layers > 0 else int(TIED in self.on_acc)

    def with_layouts(self, layouts: Mapping[str, str], dual_max_batch: int = 0) -> Placement:
        return Placement(self.on_acc, self.kv_layers, self.min_batch, dict(layouts), dual_max_batch)

    def layout_of(self, weight: str, batch: int) -> str | None:
        """The host layout `weight`'s op runs in at `batch` columns (None: the default load's)."""
        lay = self.layouts.get(weight)
        if lay == DUAL:
            return REPACK if batch < self.dual_max_batch else PLAIN
        return lay

    def streams(self, weight: str, batch: int, default: bool) -> bool:
        m = self.min_batch.get(weight)
        return default if m is None else batch >= m


# Device indicator of a node, as the planner's MILP sees it: ("c", 0|1) constant;
# ("w", weight, offloadable, default_offload, batch) weight-pinned; ("kv", layer): on the device of
# that layer (its KV cache, or a node llama.cpp pins to the layer); ("free", supported).
Kind = tuple


@dataclass
class PassCost:
    compute_us: float  # weight matmuls
    copy_us: float
    launch_us: float
    n_splits: int
    n_copies: int
    copy_bytes: int
    on_acc: dict[int, bool]  # node index -> runs on the accelerator
    other_us: float = 0.0  # every other op (calibrated; 0 without a calibration)
    overhead_us: float = 0.0  # outside the graph (calibrated)
    acc_us: float = 0.0  # of compute + other: on the accelerator
    stream_us: float = 0.0  # of copy_us: host weights streamed to the accelerator
    stream_bytes: int = 0  # of copy_bytes: those weights (bytes)
    n_streamed: int = 0  # how many weights stream

    @property
    def total_us(self) -> float:
        return self.compute_us + self.other_us + self.copy_us + self.launch_us + self.overhead_us


class PassModel:
    """One graph, its scheduling rules and its cost coefficients (see module docstring)."""

    def __init__(self, graph: Graph, profile: Profile | None, acc: str | None, *, n_layer: int, op_offload: bool = True,
                 full_graph: Graph | None = None, attended: float | None = None,
                 attention: AttentionLayers | None = None) -> None:
        """graph: the ubatch's graph with every weight in host memory and n_gpu_layers=0 (its
        scheduling shows llama.cpp's default op offload); full_graph: the same graph with every
        layer offloaded, whose only use is to see which nodes llama.cpp pins in that mode;
        attended: the KV cells a token of the pass attends to (mean; calfit.work), at most a
        sliding-window layer's window (`attention`)."""
        self.graph = graph
        self.attended = attended
        self.attention = attention
        self.acc = acc
        self.n_tokens = graph.n_tokens
        self.n_layer = n_layer
        self.op_offload = op_offload
        # a host weight's op can be streamed only from plain host memory (not CPU_REPACK)
        self.streamable = {lf.weight: lf.host_buffer for lf in graph.leafs if lf.weight}
        self.order = [n.index for n in graph.nodes if not n.is_view]  # what the scheduler walks
        # the logits, which llama.cpp reads back to the host after the pass: (node, bytes)
        outs = [i for i in self.order if graph.nodes[i].is_output]
        self.readback: tuple[int, int] | None = (outs[-1], graph.nodes[outs[-1]].nbytes) if outs else None
        pins_full = {n.index for n in graph.nodes if n.caller_pinned}
        if full_graph is not None:
            if [n.name for n in full_graph.nodes] != [n.name for n in graph.nodes]:
                raise ValueError("full-offload graph differs from the base graph")
            pins_full = {n.index for n in full_graph.nodes if n.caller_pinned}
        # a tied model's input lookups (GET_ROWS of token_embd): the load keeps that copy on the host
        # wherever the plan puts the embedding, whose placement is its output copy's (place.explicit)
        tied = tied_output(lf.weight for lf in graph.leafs if lf.weight)
        self.lookups = {n.index for n in graph.nodes if tied and n.weight == TIED and n.op == "GET_ROWS"}
        # per mode (False: some layers on the host, True: every layer offloaded)
        self.kinds: dict[bool, dict[int, Kind]] = {}
        self.anchor_map: dict[bool, dict[int, tuple[int | None, int | None]]] = {}
        for full, pins in ((False, {n.index for n in graph.nodes if n.caller_pinned}), (True, pins_full)):
            kind = {i: self._classify(graph.nodes[i], i in pins) for i in self.order}
            self.kinds[full] = kind
            self.anchor_map[full] = self._anchors(kind)
        self.kind = self.kinds[False]
        self.anchors = self.anchor_map[False]
        # data each node reads: (source, bytes); source = ("node", i) | ("w", weight) | ("kv", l) | ("c", 0|1)
        self.reads: dict[int, list[tuple[tuple, int]]] = {i: [] for i in self.order}
        self.read_bytes: dict[tuple, int] = {}  # source -> bytes of its largest read
        for i in self.order:
            for s in graph.nodes[i].srcs:
                src, nbytes = self._source(s), graph.tensor(s).nbytes
                if i in self.lookups and src == ("w", TIED):
                    src = ("c", 0, TIED)  # the input copy, on the host wherever the output copy is
                self.reads[i].append((src, nbytes))
                self.read_bytes[src] = max(self.read_bytes.get(src, 0), nbytes)
        # a streamed expert tensor moves only its routed experts: weight -> share copied
        cal = profile.calibration if profile is not None else None
        routing = cal.routing if cal is not None else None
        self.copied_share: dict[str, float] = expert_shares(graph, routing)
        # weights that every reading node's accelerator supports (others must stay on the host)
        self.weights: set[str] = {n.weight for n in graph.nodes if n.weight} | {
            lf.weight for lf in graph.leafs if lf.weight}
        self.acc_ok: dict[str, bool] = {w: True for w in self.weights}
        for i in self.order:
            k = self.kind[i]
            if k[0] == "w" and acc not in graph.nodes[i].supported_on:
                self.acc_ok[k[1]] = False
        # cost coefficients (us)
        self.t_host: dict[int, float] = {}  # node index -> us on the host (weight matmuls, then other ops)
        self.t_acc: dict[int, float] = {}
        self.targets: set[int] = set()  # the weight matmuls among them
        # host matmuls whose weight can be laid out either way: node -> layout -> us; and the
        # layout a default load gives each weight matmul's weight
        self.t_layout: dict[int, dict[str, float]] = {}
        self.default_layout: dict[int, str] = {}
        self.overhead_us = 0.0  # the pass's time outside its graph
        self.detached_us = 0.0  # of it: what an attached accelerator adds when the pass runs nothing on it
        self.split_us = 0.0  # a change of device's cost beyond the issue (calibrated; `set_split_cost`)
        # the plain layout's one-op times of the host matmuls a default load repacks (us), before the
        # calibration's real-graph ones replace them (`set_plain_times`)
        self.plain_profiled: dict[int, float] = {}
        self.shape_key: dict[int, str] = {}  # weight matmul -> its shape class (graph.class_key)
        if profile is not None:
            from ..graph import target_ops

            for op in target_ops(graph):
                self.targets.add(op.index)
                self.shape_key[op.index] = class_key(op.op, op.weight_type, op.weight_shape)
                scale = {d: (cal.devices[d].scale_for(self.n_tokens) if cal is not None and d in cal.devices
                             else 1.0) for d in (HOST, acc) if d}
                # a MUL_MAT_ID at the distinct experts the recorded routing touches at this size
                act = (routing.active(op.weight_shape[2], op.n_expert_used, op.layer, op.n_tokens)
                       if routing is not None and op.op == "MUL_MAT_ID" else None)
                self.t_host[op.index] = profile.compute_us(HOST, op, active=act) * scale[HOST]
                if acc and not profile.supports(acc, op):  # refused when profiled: its weight stays on the host
                    self.acc_ok[op.weight] = False
                self.t_acc[op.index] = (profile.compute_us(acc, op, active=act) * scale[acc]
                                        if acc and profile.supports(acc, op) else self.t_host[op.index])
                self.default_layout[op.index] = profile.default_layout(op)
                if profile.has_layouts(op):  # a weight matmul, or a mixture of experts' at its routing
                    # the calibration's host scale was fitted on the default layout: applied to both
                    self.t_layout[op.index] = {lay: profile.compute_us(HOST, op, lay, active=act) * scale[HOST]
                                               for lay in HOST_LAYOUTS}
            self.plain_profiled = {i: self.t_layout[i][PLAIN] for i in self.repacked_by_default()}
            if cal is not None:
                self._other_ops(cal)
            self.h2d = profile.link(acc, "h2d")
            self.d2h = profile.link(acc, "d2h")
            # a streamed host weight's copy: the h2d link unless the calibration measured weights
            # streaming in a real load (`set_stream`), which may leave from slower memory
            self.stream = self.h2d
            self.issue = {0: profile.issue_us(HOST), 1: profile.issue_us(acc) if acc else 0.0}
            self.launch = dict(self.issue)  # us per split started on the host / the accelerator

    def _other_ops(self, cal: Calibration) -> None:
        """Every non-view node that is not a weight matmul, at its calibrated cost per device (a
        device the calibration did not see costs what the host does)."""
        host = cal.devices.get(HOST)
        acc = cal.devices.get(self.acc, host)
        if host is None or acc is None:
            return
        for i in self.order:
            if i in self.targets:
                continue
            n = self.graph.nodes[i]
            srcs = [self.graph.tensor(s) for s in n.srcs]
            cells = self.attended
            if cells is not None and self.attention is not None and n.op == "FLASH_ATTN_EXT" and len(n.srcs) > 1:
                cells = self.attention.cells(self.kv_layer(n.srcs[1]), cells)  # src1: the layer's K cache
            w = work(n.op, n.ne, n.nbytes, [t.ne for t in srcs], sum(t.nbytes for t in srcs), cells)
            self.t_host[i] = host.node_time_us(kind(n.op, n.ne), w, self.n_tokens)
            self.t_acc[i] = acc.node_time_us(kind(n.op, n.ne), w, self.n_tokens)
        self.overhead_us = cal.pass_overhead_us(self.n_tokens)
        self.detached_us = min(cal.detached_us(self.acc, self.n_tokens), self.overhead_us)

    # --- structure ----------------------------------------------------------------------------

    def _base(self, index: int) -> Node:
        t = self.graph.tensor(index)
        seen = 0
        while t.view_src is not None and seen < 64:
            t = self.graph.tensor(t.view_src)
            seen += 1
        return t

    def kv_layer(self, index: int) -> int | None:
        m = _KV_LEAF.match(self._base(index).name)
        return int(m[1]) if m else None

    def _anchors(self, kind: Mapping[int, Kind]) -> dict[int, tuple[int | None, int | None]]:
        """The nearest pass-1 nodes before / after each free node."""
        anchors: dict[int, tuple[int | None, int | None]] = {}
        prev: int | None = None
        pending: list[int] = []
        for i in self.order:
            if kind[i][0] == "free":
                pending.append(i)
                continue
            for p in pending:
                anchors[p] = (prev, i)
            pending = []
            prev = i
        for p in pending:
            anchors[p] = (prev, None)
        return anchors

    def full(self, p: Placement) -> bool:
        return p.kv_layers >= self.n_layer

    def _classify(self, n: Node, caller_pinned: bool) -> Kind:
        if caller_pinned:
            # llama.cpp pins these to their layer's device (dev_layer), which n_gpu_layers moves
            layer = node_layer(n.name)
            return ("kv", layer) if layer is not None else ("c", int(n.backend == self.acc))
        if n.pinned:
            layer = self.kv_layer(n.index)
            return ("kv", layer) if layer is not None else ("c", int(n.pinned == self.acc))
        if n.is_input or n.index in self.lookups:
            return ("c", 0)
        if n.weight and n.op not in _NOT_PINNED_BY_WEIGHT:
            offloadable = (self.op_offload and op_batch(n) > 0 and self.acc in n.supported_on
                           and self.streamable.get(n.weight, False))
            default = offloadable and n.backend == self.acc  # seen in the all-host graph
            return ("w", n.weight, offloadable, default, op_batch(n))
        return ("free", self.acc in n.supported_on)

    def _source(self, index: int) -> tuple:
        t = self.graph.tensor(index)
        while t.is_view and t.index >= 0 and t.srcs:  # views live where their data lives
            t = self.graph.tensor(t.srcs[0]) if t.view_src is None else self.graph.tensor(t.view_src)
        if t.index >= 0:
            return ("node", t.index)
        if t.weight:
            return ("w", t.weight)
        layer = self.kv_layer(t.index)
        if layer is not None:
            return ("kv", layer)
        return ("c", int(t.pinned == self.acc))

    def kv_on_acc(self, layer: int, kv_layers: int) -> bool:
        return layer >= self.n_layer - kv_layers

    # --- evaluation ---------------------------------------------------------------------------

    def assign(self, p: Placement) -> dict[int, bool]:
        """Node index -> runs on the accelerator, for every non-view node."""
        dev: dict[int, bool] = {}
        kind, anchors = self.kinds[self.full(p)], self.anchor_map[self.full(p)]
        for i in self.order:
            k = kind[i]
            if k[0] == "c":
                dev[i] = bool(k[1])
            elif k[0] == "kv":
                dev[i] = self.kv_on_acc(k[1], p.kv_layers)
            elif k[0] == "w":
                _, w, offloadable, default, batch = k
                dev[i] = w in p.on_acc or (offloadable and p.streams(w, batch, default))
        for i, (a, b) in anchors.items():
            supported = kind[i][1]
            dev[i] = bool(supported and ((a is not None and dev[a]) or (b is not None and dev[b])))
        return dev

    def source_on_acc(self, src: tuple, dev: Mapping[int, bool], p: Placement) -> bool:
        if src[0] == "node":
            return dev[src[1]]
        if src[0] == "w":
            return src[1] in p.on_acc
        if src[0] == "kv":
            return self.kv_on_acc(src[1], p.kv_layers)
        return bool(src[1])

    def host_us(self, i: int, p: Placement) -> float:
        """Node i's time on the host under p's layout for its weight (us)."""
        lays = self.t_layout.get(i)
        if lays is not None and p.layouts:
            lay = p.layout_of(self.graph.nodes[i].weight or "", op_batch(self.graph.nodes[i]))
            if lay is not None:
                return lays[lay]
        return self.t_host[i]

    def cost(self, p: Placement) -> PassCost:
        dev = self.assign(p)
        compute = other = on_acc = 0.0
        for i in self.t_host:
            t = self.t_acc[i] if dev[i] else self.host_us(i, p)
            if i in self.targets:
                compute += t
            else:
                other += t
            if dev[i]:
                on_acc += t
        copies: set[tuple[tuple, bool]] = set()
        for i in self.order:
            for src, _ in self.reads[i]:
                if self.source_on_acc(src, dev, p) != dev[i]:
                    copies.add((src, dev[i]))
        # a tensor read on the other device is copied once, sized by its largest read
        sizes = {(src, d): self.read_bytes[src] for src, d in copies}
        streamed = {src: round(b * self.copied_share.get(src[1], 1.0))
                    for (src, to_acc), b in sizes.items() if to_acc and src[0] == "w"}
        stream_us = sum(self.stream.time_us(b) for b in streamed.values())
        copy_us = stream_us + sum((self.h2d if to_acc else self.d2h).time_us(b)
                                  for (src, to_acc), b in sizes.items() if not (to_acc and src[0] == "w"))
        if self.readback is not None and dev[self.readback[0]]:  # the logits come back from the accelerator
            copy_us += self.d2h.time_us(self.readback[1])
        splits, launch, last = 0, -self.split_us, None  # the first split follows no change of device
        for i in self.order:
            if dev[i] != last:
                splits += 1
                launch += self.launch[int(dev[i])]
                last = dev[i]
        copy_bytes = sum(b for (src, to_acc), b in sizes.items() if not (to_acc and src[0] == "w"))
        # nothing on the accelerator: a runtime that loads without it (an unused rpc-server) saves its syncs
        overhead = self.overhead_us - (self.detached_us if not any(dev.values()) else 0.0)
        return PassCost(compute, copy_us, launch, splits, len(copies), copy_bytes + sum(streamed.values()), dev, other,
                        overhead, on_acc, stream_us, sum(streamed.values()), len(streamed))

    def set_split_cost(self, us: float) -> None:
        """Charge every change of device `us` beyond the issue cost of the split it starts (see
        `planner.context.split_cost`): each split pays it in `launch`, the pass's first split (no
        change before it) pays it back (`fixed_us`: all-host passes once paid one sync they never make)."""
        self.split_us = us
        self.launch = {d: t + us for d, t in self.issue.items()}

    @property
    def fixed_us(self) -> float:
        """The pass's cost that no placement changes: outside the graph, less the first split's
        change-of-device cost, which every split's launch includes."""
        return self.overhead_us - self.split_us

    def set_plain_times(self, times: Mapping[int, float]) -> None:
        """Cost the host matmuls a default load repacks at `times` (us) in plain memory (see
        `planner.context.plain_times`): the real graph ran the plain layout slower than the one-op
        profile did, by a different factor per shape."""
        for i, t in times.items():
            self.t_layout[i][PLAIN] = t

    def repacked_by_default(self) -> list[int]:
        """Host matmuls timed in plain memory whose weight a default load repacks (what
        `set_plain_times` costs)."""
        return [i for i, lays in self.t_layout.items() if self.default_layout.get(i) != PLAIN and PLAIN in lays]

    def set_stream(self, link: Link) -> None:
        """Cost streamed host weights with `link` (see `planner.context.stream_link`)."""
        self.stream = link


def weight_bytes(graph: Graph) -> dict[str, int]:
    return {lf.weight: lf.nbytes for lf in graph.leafs if lf.weight}


def kv_bytes_per_layer(graph: Graph) -> dict[int, int]:
    """KV cache bytes of each layer (all of its cache tensors, for the context's size)."""
    out: dict[int, int] = {}
    for lf in graph.leafs:
        m = _KV_LEAF.match(lf.name)
        if m:
            out[int(m[1])] = out.get(int(m[1]), 0) + lf.nbytes
    return out
