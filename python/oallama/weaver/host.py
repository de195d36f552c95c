"""Weaver: a busy ("hot") model offloads the decode attention of some sequences to the GPU of a
"cold" model, without waiting behind the cold model's queued kernels (seed 003, issue #5).

The protocol (csrc/weaver/weaver_layout.h) is a ring of task slots in shared memory plus a task
counter and a completion counter:

* a **sender** claims a ticket, writes the new token's Q/K/V into the ticket's slot, publishes
  the slot (store-release of its sequence word) and bumps the task counter (release);
* the **receiver** holds the KV cache of the offloaded sequences. A bounded poll checks the task
  counter (acquire), takes at most ``max_tasks`` contiguous published slots, appends each task's
  K/V at its position, runs decode attention over positions ``[0, pos]`` (GQA, f32 accumulation),
  writes the output and status, marks the slot DONE and bumps the completion counter (release);
* the sender waits for the completion counter (acquire), checks its slot is DONE for its ticket,
  copies the output and frees the slot.

Two implementations share the layout:

* :class:`Receiver` / :class:`Sender`: the CPU reference. The ring lives in POSIX shared memory
  named by the receiver (``receiver.name``); a sender in any thread or process attaches by name.
  C++ (``oallama._weaver``) owns the ring, the counters and the memory ordering; numpy computes the
  attention over the KV cache the receiver holds.
* ``CudaReceiver`` / ``CudaSender`` in :mod:`oallama.weaver.cuda`: the GPU receiver
  (``oallama._weaver_cuda``, built with ``OALLAMA_KERNELS=ON``): the polling kernel is enqueued
  after each of the cold model's kernels; the ring is device memory exported with CUDA IPC, or this same POSIX shared memory
  mapped into the device (then a CPU :class:`Sender` can post to a GPU receiver).

Storage dtype (``"f16"``, ``"bf16"`` or ``"f32"``) is chosen by the receiver: Q/K/V travel in it
and the KV cache is kept in it; outputs are always f32 ``[n_head, head_dim]``. bf16 values cross
the Python boundary as their uint16 bit patterns; :func:`to_storage` converts f32 input
(round-to-nearest-even).

Example (q [8, 64], k and v [2, 64])::

    rx = Receiver(n_head=8, n_head_kv=2, head_dim=64, max_seqs=4, max_ctx=256)
    tx = Sender(rx.name)                     # in this process or another one
    t = tx.post(seq_id=0, pos=0, q=q, k=k, v=v)
    rx.poll()                                # bounded: at most max_tasks tasks, then returns (1)
    out = tx.wait(t)                         # f32 [8, 64]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import WeaverError, WeaverTaskError, WeaverTimeoutError

DTYPES: dict[str, int] = {"f32": 0, "f16": 1, "bf16": 2}
STATUS_NAMES: dict[int, str] = {0: "ok", 1: "bad sequence id", 2: "bad position", 3: "corrupt payload",
                                4: "receiver failed"}
OK, BAD_SEQ, BAD_POS, CORRUPT, FAILED = 0, 1, 2, 3, 4

_WAIT_SLICE_S = 0.1  # native waits run in slices this long, so Ctrl-C and timeouts stay responsive


def _native() -> Any:
    from .. import _weaver

    return _weaver


# ---- dtypes ------------------------------------------------------------------------------------

def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 values -> bfloat16 bit patterns (uint16), rounding to nearest even (NaN kept NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(f)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> f32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def storage_numpy_dtype(dtype: str) -> np.dtype:
    """numpy dtype that holds a storage dtype: float32, float16, or uint16 (bf16 bits)."""
    return np.dtype({"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[_check_dtype(dtype)])


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values -> a C-contiguous array of storage dtype ``dtype``. For bf16, a uint16 array is taken
    as bit patterns already; any float array is rounded."""
    dtype = _check_dtype(dtype)
    a = np.asarray(x)
    if dtype == "bf16":
        if a.dtype == np.uint16:
            return np.ascontiguousarray(a)
        return bf16_bits(a.astype(np.float32, copy=False))
    if a.dtype == np.uint16:
        raise TypeError(f"uint16 input is only taken as bf16 bits; this ring stores {dtype}")
    return np.ascontiguousarray(a, dtype=storage_numpy_dtype(dtype))


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Storage-dtype array -> f32 values."""
    if _check_dtype(dtype) == "bf16":
        return bf16_to_f32(x)
    return np.asarray(x).astype(np.float32, copy=False)


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"weaver: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype


# ---- attention (numpy) ---------------------------------------------------------------------------

def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Decode attention of one new token over its sequence's context, f32 throughout.

    q: [n_head, head_dim]; k, v: [n_ctx, n_head_kv, head_dim] (positions 0..n_ctx-1, the new
    token's K/V included); GQA: query head h uses KV head h // (n_head // n_head_kv).
    Returns [n_head, head_dim] f32: softmax(q k^T * scale) v per head.
    """
    n_head, hd = q.shape
    n_kv = k.shape[1]
    g = n_head // n_kv
    qg = q.astype(np.float32, copy=False).reshape(n_kv, g, hd)                  # [n_kv, g, hd]
    kt = k.astype(np.float32, copy=False).transpose(1, 2, 0)                     # [n_kv, hd, n_ctx]
    s = np.matmul(qg, kt) * np.float32(scale)                                    # [n_kv, g, n_ctx]
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, dtype=np.float32)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, v.astype(np.float32, copy=False).transpose(1, 0, 2))        # [n_kv, g, hd]
    return o.reshape(n_head, hd).astype(np.float32, copy=False)


# ---- configuration -------------------------------------------------------------------------------

@dataclass(frozen=True)
class WeaverConfig:
    """Shape of a ring, as its receiver created it."""

    n_head: int
    n_head_kv: int
    head_dim: int
    dtype: str  # storage dtype of Q/K/V and the KV cache
    max_seqs: int
    max_ctx: int
    capacity: int  # ring slots
    scale: float  # softmax scale
    checksum: bool  # senders checksum payloads, the receiver verifies
    slot_bytes: int
    total_bytes: int

    @staticmethod
    def from_dict(d: dict[str, Any]) -> WeaverConfig:
        return WeaverConfig(**{f: d[f] for f in WeaverConfig.__dataclass_fields__})

    @property
    def q_shape(self) -> tuple[int, int]:
        return (self.n_head, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int]:
        return (self.n_head_kv, self.head_dim)


@dataclass(frozen=True)
class TaskRecord:
    """What a recording receiver saw of one task (Receiver(record=True).history)."""

    ticket: int
    tag: int
    seq_id: int
    pos: int
    status: int


# ---- CPU reference: receiver --------------------------------------------------------------------

class Receiver:
    """CPU reference receiver: creates the ring (POSIX shared memory) and holds the KV cache of the
    offloaded sequences as numpy arrays in the storage dtype, [max_seqs, max_ctx, n_head_kv,
    head_dim]. Single consumer: call :meth:`poll` (or :meth:`serve`) from one thread at a time.

    A task at position ``pos`` of sequence ``seq_id`` writes its K/V at ``pos`` and attends over
    ``[0, pos]``; ``pos`` may not skip ahead of the sequence's length (``pos <= len``; ``pos <
    len`` rewinds, as a rejected speculative token would). Position 0 starts a sequence afresh.
    """

    def __init__(self, *, n_head: int, n_head_kv: int, head_dim: int, max_seqs: int, max_ctx: int,
                 dtype: str = "f16", capacity: int = 64, max_tasks: int = 8, scale: float | None = None,
                 checksum: bool = True, name: str | None = None, record: bool = False) -> None:
        native = _native()
        self._ring = _call(native.Ring.create, n_head, n_head_kv, head_dim, DTYPES[_check_dtype(dtype)],
                           max_seqs, max_ctx, capacity, float(scale or 0.0), checksum, name or "")
        self.config = WeaverConfig.from_dict(self._ring.config())
        self.name: str = self._ring.name
        self.max_tasks = int(max_tasks)
        if self.max_tasks < 1:
            raise ValueError("weaver: max_tasks must be >= 1")
        c = self.config
        sdt = storage_numpy_dtype(c.dtype)
        self._k = np.zeros((c.max_seqs, c.max_ctx, c.n_head_kv, c.head_dim), dtype=sdt)
        self._v = np.zeros_like(self._k)
        self._len = np.zeros(c.max_seqs, dtype=np.int64)
        m = self.max_tasks
        self._b_tickets = np.zeros(m, np.uint64)
        self._b_tags = np.zeros(m, np.uint64)
        self._b_seq = np.zeros(m, np.int32)
        self._b_pos = np.zeros(m, np.int32)
        self._b_status = np.zeros(m, np.uint32)
        self._b_q = np.zeros((m, c.n_head, c.head_dim), sdt)
        self._b_k = np.zeros((m, c.n_head_kv, c.head_dim), sdt)
        self._b_v = np.zeros((m, c.n_head_kv, c.head_dim), sdt)
        self.history: list[TaskRecord] | None = [] if record else None

    # -- KV cache
    def load_kv(self, seq_id: int, k: np.ndarray, v: np.ndarray) -> None:
        """Sets sequence ``seq_id``'s context (a prefill done elsewhere): k, v [n_ctx, n_head_kv,
        head_dim]; the next task continues at position n_ctx."""
        c = self.config
        self._check_seq(seq_id)
        k = to_storage(k, c.dtype)
        v = to_storage(v, c.dtype)
        if k.shape != v.shape or k.ndim != 3 or k.shape[1:] != c.kv_shape or k.shape[0] > c.max_ctx:
            raise ValueError(f"weaver: k, v must be [n_ctx <= {c.max_ctx}, {c.n_head_kv}, {c.head_dim}], "
                             f"got {k.shape} and {v.shape}")
        n = k.shape[0]
        self._k[seq_id, :n] = k
        self._v[seq_id, :n] = v
        self._len[seq_id] = n

    def kv(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequence ``seq_id``'s KV cache as f32 copies, [n_ctx, n_head_kv, head_dim] each."""
        self._check_seq(seq_id)
        n = int(self._len[seq_id])
        c = self.config
        return from_storage(self._k[seq_id, :n], c.dtype).copy(), from_storage(self._v[seq_id, :n], c.dtype).copy()

    def seq_len(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(self._len[seq_id])

    def reset(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        self._len[seq_id] = 0

    def _check_seq(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.config.max_seqs:
            raise WeaverTaskError(f"weaver: seq_id {seq_id} outside [0, {self.config.max_seqs})")

    # -- polling
    def poll(self, max_tasks: int | None = None) -> int:
        """One bounded poll: if the task counter shows nothing new, returns 0 at once; otherwise
        runs at most ``max_tasks`` (default: the receiver's) contiguous published tasks, completes
        them, and returns how many. Never blocks."""
        m = self.max_tasks if max_tasks is None else min(int(max_tasks), self.max_tasks)
        if m < 1:
            return 0
        n = int(self._ring.take(m, self._b_tickets[:m], self._b_tags[:m], self._b_seq[:m], self._b_pos[:m],
                                self._b_status[:m], self._b_q[:m], self._b_k[:m], self._b_v[:m]))
        if n == 0:
            return 0
        c = self.config
        status = self._b_status[:n].copy()
        out = np.zeros((n, c.n_head, c.head_dim), np.float32)
        n_ctx = np.zeros(n, np.uint32)
        done = 0
        try:
            for i in range(n):
                if status[i] == OK:
                    s, p = int(self._b_seq[i]), int(self._b_pos[i])
                    if p > self._len[s]:
                        status[i] = BAD_POS  # would attend over positions nobody wrote
                    else:
                        self._k[s, p] = self._b_k[i]
                        self._v[s, p] = self._b_v[i]
                        self._len[s] = p + 1
                        out[i] = decode_attention(from_storage(self._b_q[i], c.dtype),
                                                  from_storage(self._k[s, : p + 1], c.dtype),
                                                  from_storage(self._v[s, : p + 1], c.dtype), c.scale)
                        n_ctx[i] = p + 1
                done = i + 1
        finally:
            # a failure part-way still completes every taken task, so no sender hangs
            status[done:][status[done:] == OK] = FAILED
            self._ring.complete(n, out, status, n_ctx)
            if self.history is not None:
                self.history.extend(TaskRecord(int(self._b_tickets[i]), int(self._b_tags[i]), int(self._b_seq[i]),
                                               int(self._b_pos[i]), int(status[i])) for i in range(n))
        return n

    def pending(self) -> bool:
        """Is a task posted and not taken yet? One acquire load, nothing else (the polling check)."""
        return bool(self._ring.pending())

    def poll_source(self) -> Any:
        """This ring's pending check as oallama._core.PollHook takes it (see oallama.weaver.cpu)."""
        return self._ring.poll_source()

    def wait_tasks(self, timeout: float) -> bool:
        """Blocks (GIL released) until the task counter shows a task not taken yet, or timeout."""
        return bool(self._ring.wait_tasks(float(timeout)))

    def serve(self, stop: threading.Event | None = None, *, until: int | None = None, timeout: float | None = None,
              idle_wait: float = 0.01, on_poll: Callable[[int], None] | None = None) -> int:
        """Polls until ``stop`` is set, ``until`` tasks were served, or ``timeout`` seconds passed;
        between empty polls it waits on the task counter for at most ``idle_wait`` seconds.
        Returns the number of tasks served."""
        served = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (stop is not None and stop.is_set()) and (until is None or served < until):
            if deadline is not None and time.monotonic() >= deadline:
                break
            n = self.poll()
            served += n
            if on_poll is not None:
                on_poll(n)
            if n == 0:
                self.wait_tasks(idle_wait)
        return served

    # -- state
    def counters(self) -> dict[str, int]:
        """The shared words: claim, tasks (task counter), head, completed (completion counter)."""
        return dict(self._ring.counters())

    def stats(self) -> dict[str, int]:
        """polls, empty_polls, taken, completed, corrupt (checksum or torn-read detections)."""
        return dict(self._ring.stats())

    def close(self) -> None:
        """Marks the ring closed (waiting senders get WeaverError) and unlinks its name."""
        self._ring.close()

    @property
    def closed(self) -> bool:
        return bool(self._ring.closed)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- CPU reference: sender ----------------------------------------------------------------------

class Sender:
    """Attaches to a receiver's ring by name (any thread or process) and posts tasks. Thread-safe:
    several threads may post and wait on one Sender.

    Flow control: a completed task keeps its slot until its sender collects the output, so a
    ring full of completed, uncollected tasks would stall every sender blocked in :meth:`post`.
    A post that finds the ring full therefore first collects this sender's completed tasks (their
    outputs wait in memory for :meth:`wait`); with every sender doing so, a full ring always
    drains.
    """

    def __init__(self, name: str, *, attach_timeout: float = 5.0) -> None:
        self._ring = _call(_native().Ring.attach, name, float(attach_timeout))
        self.name = name
        self.config = WeaverConfig.from_dict(self._ring.config())
        self._pending: set[int] = set()                         # posted, not collected from the ring
        self._stash: dict[int, tuple[np.ndarray, int]] = {}     # collected, not returned by wait()
        self._lock = threading.Lock()                           # serialises collection

    def _payload(self, seq_id: int, pos: int, q: np.ndarray, k: np.ndarray,
                 v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.config
        if not 0 <= seq_id < c.max_seqs:
            raise WeaverTaskError(f"weaver: seq_id {seq_id} outside [0, {c.max_seqs})")
        if not 0 <= pos < c.max_ctx:
            raise WeaverTaskError(f"weaver: position {pos} outside [0, {c.max_ctx})")
        arrays = []
        for name, x, shape in (("q", q, c.q_shape), ("k", k, c.kv_shape), ("v", v, c.kv_shape)):
            a = to_storage(x, c.dtype)
            if a.size != shape[0] * shape[1]:
                raise WeaverTaskError(f"weaver: {name} must be {list(shape)} ({shape[0] * shape[1]} values), "
                                      f"got shape {list(np.shape(x))}")
            arrays.append(a)
        return arrays[0], arrays[1], arrays[2]

    def _collect(self, ticket: int) -> None:
        """Copies a completed ticket's output out of the ring and frees its slot (lock held)."""
        c = self.config
        out = np.empty((c.n_head, c.head_dim), np.float32)
        result, status = _call(self._ring.wait, int(ticket), out, 0.0)
        if result != "done":  # the completion counter passed it: cannot happen
            raise WeaverError(f"weaver: ticket {ticket} completed but could not be collected ({result})")
        self._pending.discard(ticket)
        self._stash[ticket] = (out, int(status))

    def _collect_completed(self) -> int:
        with self._lock:
            done = [t for t in self._pending if self._ring.done(t)]
            for t in done:
                self._collect(t)
        return len(done)

    def post(self, seq_id: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, tag: int = 0,
             timeout: float = 10.0) -> int:
        """Posts the new token of sequence ``seq_id`` at position ``pos``: q [n_head, head_dim], k and
        v [n_head_kv, head_dim] (f32/f16 values, or bf16 bits as uint16). Blocks while the ring is
        full, at most ``timeout`` s (then WeaverTimeoutError). Returns the ticket for :meth:`wait`."""
        qs, ks, vs = self._payload(seq_id, pos, q, k, v)
        deadline = time.monotonic() + timeout
        args = (int(seq_id), int(pos), qs, ks, vs, int(tag))
        ticket = _call(self._ring.post, *args, 0.0)
        while ticket is None:
            if self._collect_completed():
                ticket = _call(self._ring.post, *args, 0.0)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WeaverTimeoutError(f"weaver: ring '{self.name}' stayed full for {timeout:g} s "
                                         f"(is the receiver polling?)")
            ticket = _call(self._ring.post, *args, min(remaining, 0.005))
        with self._lock:
            self._pending.add(int(ticket))
        return int(ticket)

    def wait(self, ticket: int, *, timeout: float = 10.0) -> np.ndarray:
        """Waits for ``ticket`` (acquire on the completion counter) and returns its output, f32
        [n_head, head_dim]. WeaverTimeoutError leaves the ticket pending (wait again);
        WeaverTaskError when the receiver refused or failed the task."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if ticket in self._stash:
                    out, status = self._stash.pop(ticket)
                    break
                if ticket not in self._pending:
                    raise WeaverError(f"weaver: ticket {ticket} was not posted by this sender, or was collected")
                if self._ring.done(ticket):
                    self._collect(ticket)
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WeaverTimeoutError(f"weaver: ticket {ticket} not completed within {timeout:g} s")
            if _call(self._ring.wait_done, int(ticket), min(remaining, _WAIT_SLICE_S)) == "closed":
                raise WeaverError(f"weaver: the receiver closed ring '{self.name}' before ticket {ticket} completed")
        if status != OK:
            raise WeaverTaskError(f"weaver: ticket {ticket}: {STATUS_NAMES.get(status, status)}")
        return out

    def attention(self, seq_id: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                  timeout: float = 10.0) -> np.ndarray:
        """post + wait."""
        return self.wait(self.post(seq_id, pos, q, k, v, timeout=timeout), timeout=timeout)

    def done(self, ticket: int) -> bool:
        """Has the receiver completed ``ticket``? (non-blocking; the output still needs wait())"""
        with self._lock:
            if ticket in self._stash:
                return True
        return bool(self._ring.done(int(ticket)))

    @property
    def pending(self) -> frozenset[int]:
        """Tickets posted and not yet returned by wait()."""
        with self._lock:
            return frozenset(self._pending | self._stash.keys())

    def close(self) -> None:
        self._ring.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Native call with C++ failures re-raised as oallama errors (invalid_argument -> ValueError
    stays a ValueError)."""
    try:
        return fn(*args)
    except RuntimeError as e:
        raise WeaverError(str(e)) from e
