"""Weaver on the CPU (issue #18): the receiver is a cold model decoding through llama.cpp on the
CPU, and offloaded attention tasks are served at polling points inside its decode.

The GPU receiver of seed 003 answers a task from a polling kernel queued after each of its own
kernels, and operator splitting cuts its longest kernels so that a task waits behind a short
piece of one. Here the cold model's "kernels" are ggml's graph nodes, computed by the CPU
backend on one thread (the analogue of one GPU queue); patch 0008 gives a polling point after
every node and, inside a MUL_MAT, at the chunk boundaries that cut it into k pieces along its
output rows (ggml computes a matmul in chunks of rows; a poll between chunks is what a split of
the kernel into k kernels with a polling kernel between them gives). The pending check is one
acquire load of the ring's task counter (`Receiver.pending`); only a posted task calls into
Python, where :meth:`Receiver.poll` runs it.

Modes, the ablation of the seed's evaluation:

    step   tasks are served only between decode steps: a task waits behind the rest of the
           queued step (the CPU-submitted baseline)
    node   + a polling point after every graph node (GPU-driven control flow)
    split  + polling points inside the matmuls the splitting planner cuts (operator splitting)

Example (the cold model on one thread, without repacked weights: repacked matmuls have no chunk
polling points)::

    llm = oallama.Llama("cold.gguf", n_threads=1, layouts={"output.weight": "CPU"})  # all plain
    rx = Receiver(n_head=32, n_head_kv=8, head_dim=128, max_seqs=4, max_ctx=2048)
    ops = record_ops(lambda: decode_one(llm))                  # per-node times of a decode
    plan = plan_splits(receiver_ops(ops), sender_attention_time=k, offloaded_time=n,
                       iteration_time=hot_step)
    with CpuPoller(rx, "split", pieces=pieces_of(plan)) as poller:
        decode_one(llm)                                        # tasks served inside the decode
        poller.between_steps()                                 # and between steps
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _core
from ..errors import WeaverError
from .host import Receiver
from .splitting import PARAMETRIC, SEQUENCE, ReceiverOp, SplitPlan

MODES = ("step", "node", "split")


@dataclass(frozen=True)
class ColdOp:
    """One node of the cold model's decode between two polling points."""

    name: str
    op: str           # ggml_op_desc
    us: float         # median us over the recorded decodes (serving excluded)
    n_chunks: int     # MUL_MAT chunks on the polled path (0: not cut-able here)

    @property
    def splittable(self) -> bool:
        return self.n_chunks > 1


def record_ops(decode: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> list[ColdOp]:
    """Times every node of ``decode()`` (one cold-model decode step) between polling points:
    the median over ``repeats`` runs after ``warmup``. The decode must build the same graph each
    time (same node names in the same order); WeaverError otherwise."""
    if repeats < 1:
        raise ValueError("record_ops: repeats must be >= 1")
    runs: list[list[Any]] = []
    with _core.PollHook(None, None, record=True) as hook:
        for i in range(warmup + repeats):
            hook.mark()
            decode()
            nodes = hook.take_nodes()
            if i >= warmup:
                runs.append(nodes)
    names = [n.name for n in runs[0]]
    if not names:
        raise WeaverError("record_ops: the decode computed no CPU graph node (is the cold model on the CPU?)")
    for r in runs[1:]:
        if [n.name for n in r] != names:
            raise WeaverError("record_ops: the decodes built different graphs; record a steady decode step")
    return [ColdOp(n.name, n.op, statistics.median(r[i].us for r in runs), max(r[i].n_chunks for r in runs))
            for i, n in enumerate(runs[0])]


def receiver_ops(ops: Sequence[ColdOp]) -> list[ReceiverOp]:
    """The splitting planner's view: chunked matmuls split along their chunks (parametric, extent
    n_chunks: a piece is at least one chunk); every other node is one unsplittable piece."""
    return [ReceiverOp(o.name, o.us, PARAMETRIC, o.n_chunks, 0, i) if o.splittable
            else ReceiverOp(o.name, o.us, SEQUENCE, 1, 0, i) for i, o in enumerate(ops)]


def pieces_of(plan: SplitPlan) -> dict[str, int]:
    """Node name -> pieces for the nodes the plan cut (PollHook's ``pieces``). Counted per op
    (llama.cpp gives a matmul and the rope after it one name); a name two cut ops share gets the
    larger count."""
    per_op: dict[int, int] = {}
    names: dict[int, str] = {}
    for p in plan.pieces:
        per_op[p.index] = per_op.get(p.index, 0) + 1
        names[p.index] = p.name
    out: dict[str, int] = {}
    for i, k in per_op.items():
        if k > 1:
            out[names[i]] = max(k, out.get(names[i], 1))
    return out


def cut_times(ops: Sequence[ColdOp], pieces: Mapping[str, int]) -> list[float]:
    """The times between polling points when the chunked matmuls in ``pieces`` are cut into that
    many equal pieces (what PollHook does), in us: the input of splitting.expected_wait."""
    out: list[float] = []
    for o in ops:
        k = min(int(pieces.get(o.name, 1)), o.n_chunks) if o.splittable else 1
        out.extend([o.us / k] * k)
    return out


class CpuPoller:
    """The polling points of one mode around a :class:`Receiver`, installed until :meth:`close`.

    ``step`` installs nothing (call :meth:`between_steps` after each decode, as every mode does);
    ``node`` polls after every CPU graph node; ``split`` also inside the matmuls in ``pieces``
    (node name -> pieces). Process-wide: one poller with a hook at a time."""

    def __init__(self, receiver: Receiver, mode: str, *, pieces: Mapping[str, int] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"weaver cpu: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "split" and not pieces:
            raise ValueError("weaver cpu: mode 'split' needs pieces (node name -> pieces, see pieces_of)")
        if mode != "split" and pieces:
            raise ValueError(f"weaver cpu: pieces are for mode 'split', not {mode!r}")
        self.mode = mode
        self.receiver = receiver
        self.pieces = dict(pieces or {})
        self.served_between_steps = 0
        self._hook: Any = None
        if mode != "step":
            self._hook = _core.PollHook(receiver, self._serve, pieces=self.pieces, every_node=True)

    def _serve(self) -> None:
        while self.receiver.poll():
            pass

    def between_steps(self) -> int:
        """Serves every task posted so far (a decode step just ended); returns how many."""
        n = 0
        while (k := self.receiver.poll()) > 0:
            n += k
        self.served_between_steps += n
        self.check()
        return n

    def check(self) -> None:
        """Raises what a task served inside a decode raised (serving stopped then)."""
        if self._hook is not None:
            self._hook.check()

    def stats(self) -> dict[str, float]:
        """node_polls / chunk_polls (pending checks), served (serve calls inside decodes), serve_us,
        served_between_steps (tasks)."""
        s: dict[str, float] = {"node_polls": 0, "chunk_polls": 0, "served": 0, "serve_us": 0.0}
        if self._hook is not None:
            s.update(self._hook.stats())
        s["served_between_steps"] = self.served_between_steps
        return s

    def close(self) -> None:
        if self._hook is not None:
            hook, self._hook = self._hook, None
            hook.close()

    def __enter__(self) -> CpuPoller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
