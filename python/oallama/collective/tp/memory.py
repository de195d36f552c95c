"""One rank's shard of a llama GGUF, read on demand, and the layer-streaming memory manager.

Tensor parallelism (Megatron-style), per decoder layer, for rank r of R:
  attn_q/k/v  column-parallel: the rows (output features) of r's attention heads; KV heads follow
              the query heads (GQA: a KV head that two ranks' query heads share is on both)
  attn_output row-parallel: the matching columns (input features); its product is a partial sum
  ffn_gate/up column-parallel: r's share of the n_ff rows
  ffn_down    row-parallel: the matching columns; partial sum
  output      vocabulary-parallel: r's share of the vocabulary rows
Norm weights (1-d) are kept whole on every rank; token embeddings are read row by row from the file.

Weights are dequantized to float32 when a layer is loaded; the GGUF file (page cache, shared by a
host's ranks) is the backing store. Two stores:
  ResidentStore   every layer's shard loaded once, the KV cache of every layer in memory
  StreamingStore  the memory manager of seed 001: only the current layer is resident; a separate
                  thread loads the next layer (its weights and its heads' KV, read back from a
                  per-rank spill file) while the current one runs, and the finished layer's new KV
                  rows are written back and its memory freed.
Both count the bytes they hold (weights + KV), so the peak is known exactly, not only sampled.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ...errors import ModelFileError
from ...model import gguf_file

__all__ = ["GGUFSource", "LayerWeights", "LlamaConfig", "MemorySampler", "ResidentStore", "Shard",
           "StreamingStore", "dequant_rows"]

_DT_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a llama-architecture GGUF. Sizes are element counts."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_rot: int
    rope_base: float
    eps: float

    @classmethod
    def from_gguf(cls, info: gguf_file.GGUFInfo) -> LlamaConfig:
        if info.architecture != "llama":
            raise ModelFileError(f"{info.path}: tensor parallelism supports llama models, not '{info.architecture}'")
        E, H = int(info.hparam("embedding_length")), int(info.hparam("attention.head_count"))
        hd = int(info.hparam("attention.key_length", E // H))
        return cls(n_embd=E, n_layer=int(info.hparam("block_count")), n_head=H,
                   n_head_kv=int(info.hparam("attention.head_count_kv", H)), head_dim=hd,
                   n_ff=int(info.hparam("feed_forward_length")), n_vocab=info.tensor("token_embd.weight").shape[1],
                   n_rot=int(info.hparam("rope.dimension_count", hd)),
                   rope_base=float(info.hparam("rope.freq_base", 10000.0)),
                   eps=float(info.hparam("attention.layer_norm_rms_epsilon", 1e-5)))


def _split(n: int, parts: int, i: int, align: int = 1) -> tuple[int, int]:
    """[lo, hi) of part i when n is cut into `parts` near-equal pieces on multiples of align."""
    units = -(-n // align)
    lo = (units * i // parts) * align
    hi = min(n, (units * (i + 1) // parts) * align)
    return min(lo, n), hi


@dataclass(frozen=True)
class Shard:
    """What rank `rank` of `world` holds: [lo, hi) ranges of heads, FFN rows and vocabulary rows."""

    rank: int
    world: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    ff: tuple[int, int]
    vocab: tuple[int, int]

    @classmethod
    def split(cls, cfg: LlamaConfig, rank: int, world: int) -> Shard:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} not in [0, {world})")
        if world > cfg.n_head:
            raise ValueError(f"{world} ranks but only {cfg.n_head} attention heads to split")
        q0, q1 = _split(cfg.n_head, world, rank)
        g = cfg.n_head // cfg.n_head_kv  # query heads per KV head
        # FFN columns on 256-element boundaries where possible: ffn_down's blocks stay whole
        f0, f1 = _split(cfg.n_ff, world, rank, 256 if cfg.n_ff >= 256 * world else 1)
        return cls(rank, world, (q0, q1), (q0 // g, (q1 - 1) // g + 1), (f0, f1), _split(cfg.n_vocab, world, rank))

    @property
    def n_q(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def n_kv(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def dequant_rows(raw: np.ndarray, type_id: int, n_per_row: int) -> np.ndarray:
    """uint8 [rows, row_bytes] of ggml type -> float32 [rows, n_per_row] (fast paths: f32, f16, q8_0)."""
    t = GGMLQuantizationType(type_id)
    rows = raw.shape[0]
    if t == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(rows, n_per_row).copy()
    if t == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(rows, n_per_row).astype(np.float32)
    if t == GGMLQuantizationType.Q8_0:
        b = np.ascontiguousarray(raw).reshape(-1).view(_DT_Q8_0)
        out = np.empty((b.size, 32), np.float32)
        np.multiply(b["qs"], b["d"].astype(np.float32)[:, None], out=out)
        return out.reshape(rows, n_per_row)
    return np.asarray(dequantize(np.ascontiguousarray(raw), t), np.float32).reshape(rows, n_per_row)


class GGUFSource:
    """Reads slices of a GGUF's tensors with pread (no mmap: the pages stay page cache, shared by
    a host's ranks, not this process's resident memory)."""

    _CHUNK = 8 << 20  # bytes read per step when slicing columns

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.info = gguf_file.read(path)
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        self.bytes_read = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def has(self, name: str) -> bool:
        return any(t.name == name for t in self.info.tensors)

    def _geom(self, name: str) -> tuple[gguf_file.TensorInfo, int, int, int]:
        t = self.info.tensor(name)
        blck, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
        return t, blck, tsize, t.shape[0] // blck * tsize  # tensor, block, block bytes, row bytes

    def _pread(self, offset: int, n: int) -> np.ndarray:
        buf = os.pread(self._fd, n, self.info.data_offset + offset)
        if len(buf) != n:
            raise ModelFileError(f"{self.path}: short read at {offset} ({len(buf)} of {n} bytes)")
        self.bytes_read += n
        return np.frombuffer(buf, np.uint8)

    def rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """float32 [r1-r0, ne0]: rows r0..r1 (output features of a weight; a tensor's outer axis)."""
        t, _, _, rb = self._geom(name)
        raw = self._pread(t.offset + r0 * rb, (r1 - r0) * rb).reshape(r1 - r0, rb)
        return dequant_rows(raw, t.type_id, t.shape[0])

    def vector(self, name: str) -> np.ndarray:
        """float32 [ne0] of a 1-d tensor (a norm weight)."""
        return self.rows(name, 0, 1).reshape(-1)

    def cols(self, name: str, c0: int, c1: int) -> np.ndarray:
        """float32 [ne1, c1-c0]: columns c0..c1 of every row (input features of a weight)."""
        t, blck, tsize, rb = self._geom(name)
        n_rows = t.shape[1] if len(t.shape) > 1 else 1
        out = np.empty((n_rows, c1 - c0), np.float32)
        step = max(1, self._CHUNK // rb)
        aligned = c0 % blck == 0 and (c1 % blck == 0 or c1 == t.shape[0])
        b0, b1 = c0 // blck * tsize, -(-c1 // blck) * tsize  # byte range of those blocks in a row
        for r0 in range(0, n_rows, step):
            r1 = min(n_rows, r0 + step)
            raw = self._pread(t.offset + r0 * rb, (r1 - r0) * rb).reshape(r1 - r0, rb)
            if aligned:  # only the blocks of [c0, c1)
                out[r0:r1] = dequant_rows(np.ascontiguousarray(raw[:, b0:b1]), t.type_id, c1 - c0)
            else:
                out[r0:r1] = dequant_rows(raw, t.type_id, t.shape[0])[:, c0:c1]
        return out


@dataclass
class LayerWeights:
    """One layer's shard, float32, numpy [out, in] like the GGUF's rows."""

    wq: np.ndarray  # [n_q_local * head_dim, n_embd]
    wk: np.ndarray  # [n_kv_local * head_dim, n_embd]
    wv: np.ndarray  # [n_kv_local * head_dim, n_embd]
    wo: np.ndarray  # [n_embd, n_q_local * head_dim]
    w_gate: np.ndarray  # [ff_local, n_embd]
    w_up: np.ndarray  # [ff_local, n_embd]
    w_down: np.ndarray  # [n_embd, ff_local]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down))


def load_layer(src: GGUFSource, cfg: LlamaConfig, sh: Shard, i: int) -> LayerWeights:
    hd, b = cfg.head_dim, f"blk.{i}."
    (q0, q1), (k0, k1), (f0, f1) = sh.q_heads, sh.kv_heads, sh.ff
    return LayerWeights(
        wq=src.rows(b + "attn_q.weight", q0 * hd, q1 * hd),
        wk=src.rows(b + "attn_k.weight", k0 * hd, k1 * hd),
        wv=src.rows(b + "attn_v.weight", k0 * hd, k1 * hd),
        wo=src.cols(b + "attn_output.weight", q0 * hd, q1 * hd),
        w_gate=src.rows(b + "ffn_gate.weight", f0, f1),
        w_up=src.rows(b + "ffn_up.weight", f0, f1),
        w_down=src.cols(b + "ffn_down.weight", f0, f1),
    )


class _Accounting:
    """Bytes held by a store (weights + KV), with its peak. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = self.peak = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.current += n
            self.peak = max(self.peak, self.current)


@dataclass
class Resident:
    """What a store hands the decoder for layer i: weights and that layer's KV (rows 0..n_pos)."""

    index: int
    w: LayerWeights
    k: np.ndarray  # [rows, n_kv_local, head_dim] float32
    v: np.ndarray
    n_pos: int  # rows of k/v valid before this pass
    held: int = 0  # bytes accounted for this object
    n_end: int = 0  # rows valid after this pass's append

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add this pass's T rows at n_pos; returns K, V [n_pos+T, n_kv_local, head_dim]."""
        p1 = self.n_end = self.n_pos + k_new.shape[0]
        if self.k.shape[0] < p1:  # streamed layers hold exactly n_pos rows: grow
            self.k = np.concatenate([self.k[: self.n_pos], k_new])
            self.v = np.concatenate([self.v[: self.n_pos], v_new])
        else:
            self.k[self.n_pos : p1] = k_new
            self.v[self.n_pos : p1] = v_new
        return self.k[:p1], self.v[:p1]


class ResidentStore:
    """Every layer's shard and KV cache in memory for the whole run (no memory manager)."""

    streaming = False

    def __init__(self, src: GGUFSource, cfg: LlamaConfig, shard: Shard, n_ctx: int) -> None:
        self.acct = _Accounting()
        self.layers: list[Resident] = []
        for i in range(cfg.n_layer):
            w = load_layer(src, cfg, shard, i)
            # zero pages are committed as the cache fills: count what is written (see KV bytes below)
            k = np.zeros((n_ctx, shard.n_kv, cfg.head_dim), np.float32)
            v = np.zeros_like(k)
            self.layers.append(Resident(i, w, k, v, 0))
            self.acct.add(w.nbytes)
        self._kv_row_bytes = 2 * shard.n_kv * cfg.head_dim * 4
        self.n_pos = 0
        self._T = 0

    def begin_pass(self, T: int) -> None:
        self._T = T
        for r in self.layers:
            r.n_pos = self.n_pos
        self.acct.add(T * self._kv_row_bytes * len(self.layers))

    def get(self, i: int) -> Resident:
        return self.layers[i]

    def release(self, r: Resident) -> None:
        pass

    def end_pass(self) -> None:
        self.n_pos += self._T

    def reset(self) -> None:
        self.acct.add(-self.n_pos * self._kv_row_bytes * len(self.layers))
        self.n_pos = 0

    def close(self) -> None:
        self.layers = []


class StreamingStore:
    """The layer-streaming memory manager: the current layer resident, the next one prefetched by a
    separate thread, the finished one's new KV rows written back and its memory freed.

    A pass over the layers is begin_pass(T); for i: r = get(i) ... release(r); end_pass().
    get(i) returns layer i (waiting for its prefetch if needed) and queues the prefetch of i+1
    (of layer 0 of the next pass after the last layer). The prefetch thread runs its jobs in
    order, so a layer's KV write-back always precedes that layer's next load.
    """

    streaming = True

    def __init__(self, src: GGUFSource, cfg: LlamaConfig, shard: Shard, n_ctx: int,
                 spill_dir: str | os.PathLike[str] | None = None) -> None:
        self.src, self.cfg, self.shard, self.n_ctx = src, cfg, shard, n_ctx
        self.acct = _Accounting()
        # KV spill file: per layer [2 (k, v), n_ctx, n_kv_local, head_dim] float32
        self._row_bytes = shard.n_kv * cfg.head_dim * 4
        self._spill = tempfile.TemporaryFile(dir=spill_dir, prefix="oallama-kv-")  # noqa: SIM115  (closed in close())
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="oallama-prefetch")
        self._pending: dict[int, Future[Resident]] = {}
        self.n_pos = 0
        self._T = 0
        self.load_seconds = 0.0  # time the prefetch thread spent loading (overlapped or not)
        self.wait_seconds = 0.0  # time the decoder waited for a layer (not hidden by compute)
        self.load_threads: set[str] = set()  # names of the threads that loaded layers

    def _offset(self, i: int, which: int, row: int) -> int:
        return ((2 * i + which) * self.n_ctx + row) * self._row_bytes

    def _load(self, i: int, n_pos: int, cap: int) -> Resident:
        """Layer i's weights and KV rows [0, n_pos), with room for cap rows."""
        t0 = time.perf_counter()
        self.load_threads.add(threading.current_thread().name)
        w = load_layer(self.src, self.cfg, self.shard, i)
        kv = []
        for which in (0, 1):
            a = np.empty((cap, self.shard.n_kv, self.cfg.head_dim), np.float32)
            if n_pos:
                nb = n_pos * self._row_bytes
                buf = os.pread(self._spill.fileno(), nb, self._offset(i, which, 0))
                a[:n_pos].reshape(-1).view(np.uint8)[:] = np.frombuffer(buf, np.uint8)
            kv.append(a)
        held = w.nbytes + kv[0].nbytes + kv[1].nbytes
        self.acct.add(held)
        self.load_seconds += time.perf_counter() - t0
        return Resident(i, w, kv[0], kv[1], n_pos, held)

    def _write_back(self, i: int, k: np.ndarray, v: np.ndarray, p0: int) -> None:
        os.pwrite(self._spill.fileno(), k.tobytes(), self._offset(i, 0, p0))
        os.pwrite(self._spill.fileno(), v.tobytes(), self._offset(i, 1, p0))

    def begin_pass(self, T: int) -> None:
        if self.n_pos + T > self.n_ctx:
            raise ValueError(f"context full: {self.n_pos} + {T} > n_ctx {self.n_ctx}")
        self._T = T

    def _prefetch(self, j: int, n_pos: int, cap: int) -> None:
        if j not in self._pending:
            self._pending[j] = self._pool.submit(self._load, j, n_pos, cap)

    def get(self, i: int) -> Resident:
        t0 = time.perf_counter()
        fut = self._pending.pop(i, None)
        r = fut.result() if fut is not None else self._load(i, self.n_pos, self.n_pos + self._T)
        self.wait_seconds += time.perf_counter() - t0
        if r.n_pos != self.n_pos:  # a stale prefetch (the pass was not the expected one)
            self.acct.add(-r.held)
            r = self._load(i, self.n_pos, self.n_pos + self._T)
        L = self.cfg.n_layer
        if i + 1 < L:
            self._prefetch(i + 1, self.n_pos, self.n_pos + self._T)
        elif L > 1:  # the next pass is most likely one decode step
            self._prefetch(0, self.n_pos + self._T, self.n_pos + self._T + 1)
        return r

    def release(self, r: Resident) -> None:
        """Write back the rows this pass added and free the layer."""
        p0, p1 = r.n_pos, r.n_end
        if p1 > p0:
            self._pool.submit(self._write_back, r.index, r.k[p0:p1].copy(), r.v[p0:p1].copy(), p0)
        self.acct.add(-r.held)
        r.w = None  # type: ignore[assignment]  # the decoder drops its reference too: memory returns now
        r.k = r.v = np.empty((0,), np.float32)

    def end_pass(self) -> None:
        self.n_pos += self._T

    def reset(self) -> None:
        for fut in self._pending.values():
            self.acct.add(-fut.result().held)
        self._pending.clear()
        self.n_pos = 0

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._pending.clear()
        self._spill.close()


class MemorySampler:
    """Peak of this process's anonymous resident memory (RssAnon, bytes), sampled by a thread
    every `period_s` and at every sample() call. File pages (the model in the page cache) are not
    counted: they are shared by the host's ranks and dropped under pressure."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.base = self.peak = _rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oallama-memsampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> int:
        now = _rss_anon()
        if now > self.peak:
            self.peak = now
        return now

    def rebase(self) -> None:
        self.base = self.peak = _rss_anon()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _rss_anon() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
