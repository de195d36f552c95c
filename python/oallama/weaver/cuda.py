"""Weaver's GPU receiver and sender (``oallama._weaver_cuda``, built with ``OALLAMA_KERNELS=ON``).

Same protocol and layout as the CPU reference in :mod:`oallama.weaver` (read its docstring
first). :class:`CudaReceiver` keeps the ring in device memory, exported with CUDA IPC, or with
``memory="host"`` in the reference's POSIX shared memory mapped into the device (then a CPU
``weaver.Sender`` can post to it); the polling kernel is enqueued after each of the cold model's
kernels. :class:`CudaSender` posts and waits with kernels on its own stream.

Example (another process holds the receiver and sent us ``handle = rx.ipc_handle``)::

    with CudaSender(handle, timeout=30.0) as tx:
        out = tx.attention(seq_id=0, pos=17, q=q, k=k, v=v)   # f32 [n_head, head_dim]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BuildConfigError, WeaverError, WeaverTaskError, WeaverTimeoutError
from .host import DTYPES, STATUS_NAMES, WeaverConfig, _call, _check_dtype, _native, to_storage


def cuda_available() -> bool:
    """Was oallama built with its own CUDA kernels (OALLAMA_KERNELS=ON)? (says nothing of a GPU)"""
    try:
        from .. import _weaver_cuda  # noqa: F401
    except ImportError:
        return False
    return True


def require_cuda() -> Any:
    """The native CUDA module, or BuildConfigError saying how to build it."""
    try:
        from .. import _weaver_cuda
    except ImportError as e:
        raise BuildConfigError("weaver: oallama was built without its CUDA kernels; rebuild with "
                               "OALLAMA_KERNELS=ON scripts/setup.sh (needs nvcc)") from e
    return _weaver_cuda


_CUDA_ERRORS = {1: "ring full (no free slot before the timeout)", 2: "not completed before the timeout",
                3: "the receiver closed the ring", 4: "protocol violation (slot not DONE after completion)"}


class CudaReceiver:
    """GPU receiver: the ring in device memory (exported with CUDA IPC: ``ipc_handle``), or with
    ``memory="host"`` in POSIX shared memory mapped into the device (then CPU ``weaver.Sender``\\ s
    attach by ``name``; refused unless the device reports native host atomics, or
    ``require_host_atomics=False``). KV cache and polling state are private device memory.

    :meth:`poll` enqueues ONE polling kernel on ``stream`` (default: the receiver's own); place
    one after each of the cold model's kernels. Polls of one receiver must stay on one stream.
    head_dim 64 or 128; f16/bf16 (or f32) storage, f32 accumulation.
    """

    def __init__(self, *, n_head: int, n_head_kv: int, head_dim: int, max_seqs: int, max_ctx: int,
                 dtype: str = "f16", capacity: int = 64, max_tasks: int = 8, scale: float | None = None,
                 checksum: bool = True, device: int = 0, stream: int = 0, memory: str = "device",
                 require_host_atomics: bool = True) -> None:
        cu = require_cuda()
        if memory not in ("device", "host"):
            raise ValueError(f"weaver: memory must be 'device' or 'host', got {memory!r}")
        self._host_ring = None
        region, nbytes = 0, 0
        if memory == "host":
            self._host_ring = _call(_native().Ring.create, n_head, n_head_kv, head_dim, DTYPES[_check_dtype(dtype)],
                                    max_seqs, max_ctx, capacity, float(scale or 0.0), checksum, "")
            region, nbytes = self._host_ring.address, self._host_ring.nbytes
        try:
            self._rx = _call(cu.Receiver, n_head, n_head_kv, head_dim, DTYPES[_check_dtype(dtype)], max_seqs, max_ctx,
                             capacity, float(scale or 0.0), checksum, device, max_tasks, stream, region, nbytes,
                             require_host_atomics)
        except BaseException:
            if self._host_ring is not None:
                self._host_ring.close()
            raise
        self.config = WeaverConfig.from_dict(self._rx.config())
        self.memory = memory
        self.device = device
        #: shm name for CPU senders (host memory only)
        self.name: str | None = self._host_ring.name if self._host_ring is not None else None

    @property
    def ipc_handle(self) -> bytes:
        """The CUDA IPC handle (64 bytes) of the device-memory ring, for a sender in another process."""
        if self.memory != "device":
            raise WeaverError("weaver: a host-memory ring has no IPC handle; senders attach by name")
        return bytes(self._rx.ipc_handle)

    @property
    def region(self) -> int:
        """Device pointer of the ring (for a CudaSender in this process)."""
        return int(self._rx.region)

    @property
    def stream(self) -> int:
        return int(self._rx.stream)

    def poll(self, *, stream: int = 0, max_tasks: int = 0) -> None:
        """Enqueues one polling kernel (asynchronous; bounded: at most max_tasks tasks)."""
        _call(self._rx.poll, int(stream), int(max_tasks))

    def load_kv(self, seq_id: int, k: np.ndarray, v: np.ndarray) -> None:
        """Sets a sequence's context: k, v [n_ctx, n_head_kv, head_dim] (values, or bf16 bits)."""
        c = self.config
        ks, vs = to_storage(k, c.dtype), to_storage(v, c.dtype)
        if ks.shape != vs.shape or ks.ndim != 3 or ks.shape[1:] != c.kv_shape:
            raise ValueError(f"weaver: k, v must be [n_ctx, {c.n_head_kv}, {c.head_dim}], got {ks.shape}, {vs.shape}")
        _call(self._rx.load_kv, int(seq_id), ks, vs, int(ks.shape[0]))

    def synchronize(self) -> None:
        _call(self._rx.synchronize)

    def stats(self) -> dict[str, int]:
        """polls, empty_polls, taken, completed, corrupt (from the device; synchronises the stream)."""
        return dict(_call(self._rx.stats))

    def close(self) -> None:
        self._rx.close()
        if self._host_ring is not None:
            self._host_ring.close()

    def __enter__(self) -> CudaReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CudaSender:
    """GPU-driven sender: post and wait are kernels on the sender's stream (one-sided writes into
    the receiver's ring, acquire on its completion counter). ``source``: the receiver's IPC handle
    (bytes, another process), a :class:`CudaReceiver` (this process: IPC cannot reopen its own
    memory), or the shm name of a host-memory ring. At most ``capacity`` tasks may be posted and
    not yet waited for across the senders of a ring."""

    def __init__(self, source: bytes | str | CudaReceiver, *, device: int = 0, stream: int = 0,
                 max_outstanding: int = 0, timeout: float = 10.0) -> None:
        cu = require_cuda()
        self._host_ring = None
        kw: dict[str, Any] = {"device": device, "stream": stream, "max_outstanding": max_outstanding,
                              "timeout_s": float(timeout)}
        if isinstance(source, CudaReceiver):
            kw["region"] = source.region
        elif isinstance(source, bytes | bytearray):
            kw["ipc_handle"] = bytes(source)
        else:
            self._host_ring = _call(_native().Ring.attach, str(source), 5.0)
            kw["host_region"], kw["host_bytes"] = self._host_ring.address, self._host_ring.nbytes
        self._tx = _call(lambda: cu.Sender(**kw))
        self.config = WeaverConfig.from_dict(self._tx.config())

    @property
    def stream(self) -> int:
        return int(self._tx.stream)

    def _raise_for(self, handle: int, code: int) -> None:
        if code == 0:
            return
        if code >= 16:
            raise WeaverTaskError(f"weaver: handle {handle}: {STATUS_NAMES.get(code - 16, code - 16)}")
        cls = WeaverTimeoutError if code in (1, 2) else WeaverError
        raise cls(f"weaver: handle {handle}: {_CUDA_ERRORS.get(code, code)}")

    def post(self, seq_id: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, tag: int = 0) -> int:
        """Posts host arrays; returns a handle once the task is published."""
        c = self.config
        if not (0 <= seq_id < c.max_seqs and 0 <= pos < c.max_ctx):
            raise WeaverTaskError(f"weaver: seq_id {seq_id} / position {pos} out of range")
        qs, ks, vs = (to_storage(x, c.dtype) for x in (q, k, v))
        handle = int(_call(self._tx.post_host, int(seq_id), int(pos), qs, ks, vs, int(tag)))
        self._raise_for(handle, int(self._tx.error(handle)))
        return handle

    def wait(self, handle: int) -> np.ndarray:
        """Waits for a handle (the wait kernel, then a copy); f32 [n_head, head_dim]."""
        out = np.empty((self.config.n_head, self.config.head_dim), np.float32)
        self._raise_for(handle, int(_call(self._tx.wait_host, int(handle), out)))
        return out

    def attention(self, seq_id: int, pos: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """post + wait (the timeout given at construction bounds both kernels)."""
        return self.wait(self.post(seq_id, pos, q, k, v))

    def post_ptr(self, seq_id: int, pos: int, q: int, k: int, v: int, *, tag: int = 0, stream: int = 0) -> int:
        """Enqueues the post kernel reading device pointers (storage dtype); asynchronous."""
        return int(_call(self._tx.post, int(seq_id), int(pos), int(q), int(k), int(v), int(tag), int(stream)))

    def wait_ptr(self, handle: int, out: int, *, stream: int = 0) -> None:
        """Enqueues the wait kernel writing f32 [n_head, head_dim] to device pointer out; asynchronous
        (check with :meth:`check` after synchronising)."""
        _call(self._tx.wait, int(handle), int(out), int(stream))

    def staging(self, handle: int) -> tuple[int, int, int, int]:
        """Device pointers (q, k, v, out) of a handle's staging buffers (what post() copies into)."""
        return tuple(int(x) for x in self._tx.staging(int(handle)))  # type: ignore[return-value]

    def check(self, handle: int) -> None:
        """Raises the handle's error, if any (after the stream that ran it was synchronised)."""
        self._raise_for(handle, int(_call(self._tx.error, int(handle))))

    def synchronize(self) -> None:
        _call(self._tx.synchronize)

    def close(self) -> None:
        self._tx.close()
        if self._host_ring is not None:
            self._host_ring.close()

    def __enter__(self) -> CudaSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
