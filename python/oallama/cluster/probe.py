"""Probe: measure rpc-server devices and the links to them, for the distributed planner.

    oallama probe 10.0.0.2:50052 10.0.0.3:50052 -o devices.json

For each device (the first one named is device 0, which holds block 0 in every plan):

* memory: free / total bytes through the RPC backend (the same query llama.cpp makes);
* compute: sustained FLOP/s of a matmul on the device (a q8_0 weight, f32 activations of 1 and
  n_prompt columns), timed as R back-to-back computes followed by one round trip, minus that
  round trip. ``_core.profile_mul_mat`` cannot time an rpc device: ggml-rpc sends graph_compute
  asynchronously and its synchronize() waits for the local send queue only (it "measures" a
  4096x4096 matmul in ~25 us);
* the link: round-trip time of a 1-byte read; delay of fixed-size payloads (1 MiB by default)
  each way, hence goodput up and down (payload / (delay - round trip)); jitter = the range of
  the delays a small message (a token's activation) meets: the patent's max - min, over the
  central 80% of the 1-byte round trips (p90 - p10; raw ranges and the payloads' ranges are
  stored beside it); loss = retransmitted / sent TCP segments of the
  client -> device direction, less those the receiver reported as duplicates (D-SACK:
  spurious, e.g. tail-loss probes), over payloads sent paced at half the up goodput (so that
  the sample counts what the link drops, not the drops of a queue the probe itself fills);
  Linux TCP_INFO; the sample is stored.

Link and compute are measured over a connection of our own that speaks ggml-rpc's wire
protocol (version 7: HELLO, ALLOC_BUFFER, BUFFER_GET_BASE, SET_TENSOR, GET_TENSOR,
GRAPH_COMPUTE, GRAPH_RECOMPUTE, FREE_BUFFER), so that every timing is a round trip we control
and TCP_INFO reads our own socket. rpc-server serves one client at a time: nothing else may be
connected to it while it is probed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ..errors import ProfileError, RpcServerError
from ..options import add_arguments, from_args, option
from ..runtime import devices as devmod
from .problem import DEVICES_SCHEMA

RPC_PROTO_MAJOR = 7
# enum rpc_cmd (ggml-rpc.cpp, protocol 7)
CMD_ALLOC_BUFFER, CMD_BUFFER_GET_BASE, CMD_FREE_BUFFER = 0, 3, 4
CMD_SET_TENSOR, CMD_GET_TENSOR, CMD_GRAPH_COMPUTE = 6, 8, 10
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT, CMD_GRAPH_RECOMPUTE = 11, 14, 15, 16
CONN_CAPS_SIZE = 24
GGML_TYPE_F32, GGML_TYPE_Q8_0, GGML_TYPE_I8 = 0, 8, 24
GGML_OP_NONE, GGML_OP_MUL_MAT = 0, 29  # enum ggml_op of the pinned ggml (GGML_OP_COUNT == 101)
GGML_TENSOR_FLAG_COMPUTE = 16  # a node the backend must compute (ggml skips nodes without it)
Q8_0_BLOCK, Q8_0_BYTES = 32, 34  # elements and bytes per q8_0 block (f16 scale + 32 int8)
# struct rpc_tensor (packed): id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10],
# view_src, view_offs, data, name[64], use_count
_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
assert _TENSOR.size == 296
_HEADER = struct.Struct("<BQ")  # command byte, payload size
_SIZE = struct.Struct("<Q")
MIB = 2**20


@dataclass(frozen=True)
class RemoteBuffer:
    ptr: int  # the server's buffer handle
    base: int  # address of its first byte on the server
    size: int  # bytes


@dataclass(frozen=True)
class Tensor:
    """A tensor in a remote buffer, as ggml-rpc describes it."""

    id: int
    type: int
    buffer: RemoteBuffer
    offset: int  # bytes from the buffer's base
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    op: int = GGML_OP_NONE
    src: tuple[int, ...] = ()
    flags: int = 0

    @property
    def nbytes(self) -> int:
        return self.nb[3] * self.ne[3]

    def pack(self) -> bytes:
        src = (*self.src, *([0] * (10 - len(self.src))))
        return _TENSOR.pack(self.id, self.type, self.buffer.ptr, *self.ne, *self.nb, self.op, *([0] * 16), self.flags, *src,
                            0, 0, self.buffer.base + self.offset, b"", 0)


def bytes_tensor(tid: int, buf: RemoteBuffer, offset: int, n: int) -> Tensor:
    return Tensor(tid, GGML_TYPE_I8, buf, offset, (n, 1, 1, 1), (1, n, n, n))


def f32_tensor(tid: int, buf: RemoteBuffer, offset: int, cols: int, rows: int, op: int = GGML_OP_NONE,
               src: tuple[int, ...] = ()) -> Tensor:
    row = 4 * cols
    flags = GGML_TENSOR_FLAG_COMPUTE if op != GGML_OP_NONE else 0
    return Tensor(tid, GGML_TYPE_F32, buf, offset, (cols, rows, 1, 1), (4, row, row * rows, row * rows), op, src,
                  flags)


def q8_0_tensor(tid: int, buf: RemoteBuffer, offset: int, k: int, m: int) -> Tensor:
    row = k // Q8_0_BLOCK * Q8_0_BYTES
    return Tensor(tid, GGML_TYPE_Q8_0, buf, offset, (k, m, 1, 1), (Q8_0_BYTES, row, row * m, row * m))


@dataclass(frozen=True)
class TcpCounters:
    """Cumulative counters of one TCP connection (Linux struct tcp_info)."""

    rtt_us: int  # smoothed round trip (us)
    min_rtt_us: int
    total_retrans: int  # segments retransmitted
    data_segs_out: int  # data segments sent
    dsack_dups: int  # retransmissions the receiver reported as duplicates (spurious: no loss)

    @staticmethod
    def read(sock: socket.socket) -> TcpCounters | None:
        if not hasattr(socket, "TCP_INFO"):
            return None
        try:
            raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            return None
        if len(raw) < 220:
            return None
        # offsets of struct tcp_info (linux/tcp.h): 8 bytes of u8 fields, then u32s
        rtt = struct.unpack_from("<I", raw, 68)[0]
        total_retrans = struct.unpack_from("<I", raw, 100)[0]
        min_rtt = struct.unpack_from("<I", raw, 148)[0]
        data_segs_out = struct.unpack_from("<I", raw, 156)[0]
        dsack_dups = struct.unpack_from("<I", raw, 216)[0]
        return TcpCounters(rtt, min_rtt, total_retrans, data_segs_out, dsack_dups)


class RpcClient:
    """A minimal ggml-rpc client (protocol 7) for measurements. Not for running models."""

    def __init__(self, endpoint: str, timeout: float = 30.0) -> None:
        self.endpoint = endpoint
        host, port = devmod.parse_endpoint(endpoint)
        devmod.probe_endpoint(endpoint, timeout=min(timeout, 5.0))
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise RpcServerError(f"cannot reach rpc-server at {endpoint}: {e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id = 1
        try:
            rsp = self.call(CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
        except TimeoutError:
            self.close()  # a reset (see close): the server must not answer this HELLO later
            raise RpcServerError(f"rpc-server {endpoint} did not answer HELLO within {timeout:.0f} s: it serves one "
                                 "client at a time; is another client connected?") from None
        self.version = (rsp[0], rsp[1], rsp[2])
        if self.version[0] != RPC_PROTO_MAJOR:
            self.close()
            raise RpcServerError(f"rpc-server {endpoint} speaks RPC protocol {'.'.join(map(str, self.version))}; "
                                 f"oallama's probe speaks {RPC_PROTO_MAJOR}.x")

    # --- framing ------------------------------------------------------------------------

    def _recv(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise RpcServerError(f"rpc-server {self.endpoint} closed the connection")
            got += k
        return bytes(buf)

    def send(self, cmd: int, payload: bytes | memoryview) -> None:
        """A command without a response."""
        self.sock.sendall(_HEADER.pack(cmd, len(payload)))
        self.sock.sendall(payload)

    def call(self, cmd: int, payload: bytes, response_size: int) -> bytes:
        """A command and its response (which must be response_size bytes)."""
        self.send(cmd, payload)
        size = _SIZE.unpack(self._recv(_SIZE.size))[0]
        if size != response_size:
            raise RpcServerError(f"rpc-server {self.endpoint}: command {cmd} answered {size} bytes, expected "
                                 f"{response_size} (did the request fail on the server? see its log)")
        return self._recv(size)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # --- commands -----------------------------------------------------------------------

    def device_count(self) -> int:
        return struct.unpack("<I", self.call(CMD_DEVICE_COUNT, b"", 4))[0]

    def device_memory(self, device: int = 0) -> tuple[int, int]:
        """(free, total) bytes."""
        return struct.unpack("<QQ", self.call(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16))

    def alloc(self, size: int, device: int = 0) -> RemoteBuffer:
        ptr, got = struct.unpack("<QQ", self.call(CMD_ALLOC_BUFFER, struct.pack("<IQ", device, size), 16))
        if ptr == 0:
            raise ProfileError(f"rpc-server {self.endpoint}: cannot allocate {size / MIB:.1f} MiB on device {device}")
        base = struct.unpack("<Q", self.call(CMD_BUFFER_GET_BASE, struct.pack("<Q", ptr), 8))[0]
        return RemoteBuffer(ptr, base, got)

    def free(self, buf: RemoteBuffer) -> None:
        self.send(CMD_FREE_BUFFER, struct.pack("<Q", buf.ptr))

    def set(self, t: Tensor, data: bytes | memoryview, offset: int = 0) -> None:
        """SET_TENSOR: no response; the server applies commands in order."""
        head = t.pack() + struct.pack("<BQ", 0, offset)
        self.sock.sendall(_HEADER.pack(CMD_SET_TENSOR, len(head) + len(data)))
        self.sock.sendall(head)
        self.sock.sendall(data)

    def get(self, t: Tensor, size: int, offset: int = 0) -> bytes:
        return self.call(CMD_GET_TENSOR, t.pack() + struct.pack("<QQ", offset, size), size)

    def graph_compute(self, device: int, nodes: Sequence[Tensor], tensors: Sequence[Tensor]) -> None:
        """GRAPH_COMPUTE (no response): `nodes` in order, `tensors` every tensor they reach."""
        payload = struct.pack(f"<II{len(nodes)}QI", device, len(nodes), *(t.id for t in nodes), len(tensors))
        self.send(CMD_GRAPH_COMPUTE, payload + b"".join(t.pack() for t in tensors))

    def graph_recompute(self, device: int) -> None:
        self.send(CMD_GRAPH_RECOMPUTE, struct.pack("<I", device))

    def tcp_counters(self) -> TcpCounters | None:
        return TcpCounters.read(self.sock)

    @contextlib.contextmanager
    def paced(self, rate_Bps: float) -> Iterator[bool]:
        """The connection's sending rate capped (bytes/s) while inside: Linux's SO_MAX_PACING_RATE,
        which TCP's internal pacing honours without the fq qdisc. Yields whether the cap is set."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("I", min(int(rate_Bps), 2**32 - 2)))
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("I", 2**32 - 1))  # no cap

    def close(self) -> None:
        """Close with a reset (SO_LINGER 0). A plain close can kill rpc-server: if it still has
        a reply to write (a HELLO queued while it served another client, a request cut short),
        writing to the closed socket raises SIGPIPE, which it does not ignore. On a reset
        connection its next read fails and it drops the client cleanly (freeing its buffers)."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --- measurements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeOptions:
    payload_bytes: int = MIB  # fixed-size payload of the bandwidth/jitter samples (bytes)
    samples: int = 10  # payloads each way
    loss_payloads: int = 4  # payloads sent paced at half the up goodput for the loss sample (2,900 segments of 1 MiB)
    rtt_samples: int = 30  # 1-byte round trips
    warmup: int = 3  # payloads each way before measuring (TCP slow start)
    matmul_k: int = 4096  # weight row length of the compute probe
    matmul_m: int = 4096  # weight rows
    tokens: tuple[int, ...] = (1, 64)  # activation columns the compute probe times
    compute_target_s: float = 0.3  # each compute sample runs about this long (s)
    compute_repeats: int = 5  # compute samples per token count (the median kept)
    client_threads: int | None = None  # threads of the client's matmul probe (llama-cpp's default)
    timeout_s: float = 60.0  # per socket operation (s)


SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux; Python's socket module lacks it


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _trimmed_range(samples: Sequence[float]) -> float:
    """p90 - p10 of the samples (s)."""
    lo, hi = np.percentile(np.asarray(samples, dtype=float), [10, 90])
    return float(hi - lo)


def measure_link(client: RpcClient, opts: ProbeOptions, device: int = 0) -> dict[str, Any]:
    """Round trip, payload delays each way, goodput, jitter and loss of the client's link."""
    size = opts.payload_bytes
    buf = client.alloc(size + 64, device)
    try:
        t_small = bytes_tensor(client.new_id(), buf, 0, 1)
        t_pay = bytes_tensor(client.new_id(), buf, 0, size)
        payload = os.urandom(size)
        before = client.tcp_counters()
        for _ in range(opts.warmup):
            client.set(t_pay, payload)
            client.get(t_pay, size)
        rtt = [_timed(lambda: client.get(t_small, 1)) for _ in range(opts.rtt_samples)]
        down = [_timed(lambda: client.get(t_pay, size)) for _ in range(opts.samples)]

        def upload() -> None:
            client.set(t_pay, payload)
            client.get(t_small, 1)  # answered once the server has applied the upload

        up = [_timed(upload) for _ in range(opts.samples)]
        rtt_med = statistics.median(rtt)

        def goodput(delays: list[float]) -> float:
            return size / max(statistics.median(delays) - rtt_med, 1e-7)  # bytes/s

        # loss: what the link drops, not what a bulk transfer makes a full bottleneck queue drop
        # (a loss-based congestion control such as CUBIC finds the rate by overflowing it: 0.2-0.3%
        # of the unpaced probe's segments on clean emulated links, bench/results/2026-11-24-vm-
        # distributed). A request's messages are far below the rate; so is this sample: paced at
        # half the up goodput, no queue builds
        pace = goodput(up) / 2  # bytes/s
        before = client.tcp_counters()
        with client.paced(pace) as paced:
            for _ in range(opts.loss_payloads):
                upload()
        after = client.tcp_counters()
    finally:
        client.free(buf)

    out: dict[str, Any] = {
        "rtt_s": rtt_med,
        "latency_s": rtt_med / 2,
        "bandwidth_up_Bps": goodput(up),
        "bandwidth_down_Bps": goodput(down),
        # the patent's jitter is max - min delay. The planner gets it for what a token's
        # activation meets, a small message: the 1-byte round trips, over their central 80%
        # (p90 - p10; the raw max - min of a few samples on a shared host is one scheduling
        # hiccup). The payloads' ranges are kept: their spread is mostly throughput noise
        "jitter_s": _trimmed_range(rtt),
        "rtt_jitter_s": _trimmed_range(rtt),
        "rtt_range_s": max(rtt) - min(rtt),
        "payload_jitter_s": max(_trimmed_range(up), _trimmed_range(down)),
        "payload_range_s": max(max(up) - min(up), max(down) - min(down)),
        "payload_bytes": size,
        "samples": {"rtt_s": rtt, "up_s": up, "down_s": down},
        "loss": 0.0,
        "loss_sample": "not measured (no TCP_INFO on this platform)",
    }
    if before is not None and after is not None:
        sent = after.data_segs_out - before.data_segs_out
        retrans = after.total_retrans - before.total_retrans
        spurious = min(after.dsack_dups - before.dsack_dups, retrans)
        out["loss"] = (retrans - spurious) / sent if sent > 0 else 0.0
        out["loss_sample"] = {"direction": "client->device", "segments_sent": sent, "segments_retransmitted": retrans,
                              "spurious_retransmissions": spurious, "paced_Bps": pace if paced else None}
        out["tcp_min_rtt_s"] = after.min_rtt_us / 1e6
    return out


def _q8_0_weight(k: int, m: int, seed: int) -> tuple[bytes, np.ndarray]:
    """Random q8_0 rows [m, k] (bytes) and their dequantised values (float32 [m, k])."""
    rng = np.random.default_rng(seed)
    nb = k // Q8_0_BLOCK
    qs = rng.integers(-127, 128, size=(m, nb, Q8_0_BLOCK), dtype=np.int8)
    d = np.float16(1.0 / (127.0 * math.sqrt(k)))
    blocks = np.empty((m, nb), dtype=[("d", "<f2"), ("qs", "i1", Q8_0_BLOCK)])
    blocks["d"] = d
    blocks["qs"] = qs
    return blocks.tobytes(), (qs.astype(np.float32) * np.float32(d)).reshape(m, k)


@dataclass
class MatmulRun:
    """The tensors of the compute probe on one device."""

    client: RpcClient
    device: int
    k: int
    m: int
    n_max: int
    buf: RemoteBuffer = field(init=False)
    w: Tensor = field(init=False)
    dense: np.ndarray = field(init=False)
    x_data: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.k % Q8_0_BLOCK:
            raise ProfileError(f"matmul row length {self.k} is not a multiple of {Q8_0_BLOCK}")
        w_bytes, self.dense = _q8_0_weight(self.k, self.m, 1234)
        align = 256
        self._x_off = -(-len(w_bytes) // align) * align
        self._y_off = self._x_off + -(-4 * self.k * self.n_max // align) * align
        total = self._y_off + 4 * self.m * self.n_max
        self.buf = self.client.alloc(total, self.device)
        self.w = q8_0_tensor(self.client.new_id(), self.buf, 0, self.k, self.m)
        self.client.set(self.w, w_bytes)
        self.x_data = np.random.default_rng(7).standard_normal((self.n_max, self.k)).astype(np.float32)
        x_all = f32_tensor(self.client.new_id(), self.buf, self._x_off, self.k, self.n_max)
        self.client.set(x_all, self.x_data.tobytes())

    def run(self, n: int) -> tuple[Tensor, float]:
        """Build and compute y = W x for n columns once; (y, seconds until its first byte is back)."""
        x = f32_tensor(self.client.new_id(), self.buf, self._x_off, self.k, n)
        y = f32_tensor(self.client.new_id(), self.buf, self._y_off, self.m, n, GGML_OP_MUL_MAT, (self.w.id, x.id))
        t0 = time.perf_counter()
        self.client.graph_compute(self.device, [y], [self.w, x, y])
        self.client.get(y, 4)
        return y, time.perf_counter() - t0

    def result(self, y: Tensor) -> np.ndarray:
        """y as float32 [n, m] (column c: the product with activation column c)."""
        n = y.ne[1]
        return np.frombuffer(self.client.get(y, 4 * self.m * n), dtype=np.float32).reshape(n, self.m)

    def close(self) -> None:
        self.client.free(self.buf)


def measure_compute(client: RpcClient, opts: ProbeOptions, link: dict[str, Any], device: int = 0,
                    progress: Any = None) -> dict[str, Any]:
    """Sustained FLOP/s of a q8_0 matmul at each token count: R recomputes of the stored graph
    sent back to back, then one 4-byte read; (elapsed - round trip) / R per compute; the median
    of compute_repeats such samples. R grows until the computes outlast both compute_target_s
    and 20x the link's round-trip jitter, so that the round trip subtracted is noise: it doubles
    while the computes take less than a round trip, and is extrapolated to the target from a
    sample they dominate (from a smaller one the estimate is the round trip's noise: a round trip
    measured 4x slower than the link then ran took R to 480,000 and a 5-s probe to 95 s)."""
    k, m = opts.matmul_k, opts.matmul_m
    rtt, rtt_jitter = float(link["rtt_s"]), float(link.get("rtt_jitter_s", 0.0))
    target = max(opts.compute_target_s, 20.0 * rtt_jitter)
    run = MatmulRun(client, device, k, m, max(opts.tokens))

    def timed(y: Tensor, reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            client.graph_recompute(device)
        client.get(y, 4)
        return time.perf_counter() - t0

    flops: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    computes: dict[str, int] = {}
    try:
        for n in sorted(opts.tokens):
            y, _ = run.run(n)
            reps = 2
            while reps < 1_000_000:
                spent = timed(y, reps) - rtt
                if spent >= target:
                    break
                reps = max(reps * 2, int(reps * target / spent * 1.2)) if spent > rtt else reps * 2
            computes[str(n)] = reps
            per = [max(timed(y, reps) - rtt, 1e-9) / reps for _ in range(opts.compute_repeats)]
            # the median: the project's VM ran the same matmul 1.35x slower for seconds at a time,
            # and the runs being planned for meet those moments too (the fastest sample is biased low)
            med = statistics.median(per)
            flops[str(n)] = 2.0 * k * m * n / med
            samples[str(n)] = per
            if progress:
                progress(f"    matmul {k}x{m} q8_0 x {n} column(s): {med * 1e3:.3f} ms, "
                         f"{flops[str(n)] / 1e9:.2f} GFLOP/s ({reps} computes per sample)")
    finally:
        run.close()
    return {"flops": flops, "matmul": {"type": "q8_0", "k": k, "m": m, "seconds": samples, "computes": computes}}


def measure_client(opts: ProbeOptions) -> dict[str, Any]:
    """FLOP/s of the client's CPU (it runs the output head), through oallama's op profiler."""
    from .. import _core

    threads = opts.client_threads or max(multiprocessing.cpu_count() // 2, 1)
    k, m = opts.matmul_k, opts.matmul_m
    ns = sorted(opts.tokens)
    res = _core.profile_mul_mat("CPU", "q8_0", k, m, ns, threads, 2, 5)
    flops = {str(n): 2.0 * k * m * n / (statistics.median(r.samples_us) / 1e6) for n, r in zip(ns, res, strict=True)}
    return {"name": "CPU", "threads": threads, "flops": flops, "description": platform.processor() or platform.machine()}


def tcp_settings() -> dict[str, Any]:
    """The client kernel's TCP settings that decide whether a request after an idle link starts
    from TCP's initial window (problem.restarts_after_idle), as this process's network namespace
    sees them; {} where they cannot be read (not Linux)."""
    out: dict[str, Any] = {}
    base = Path("/proc/sys/net/ipv4")
    with contextlib.suppress(OSError):
        out["congestion_control"] = (base / "tcp_congestion_control").read_text().strip()
    with contextlib.suppress(OSError, ValueError):
        out["slow_start_after_idle"] = int((base / "tcp_slow_start_after_idle").read_text())
    return out


def device_name(endpoint: str, index: int) -> str:
    """oallama's name of a server's device (see oallama.runtime.devices): RPC[ep], RPC[ep]#1, ..."""
    return f"RPC[{endpoint}]" if index == 0 else f"RPC[{endpoint}]#{index}"


def probe_device(endpoint: str, opts: ProbeOptions, progress: Any = None) -> list[dict[str, Any]]:
    """Every device of one rpc-server: memory (GET_DEVICE_MEMORY, the query llama.cpp's RPC
    backend makes), link and compute, over one connection of our own. The server is not
    registered with ggml here: ggml aborts the process on a server it cannot reach later."""
    say = progress or (lambda msg: None)
    out: list[dict[str, Any]] = []
    with RpcClient(endpoint, timeout=opts.timeout_s) as client:
        count = client.device_count()
        say(f"  {endpoint}: RPC protocol {'.'.join(map(str, client.version))}, {count} device(s)")
        link: dict[str, Any] | None = None
        for index in range(count):
            name = device_name(endpoint, index)
            free, total = client.device_memory(index)
            say(f"  {name}: {free / MIB:.0f} MiB free of {total / MIB:.0f} MiB")
            if link is None:
                say(f"  {name}: link, {opts.samples} x {opts.payload_bytes / MIB:g} MiB each way ...")
                link = measure_link(client, opts, index)
                loss = link["loss_sample"]
                sample = f" over {loss['segments_sent']} segments" if isinstance(loss, dict) else ""
                say(f"    rtt {link['rtt_s'] * 1e3:.2f} ms, up {link['bandwidth_up_Bps'] * 8 / 1e6:.1f} Mbit/s, "
                    f"down {link['bandwidth_down_Bps'] * 8 / 1e6:.1f} Mbit/s, jitter {link['jitter_s'] * 1e3:.2f} ms, "
                    f"loss {link['loss'] * 100:.2f}%{sample}")
            say(f"  {name}: compute ...")
            comp = measure_compute(client, opts, link, index, say)
            out.append({"name": name, "endpoint": endpoint, "index": index, "memory_free": free, "memory_total": total,
                        **comp, "link": link})
    return out


def probe(endpoints: Sequence[str], opts: ProbeOptions | None = None, *, client: bool = True,
          progress: Any = None) -> dict[str, Any]:
    """The devices document (schema oallama.devices/1) for these rpc-servers, in this order."""
    opts = opts or ProbeOptions()
    say = progress or (lambda msg: None)
    t0 = time.time()
    for ep in endpoints:  # fail early, naming the endpoint, before measuring anything
        devmod.probe_endpoint(ep)
    doc: dict[str, Any] = {"schema": DEVICES_SCHEMA, "created": t0, "host": platform.node(),
                           "probe": {k: v for k, v in asdict(opts).items() if k != "timeout_s"}, "devices": []}
    if client:
        say("client CPU: matmul ...")
        doc["client"] = measure_client(opts)
    doc.setdefault("client", {})["tcp"] = tcp_settings()
    for k, ep in enumerate(endpoints):
        say(f"[{k + 1}/{len(endpoints)}] {ep}")
        doc["devices"].extend(probe_device(ep, opts, say))
    doc["elapsed_s"] = time.time() - t0
    doc["note"] = ("device 0 (block 0's device in every plan) is the first device listed; latency_s is half the "
                   "round trip; loss counts TCP retransmissions client->device")
    return doc


# --- CLI ------------------------------------------------------------------------------------


_DEFAULT = ProbeOptions()  # the command's defaults are the probe's


@dataclass
class ProbeCommand:
    """Everything `oallama probe` takes (its flags are generated from these fields)."""

    endpoints: list[str] = option(positional=True, metavar="HOST:PORT", help="rpc-servers; the first is device 0")
    output: Path | None = option(None, short="-o", help="devices file to write", default_help="stdout")
    payload_mib: float = option(_DEFAULT.payload_bytes / MIB, help="fixed payload size, MiB")
    samples: int = option(_DEFAULT.samples, help="payloads each way")
    rtt_samples: int = option(_DEFAULT.rtt_samples, help="1-byte round trips")
    matmul_size: int = option(_DEFAULT.matmul_k, help="q8_0 weight of the compute probe, N x N")
    tokens: list[int] = option(list(_DEFAULT.tokens), help="activation columns to time")
    client_threads: int | None = option(_DEFAULT.client_threads, help="threads of the client CPU probe",
                                        default_help="llama-cpp's")
    client: bool = option(True, help="probe the client CPU too (--no-client: skip it)")
    timeout: float = option(_DEFAULT.timeout_s, help="per network operation, s")

    def probe_options(self) -> ProbeOptions:
        return replace(_DEFAULT, payload_bytes=int(self.payload_mib * MIB), samples=self.samples,
                       rtt_samples=self.rtt_samples, matmul_k=self.matmul_size, matmul_m=self.matmul_size,
                       tokens=tuple(sorted(set(self.tokens))), client_threads=self.client_threads,
                       timeout_s=self.timeout)


def _cmd_probe(args: argparse.Namespace) -> int:
    c = from_args(ProbeCommand, args)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    doc = probe(c.endpoints, c.probe_options(), client=c.client, progress=say)
    text = json.dumps(doc, indent=1) + "\n"
    if c.output:
        c.output.write_text(text)
        say(f"wrote {c.output} ({len(doc['devices'])} devices, {doc['elapsed_s']:.1f} s)")
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="measure rpc-server devices and links (devices file for `distribute`)")
    add_arguments(p, ProbeCommand)
    p.set_defaults(func=_cmd_probe)
