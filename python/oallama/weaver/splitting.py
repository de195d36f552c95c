"""Weaver's operator-splitting planner (seed 003): shorten the receiver's kernels so that an
offloaded attention task waits for at most a short piece of one.

Model. The receiver (the cold model's GPU) runs its ops back to back and checks for offloaded
tasks between ops (the polling kernel). A task posted at a uniformly random moment lands during
op i with probability T_i / sum(T) and finds a uniform residual of it still to run. The sender
stays busy for a slack of ``K - N`` after posting (K: the sender's attention time, N: the part it
offloaded), so only residual beyond the slack makes it wait:

    W_i  = max(T_i - (K - N), 0)^2 / (2 T_i)          (expected wait if the task lands in op i)
    E[W] = sum_i T_i W_i / sum_i T_i                  (time-weighted mean over the ops)

Algorithm: keep the pieces in a priority queue by time; while E[W] >= threshold (default 5% of
the sender's iteration time) and the longest piece exceeds the slack, split the longest
splittable piece in half. Parametric ops (with a weight: MUL_MAT) split along their output
dimension (weight rows), so each half reads half of the weight; the others split along the
sequence (token) dimension. Splitting keeps sum(T): each half's time is proportional to its
extent (launch overheads are ignored, as in the paper).

All times share one unit (seconds, microseconds, ... as long as it is the same everywhere).
When N > K the sender waits N - K whatever the receiver does; the slack is then 0 and the plan
targets only the wait the receiver's ops add.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

PARAMETRIC = "parametric"  # has a weight: split along the output dimension
SEQUENCE = "sequence"      # no weight: split along the sequence (token) dimension
KINDS = (PARAMETRIC, SEQUENCE)


@dataclass(frozen=True)
class ReceiverOp:
    """One receiver kernel, or a piece of one after splitting.

    time: its run time on the receiver; size: extent of the dimension it splits along (output
    features for a parametric op, tokens otherwise); start: where this piece begins along it
    (0 for a whole op); index: position of the original op in the receiver's sequence.
    """

    name: str
    time: float
    kind: str = SEQUENCE
    size: int = 1
    start: int = 0
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"splitting: op {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if not (self.time >= 0 and math.isfinite(self.time)):
            raise ValueError(f"splitting: op {self.name!r}: time must be finite and >= 0, got {self.time}")
        if self.size < 1 or self.start < 0:
            raise ValueError(f"splitting: op {self.name!r}: size must be >= 1 and start >= 0")

    @staticmethod
    def parametric(name: str, time: float, out_features: int, index: int = 0) -> ReceiverOp:
        return ReceiverOp(name, time, PARAMETRIC, out_features, 0, index)

    @staticmethod
    def sequence(name: str, time: float, n_tokens: int, index: int = 0) -> ReceiverOp:
        return ReceiverOp(name, time, SEQUENCE, n_tokens, 0, index)

    @property
    def axis(self) -> str:
        """The dimension it splits along: "output" or "sequence"."""
        return "output" if self.kind == PARAMETRIC else "sequence"

    @property
    def stop(self) -> int:
        return self.start + self.size

    @property
    def splittable(self) -> bool:
        return self.size >= 2

    def halves(self) -> tuple[ReceiverOp, ReceiverOp]:
        """The two halves along its split dimension (the first gets the odd element); times
        proportional to extent, so they add up to this piece's time."""
        if not self.splittable:
            raise ValueError(f"splitting: op {self.name!r} has extent {self.size}, it cannot be split")
        a = (self.size + 1) // 2
        b = self.size - a
        return (replace(self, time=self.time * a / self.size, size=a),
                replace(self, time=self.time * b / self.size, size=b, start=self.start + a))


def slack(sender_attention_time: float, offloaded_time: float) -> float:
    """K - N, floored at 0 (see the module docstring)."""
    return max(sender_attention_time - offloaded_time, 0.0)


def op_wait(time: float, slack_time: float) -> float:
    """W_i = max(T_i - (K - N), 0)^2 / (2 T_i): expected wait for a task landing in this op."""
    if time <= 0:
        return 0.0
    excess = max(time - max(slack_time, 0.0), 0.0)
    return excess * excess / (2.0 * time)


def expected_wait(times: Iterable[float], slack_time: float) -> float:
    """Time-weighted mean of W_i over the ops: sum T_i W_i / sum T_i (0 for no time at all)."""
    ts = list(times)
    total = sum(ts)
    if total <= 0:
        return 0.0
    return sum(t * op_wait(t, slack_time) for t in ts) / total


@dataclass(frozen=True)
class SplitPlan:
    """The receiver's ops after splitting, in execution order (each op's pieces by start)."""

    pieces: tuple[ReceiverOp, ...]
    slack: float          # K - N (floored at 0)
    threshold: float      # stop once the expected wait is below this
    wait_before: float    # E[W] of the ops as given
    wait_after: float     # E[W] of the pieces
    splits: int           # halvings done
    reason: str           # why it stopped (see plan_splits)
    unavoidable: float = 0.0  # max(N - K, 0): the sender's wait no splitting removes
    parts: dict[str, int] = field(default_factory=dict)  # op name -> number of pieces

    @property
    def converged(self) -> bool:
        return self.wait_after < self.threshold

    def pieces_of(self, name: str) -> list[ReceiverOp]:
        return [p for p in self.pieces if p.name == name]

    def to_json(self) -> dict[str, Any]:
        return {
            "slack": self.slack, "threshold": self.threshold, "wait_before": self.wait_before,
            "wait_after": self.wait_after, "splits": self.splits, "reason": self.reason,
            "unavoidable": self.unavoidable,
            "pieces": [{"name": p.name, "index": p.index, "kind": p.kind, "axis": p.axis, "start": p.start,
                        "stop": p.stop, "time": p.time} for p in self.pieces],
        }


def plan_splits(ops: Sequence[ReceiverOp], *, sender_attention_time: float, offloaded_time: float,
                iteration_time: float | None = None, threshold: float | None = None,
                threshold_fraction: float = 0.05, max_splits: int = 4096) -> SplitPlan:
    """Splits the longest op in half while the expected wait is >= threshold and the longest op
    is longer than the slack K - N.

    threshold: absolute; default ``threshold_fraction`` (5%) of ``iteration_time`` (the sender's
    time per iteration). reason for stopping: "below threshold", "within slack" (the longest
    piece fits in the slack: nothing is left to gain), "unsplittable" (every piece longer than
    the slack has extent 1; pieces of extent 1 are skipped in favour of the next longest), or
    "max splits".
    """
    if threshold is None:
        if iteration_time is None:
            raise ValueError("splitting: give threshold or iteration_time (threshold = 5% of it by default)")
        threshold = threshold_fraction * iteration_time
    s = slack(sender_attention_time, offloaded_time)
    ops = [replace(op, index=i) for i, op in enumerate(ops)]  # execution order
    total = sum(op.time for op in ops)
    # sum_i T_i W_i = sum_i max(T_i - s, 0)^2 / 2, kept incrementally
    weighted = sum(op.time * op_wait(op.time, s) for op in ops)
    wait_before = weighted / total if total > 0 else 0.0

    order = itertools.count()
    heap: list[tuple[float, int, ReceiverOp]] = []  # splittable pieces, longest first
    fixed: list[ReceiverOp] = []                     # pieces of extent 1
    for op in ops:
        (heap.append((-op.time, next(order), op)) if op.splittable else fixed.append(op))
    heapq.heapify(heap)
    longest_fixed = max((op.time for op in fixed), default=0.0)

    splits = 0
    while True:
        wait = weighted / total if total > 0 else 0.0
        if wait < threshold:
            reason = "below threshold"
            break
        longest = max(-heap[0][0] if heap else 0.0, longest_fixed)
        if longest <= s:
            reason = "within slack"
            break
        if not heap or -heap[0][0] <= s:
            reason = "unsplittable"
            break
        if splits >= max_splits:
            reason = "max splits"
            break
        _, _, op = heapq.heappop(heap)
        a, b = op.halves()
        weighted += a.time * op_wait(a.time, s) + b.time * op_wait(b.time, s) - op.time * op_wait(op.time, s)
        for half in (a, b):
            if half.splittable:
                heapq.heappush(heap, (-half.time, next(order), half))
            else:
                fixed.append(half)
                longest_fixed = max(longest_fixed, half.time)
        splits += 1

    pieces = sorted([p for _, _, p in heap] + fixed, key=lambda p: (p.index, p.start))
    parts: dict[str, int] = {}
    for p in pieces:
        parts[p.name] = parts.get(p.name, 0) + 1
    return SplitPlan(tuple(pieces), s, float(threshold), wait_before, expected_wait((p.time for p in pieces), s),
                     splits, reason, max(offloaded_time - sender_attention_time, 0.0), parts)


def ops_from_target_ops(target_ops: Iterable[Any], times: Sequence[float]) -> list[ReceiverOp]:
    """Receiver ops from oallama.planner.graph TargetOps (weight-bearing MUL_MATs: parametric, split
    along the weight's rows = output features) and their measured times on the receiver."""
    out = []
    for i, (op, t) in enumerate(zip(target_ops, times, strict=True)):
        rows = int(op.weight_shape[1]) if len(op.weight_shape) > 1 else 1
        out.append(ReceiverOp(op.node, float(t), PARAMETRIC, rows, 0, i))
    return out
