"""Inspect: the operator parser. Reads the compute graph llama.cpp itself builds for a model
and classifies its target ops: MUL_MAT / MUL_MAT_ID whose weight operand is a model weight.

Nothing is hand-coded per architecture: the graph comes from llama.cpp (a metadata-only load,
so a 32B model is inspected without reading its weights), and a node is a target op when its
src0 is one of the model's own tensors. The same graph carries ggml's scheduling of every node
(which device runs it), which the planner uses to cost CPU<->accelerator boundaries.

    >>> inv = inventory("model.gguf", n_tokens=(1, 512))
    >>> [op.weight for op in inv.target_ops(1)][:3]
    ['blk.0.attn_q.weight', 'blk.0.attn_k.weight', 'blk.0.attn_v.weight']
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import ModelFileError, PlanError
from ..model import gguf_file
from ..options import add_arguments, from_args, option

TARGET_OPS = ("MUL_MAT", "MUL_MAT_ID")
_LAYER = re.compile(r"^blk\.(\d+)\.")
_NODE_LAYER = re.compile(r"-(\d+)$")  # llama.cpp names per-layer nodes "<name>-<il>"


def layer_of(name: str) -> int | None:
    """The layer of a weight ("blk.<il>.<name>")."""
    m = _LAYER.match(name)
    return int(m[1]) if m else None


def node_layer(name: str) -> int | None:
    """The layer of a graph node ("<name>-<il>")."""
    m = _NODE_LAYER.search(name)
    return int(m[1]) if m else None


@dataclass(frozen=True)
class Node:
    """One tensor of a graph: a computed node (index >= 0) or a leaf (index < 0)."""

    index: int
    name: str
    op: str
    type: str
    ne: tuple[int, int, int, int]
    nbytes: int  # bytes
    srcs: tuple[int, ...]
    view_src: int | None  # tensor whose memory this one views
    weight: str  # model weight among srcs ("" if none)
    weight_slot: int
    backend: str  # device the scheduler runs it on ("" for leaves)
    pinned: str  # device of the buffer it already lives in ("" if none)
    host_buffer: bool  # that buffer is plain host memory (a repacked CPU weight is not)
    supported_on: tuple[str, ...]
    caller_pinned: bool  # llama.cpp pinned it to `backend` while building the graph
    is_view: bool
    is_input: bool
    is_output: bool

    @staticmethod
    def from_native(index: int, t: _core.GraphTensor) -> Node:
        """A copy of _core's read-only graph tensor (every field but `index` named as in oallama.h)."""
        return Node(index, *(getattr(t, name) for name in _NATIVE_FIELDS))


_NATIVE_FIELDS = tuple(f.name for f in fields(Node))[1:]  # all but index


class Graph:
    """The graph of one ubatch of `n_tokens`, with the scheduler's device for each node."""

    def __init__(self, n_tokens: int, raw: _core.Graph) -> None:
        self.n_tokens = n_tokens
        self.backends: list[str] = list(raw.backends)  # by scheduler priority, CPU last
        self.nodes = [Node.from_native(i, t) for i, t in enumerate(raw.nodes)]
        self.leafs = [Node.from_native(-1 - j, t) for j, t in enumerate(raw.leafs)]
        self.n_splits: int = raw.n_splits
        self.consumers: dict[int, list[int]] = defaultdict(list)  # tensor index -> reading node indices
        for n in self.nodes:
            for s in n.srcs:
                self.consumers[s].append(n.index)

    def tensor(self, index: int) -> Node:
        return self.nodes[index] if index >= 0 else self.leafs[-1 - index]

    def producer(self, index: int) -> int:
        """Follow views back to the tensor that holds the data (a compute node or a leaf)."""
        t = self.tensor(index)
        while t.is_view and t.srcs:
            t = self.tensor(t.srcs[0])
        return t.index

    def readers(self, index: int) -> list[int]:
        """Compute nodes reading `index`'s data, directly or through views."""
        out: list[int] = []
        for c in self.consumers.get(index, []):
            out.extend(self.readers(c) if self.nodes[c].is_view else [c])
        return out

    def is_target(self, node: Node) -> bool:
        return node.op in TARGET_OPS and node.weight_slot == 0


@dataclass(frozen=True)
class TargetOp:
    """A weight-bearing matrix multiplication of the graph."""

    index: int  # position in the graph (node index)
    node: str  # ggml node name, e.g. "ffn_up-3"
    op: str  # MUL_MAT | MUL_MAT_ID
    weight: str
    weight_type: str
    weight_shape: tuple[int, ...]  # ggml ne: (row length, rows[, experts]); 3-D for MUL_MAT_ID
    weight_bytes: int  # bytes
    layer: int | None
    n_tokens: int  # activation columns the op multiplies (1 at decode)
    flops: int  # 2 * row length * rows * columns (* experts used for MUL_MAT_ID)
    act_in_bytes: int  # bytes of the activation operand
    act_out_bytes: int  # bytes of the result
    producers: tuple[int, ...]  # compute nodes whose data it reads (through views)
    consumers: tuple[int, ...]  # compute nodes reading its result (through views)
    n_expert_used: int = 0  # MUL_MAT_ID: experts each token is routed to (ne[0] of the ids); 0 for MUL_MAT

    @property
    def signature(self) -> tuple[str, str, tuple[int, ...], int]:
        """What the op's cost depends on: (op, weight type, weight shape, columns)."""
        return (self.op, self.weight_type, self.weight_shape, self.n_tokens)


def _trim(ne: Iterable[int]) -> tuple[int, ...]:
    dims = list(ne)
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


def class_key(op: str, weight_type: str, shape: Sequence[int]) -> str:
    """A weight matmul's shape class: op, weight type, weight shape (trailing 1s trimmed)."""
    return f"{op}:{weight_type}:{'x'.join(map(str, _trim(shape)))}"


def target_ops(graph: Graph) -> list[TargetOp]:
    out = []
    for n in graph.nodes:
        if not graph.is_target(n):
            continue
        w = graph.tensor(n.srcs[0])
        act = graph.tensor(n.srcs[1])
        n_used = 0
        if n.op == "MUL_MAT":
            cols = act.ne[1] * act.ne[2] * act.ne[3]
            flops = 2 * w.ne[0] * w.ne[1] * cols
        else:  # MUL_MAT_ID: weight [k, m, n_expert], act [k, 1 or n_expert_used, n_tokens], ids
            # [n_expert_used, n_tokens] (i32), result [m, n_expert_used, n_tokens]: each token meets
            # n_expert_used experts
            cols = n.ne[2]
            n_used = graph.tensor(n.srcs[2]).ne[0]
            flops = 2 * w.ne[0] * w.ne[1] * n_used * cols
        producers = tuple(sorted({graph.producer(s) for s in n.srcs[1:] if graph.producer(s) >= 0}))
        out.append(TargetOp(n.index, n.name, n.op, n.weight, w.type, _trim(w.ne), w.nbytes, layer_of(n.weight),
                            cols, flops, act.nbytes, n.nbytes, producers, tuple(sorted(set(graph.readers(n.index)))),
                            n_used))
    return out


class GraphSession:
    """A metadata-only load of a model (weights are never read) and a context, for graphs.
    flash_attn: on/off (a bool) or llama.cpp's "auto"; type_k / type_v: the KV cache's types;
    swa_full: a sliding-window layer's cache holds the whole context (llama-cpp-python's default);
    n_seq_max / kv_unified: parallel sequences, each with a KV stream of n_ctx / n_seq_max cells
    unless kv_unified.

    devices / overrides place weights exactly as a real load would (overrides: (regex, device)),
    so the scheduler's assignment in `graph()` is the one a real run would get.
    """

    def __init__(self, path: str | Path, *, devices: Sequence[str] | None = None,
                 overrides: Sequence[tuple[str, str]] = (), n_ctx: int = 4096, n_ubatch: int = 512,
                 n_threads: int = 4, flash_attn: bool | str = False, op_offload: bool = True,
                 offload_policy: dict[str, int] | None = None, n_gpu_layers: int = 0, type_k: str = "f16",
                 type_v: str = "f16", swa_full: bool = True, n_seq_max: int = 1, kv_unified: bool = False) -> None:
        from ..runtime import devices as devmod
        from ..runtime import kvcache

        self.model = gguf_file.check_model(path)
        if devices is not None:  # names RPC endpoints register here; unknown names raise
            devices = [devmod.resolve(d).name for d in devices]
        try:
            self._s = _core.Session(str(path), list(devices) if devices is not None else None,
                                    list(overrides), n_gpu_layers, n_ctx, max(n_ubatch, 1), n_ubatch, n_threads,
                                    kvcache.flash_attn_code(flash_attn) if isinstance(flash_attn, str) else int(flash_attn),
                                    op_offload, False, type_k, type_v, swa_full, n_seq_max, kv_unified)
        except RuntimeError as e:
            raise ModelFileError(str(e)) from None
        if offload_policy:
            try:
                _core.set_offload_policy(self._s.context(), offload_policy)
            except RuntimeError as e:
                self._s.close()
                raise PlanError(str(e)) from None

    def graph(self, n_tokens: int, n_outputs: int = 1, n_seqs: int = 1) -> Graph:
        """The graph of a ubatch of n_tokens (n_seqs sequences of n_tokens / n_seqs tokens each)
        with n_outputs rows of logits."""
        try:
            return Graph(n_tokens, _core.graph(self._s.context(), n_tokens, n_outputs, n_seqs))
        except RuntimeError as e:
            raise PlanError(f"{self.model.path}: {e}") from None

    def memory(self) -> list[_core.MemoryUse]:
        """llama.cpp's memory breakdown per buffer type: model / context (KV) / compute bytes."""
        return list(_core.memory(self._s.context()))

    def model_tensors(self) -> list[_core.TensorInfo]:
        """Every weight of the (metadata-only) model and the device its buffer type belongs to."""
        return list(_core.model_tensors(self._s.model()))

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> GraphSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Inventory:
    """Target ops of a model at each token count that occurs (decode = 1, prefill = n)."""

    model: gguf_file.GGUFInfo
    graphs: dict[int, Graph]

    def target_ops(self, n_tokens: int) -> list[TargetOp]:
        return target_ops(self.graphs[n_tokens])

    def layers(self, n_tokens: int) -> dict[int | None, list[TargetOp]]:
        out: dict[int | None, list[TargetOp]] = defaultdict(list)
        for op in self.target_ops(n_tokens):
            out[op.layer].append(op)
        return dict(out)


@dataclass(frozen=True)
class AttentionLayers:
    """A model's attention layers: `order`, the layers with a KV cache in graph order (the k-th
    attention node of a pass is layer order[k]'s), and `window`, layer -> the cells a token of a
    sliding-window layer attends to at most (absent: every cell before it)."""

    order: tuple[int, ...]
    window: dict[int, int]

    def cells(self, layer: int | None, attended: float) -> float:
        """The cells a token of `layer` attends to when it could attend to `attended` (mean)."""
        w = self.window.get(layer) if layer is not None else None
        return min(attended, float(w)) if w else attended


_CACHE_K = re.compile(r"^cache_k_l(\d+)$")


def attention_layers(path: str | Path) -> AttentionLayers:
    """Which layers attend over a sliding window (GGUF `<arch>.attention.sliding_window`), read
    from llama.cpp itself: in a metadata-only load whose window layers keep only their window's
    cells (swa_full off), their K cache is smaller than the context; the pattern of window layers
    (every sixth global in Gemma 3, every other in gpt-oss) is llama.cpp's, not the file's."""
    model = gguf_file.check_model(path)
    window = int(model.hparam("attention.sliding_window", 0) or 0)
    probe = max(4 * window, 4096)  # tokens: a context well beyond the window
    with GraphSession(path, n_ctx=probe, n_ubatch=1, swa_full=window <= 0) as s:
        g = s.graph(1)
    cells = {int(m[1]): lf.ne[1] for lf in g.leafs if (m := _CACHE_K.match(lf.name))}
    return AttentionLayers(tuple(sorted(cells)), {il: window for il, n in cells.items() if window > 0 and n < probe})


def inventory(path: str | Path, n_tokens: Sequence[int] = (1, 512), *, n_ctx: int = 4096,
              accelerators: Sequence[str] = (), outputs: Mapping[int, int] | None = None,
              **session_kw: Any) -> Inventory:
    """Build the graphs at each token count and classify their target ops. By default the
    model is placed on the CPU alone; the op inventory does not depend on placement. outputs:
    token count -> rows of logits its graph computes (default 1: a decode pass of several
    sequences computes one each, so its output matmul has that many columns)."""
    n_ubatch = max(n_tokens)
    outs = outputs or {}
    with GraphSession(path, devices=list(accelerators), n_ctx=max(n_ctx, n_ubatch), n_ubatch=n_ubatch,
                      n_seq_max=max([1, *outs.values()]), kv_unified=True, **session_kw) as s:
        return Inventory(s.model, {n: s.graph(n, outs.get(n, 1)) for n in n_tokens})


# --- CLI ------------------------------------------------------------------------------------


def summary_table(inv: Inventory, n_small: int, n_large: int) -> str:
    small, large = inv.layers(n_small), inv.layers(n_large)
    lines = [f"{'layer':>6} {'ops':>4} {'weights MiB':>12} {'GFLOP@' + str(n_small):>12} "
             f"{'GFLOP@' + str(n_large):>12} {'act in KiB@' + str(n_large):>14}  weights"]
    total = [0, 0, 0.0, 0.0]
    for layer in sorted(small, key=lambda k: -1 if k is None else k):
        ops_s, ops_l = small[layer], large.get(layer, [])
        mib = sum(o.weight_bytes for o in ops_s) / 2**20
        gs, gl = sum(o.flops for o in ops_s) / 1e9, sum(o.flops for o in ops_l) / 1e9
        act = sum(o.act_in_bytes for o in ops_l) / 1024
        kinds = " ".join(sorted({o.weight.split(".")[-2] if layer is not None else o.weight for o in ops_s}))
        lines.append(f"{'-' if layer is None else layer:>6} {len(ops_s):>4} {mib:>12.1f} {gs:>12.3f} {gl:>12.2f} "
                     f"{act:>14.1f}  {kinds}")
        total[0] += len(ops_s)
        total[1] += mib
        total[2] += gs
        total[3] += gl
    lines.append(f"{'total':>6} {total[0]:>4} {total[1]:>12.1f} {total[2]:>12.3f} {total[3]:>12.2f}")
    return "\n".join(lines)


@dataclass
class InspectOptions:
    """Everything `oallama inspect` takes (its flags are generated from these fields)."""

    model: Path = option(positional=True, help="GGUF model file")
    tokens: list[int] = option([1, 512], help="token counts to build graphs for")
    ctx: int = option(4096, help="context length the graphs assume")
    json: Path | None = option(None, help="also write every target op to this JSON file")


def _cmd_inspect(args: argparse.Namespace) -> int:
    o = from_args(InspectOptions, args)
    sizes = sorted(set(o.tokens))
    inv = inventory(o.model, sizes, n_ctx=o.ctx)
    g = inv.graphs[sizes[0]]
    print(f"{inv.model.path.name}: {inv.model.architecture}, {len(inv.model.tensors)} tensors, "
          f"{inv.model.weight_bytes / 2**30:.2f} GiB of weights; graph at {sizes[0]} token(s): "
          f"{len(g.nodes)} nodes, {len(inv.target_ops(sizes[0]))} target ops")
    print(summary_table(inv, sizes[0], sizes[-1]))
    if o.json:
        doc = {"model": str(inv.model.path), "identity": inv.model.identity(),
               "target_ops": {n: [asdict(op) for op in inv.target_ops(n)] for n in sizes}}
        o.json.write_text(json.dumps(doc, indent=1))
        print(f"wrote {o.json}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="list the weight-bearing ops of the graph llama.cpp builds for a model")
    add_arguments(p, InspectOptions)
    p.set_defaults(func=_cmd_inspect)
