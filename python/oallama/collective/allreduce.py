"""oallama.collective.allreduce: all-reduce across the ranks of several hosts, and the counters to judge it.

Three algorithms behind one API (``Collective.all_reduce``), all over torch.distributed (gloo on
CPU hosts, NCCL for the inter-host stage on GPU hosts); nothing here opens a socket itself.

``tree``  the communication tree of seed 001. Each host has a local master (LM, its lowest rank);
          the LM of rank 0's host is the global master (GM).
            (1) ranks -> LM   intra-host: a shared-memory reduction (oallama._collective) in which
                              the L local ranks each sum a 1/L share of the L buffers
            (2) LMs -> GM     inter-host: hosts-1 point-to-point messages of n floats
            (3) GM -> LMs     inter-host: hosts-1 messages back
                              (an all-reduce larger than pipeline_bytes goes in chunks, the GM
                              sending chunk k down while chunk k+1 comes up: a link's two
                              directions busy at once, k times the messages, the same bytes)
            (4) LM -> ranks   intra-host: every rank copies the shared result
          On GPU hosts stage 1 is a CUDA kernel reading the peers' buffers over IPC
          (oallama._collective_cuda; see CudaIpcStage).
``ring``  the transport's own all-reduce (gloo: ring reduce-scatter + all-gather, 2(p-1) steps of
          n/p floats per rank, rank r sending to r+1).
``star``  a parameter server: every rank sends its n floats to rank 0, which sums and sends the
          result back to every rank (2(p-1) messages of n floats, all through rank 0).

Counters (``Counters``) are per rank, for the messages that rank *sends*; summing them over the
ranks gives the job's totals. Tree and star messages are point-to-point sends made here and are
counted exactly; the ring's are gloo-internal and are counted from gloo's ring schedule
(``modelled_msgs`` says how many). The network-namespace benchmark measures the inter-host bytes
on the wire as well (scripts/netns_hosts.py reads the veth counters).

Processes: ``launch`` starts one process per rank (optionally inside per-host network namespaces)
and ``init_from_env`` turns such a process into a member of the job.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import CollectiveError

__all__ = [
    "ALGORITHMS",
    "Collective",
    "CollectiveOptions",
    "Counters",
    "Topology",
    "expected_counts",
    "init_from_env",
    "native_available",
]

ALGORITHMS = ("tree", "ring", "star")
_F32 = 4  # bytes per element

# environment of a rank process (set by launch, read by init_from_env)
ENV_RANK, ENV_HOSTS, ENV_JOB = "OALLAMA_RANK", "OALLAMA_HOSTS", "OALLAMA_JOB"


def native_available() -> bool:
    """True when the shared-memory module oallama._collective is built."""
    try:
        from .. import _collective  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# topology and counters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Which host each rank runs on. host_of[r] is rank r's host id (0..hosts-1)."""

    host_of: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.host_of:
            raise ValueError("a topology needs at least one rank")
        ids = sorted(set(self.host_of))
        if ids != list(range(len(ids))):
            raise ValueError(f"host ids must be 0..hosts-1, got {sorted(set(self.host_of))}")

    @classmethod
    def uniform(cls, hosts: int, ranks_per_host: int) -> Topology:
        """hosts x ranks_per_host, ranks of a host contiguous: host_of = 0,0,1,1 for 2 x 2."""
        if hosts < 1 or ranks_per_host < 1:
            raise ValueError(f"need hosts >= 1 and ranks_per_host >= 1, got {hosts} x {ranks_per_host}")
        return cls(tuple(r // ranks_per_host for r in range(hosts * ranks_per_host)))

    @classmethod
    def parse(cls, text: str) -> Topology:
        """'0,0,1,1' -> Topology((0, 0, 1, 1))."""
        return cls(tuple(int(x) for x in text.split(",")))

    @property
    def world_size(self) -> int:
        return len(self.host_of)

    @property
    def n_hosts(self) -> int:
        return max(self.host_of) + 1

    def ranks_on(self, host: int) -> list[int]:
        return [r for r, h in enumerate(self.host_of) if h == host]

    def local_master(self, host: int) -> int:
        return self.ranks_on(host)[0]

    @property
    def local_masters(self) -> list[int]:
        return [self.local_master(h) for h in range(self.n_hosts)]

    @property
    def global_master(self) -> int:
        return self.local_master(self.host_of[0])

    def local_rank(self, rank: int) -> int:
        return self.ranks_on(self.host_of[rank]).index(rank)

    def crosses(self, a: int, b: int) -> bool:
        return self.host_of[a] != self.host_of[b]

    def __str__(self) -> str:
        return ",".join(map(str, self.host_of))


@dataclass
class Counters:
    """What one rank sent, summed over calls. Bytes are payload bytes (no headers)."""

    allreduce_calls: int = 0
    allreduce_elements: int = 0  # f32 elements all-reduced, summed over calls
    allreduce_seconds: float = 0.0  # wall time inside all_reduce
    inter_msgs: int = 0  # messages this rank sent to another host
    inter_bytes: int = 0
    intra_msgs: int = 0  # transport messages this rank sent within its host
    intra_bytes: int = 0
    shm_bytes: int = 0  # bytes this rank wrote into the host's shared-memory segment
    modelled_msgs: int = 0  # of the messages above, those counted from a schedule (ring)
    other_calls: int = 0  # reduce/broadcast/all_gather/barrier calls (head, Megatron mode)
    other_seconds: float = 0.0

    def add(self, other: Counters) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_counts(algorithm: str, topo: Topology, n: int, pipeline_bytes: int = 0) -> dict[str, int]:
    """Job totals of one all-reduce of n f32 elements: inter-host messages and bytes.

    tree: 2 (hosts-1) messages of n (times the number of pipeline chunks, if pipelined);
    ring (gloo): every rank sends 2(p-1) chunks of ~n/p to its right neighbour, the edges that
    cross hosts carry them; star: every rank off rank 0's host sends n and receives n.
    """
    p, H = topo.world_size, topo.n_hosts
    if algorithm == "tree":
        k = -(-n * _F32 // pipeline_bytes) if pipeline_bytes > 0 and n > 0 else 1
        return {"inter_msgs": 2 * (H - 1) * k, "inter_bytes": 2 * (H - 1) * n * _F32}
    if algorithm == "ring":
        msgs = nbytes = 0
        for r in range(p):
            if topo.crosses(r, (r + 1) % p):
                for step in range(2 * (p - 1)):
                    msgs += 1
                    nbytes += _ring_chunk(n, p, (r - step) % p) * _F32
        return {"inter_msgs": msgs, "inter_bytes": nbytes}
    if algorithm == "star":
        off = sum(1 for r in range(p) if topo.crosses(r, 0))
        return {"inter_msgs": 2 * off, "inter_bytes": 2 * off * n * _F32}
    raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")


def _ring_chunk(n: int, p: int, i: int) -> int:
    """Elements of chunk i when n is cut into p near-equal chunks."""
    return n // p + (1 if i < n % p else 0)


# --------------------------------------------------------------------------------------------
# the collective
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveOptions:
    algorithm: str = "tree"  # tree | ring | star
    intra: str = "auto"  # tree's stage 1/4: auto (shm if built) | shm | transport
    shm_slot_bytes: int = 16 << 20  # bytes per rank in the host segment; larger calls are chunked
    # tree stages (2)+(3) of an all-reduce go in chunks of this many bytes, pipelined: the GM sends
    # chunk k down while chunk k+1 comes up, so both directions of a link carry data at once.
    # 0: one message of n floats each way (exactly hosts-1 messages up and down).
    pipeline_bytes: int = 0
    timeout_s: float = 120.0  # per barrier / transport operation
    device: str = "cpu"  # cpu | cuda (cuda: CUDA IPC intra-host stage, NCCL inter-host)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; valid: {', '.join(ALGORITHMS)}")
        if self.intra not in ("auto", "shm", "transport"):
            raise ValueError(f"intra must be auto, shm or transport, not {self.intra!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, not {self.device!r}")


class Collective:
    """All-reduce and friends for one rank of a job. torch.distributed must be initialised
    (``init_from_env`` does both). Every rank must make the same calls in the same order."""

    def __init__(self, topo: Topology, rank: int, options: CollectiveOptions | None = None,
                 job: str = "job") -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        global _instances
        _instances += 1  # the same on every rank: all ranks build their collectives in one order
        if not dist.is_initialized():
            raise CollectiveError("torch.distributed is not initialised (use collective.init_from_env)")
        if dist.get_world_size() != topo.world_size:
            raise CollectiveError(f"topology {topo} has {topo.world_size} ranks, the job {dist.get_world_size()}")
        self.topo, self.rank, self.options = topo, rank, options or CollectiveOptions()
        self.host = topo.host_of[rank]
        self.local_rank = topo.local_rank(rank)
        self.local_ranks = topo.ranks_on(self.host)
        self.lm = topo.local_master(self.host)
        self.gm = topo.global_master
        self.counters = Counters()
        # every rank creates every group, in the same order (torch.distributed's rule)
        self.host_groups = [dist.new_group(topo.ranks_on(h)) for h in range(topo.n_hosts)]
        self.host_group = self.host_groups[self.host]
        self.lm_group = dist.new_group(topo.local_masters)
        self._nccl_lm_group = None
        self.shm = None
        self._cuda: CudaIpcStage | None = None
        intra = self.options.intra
        if intra == "auto":
            intra = "shm" if native_available() else "transport"
        if intra == "shm" and not native_available():
            raise CollectiveError("intra='shm' needs oallama._collective (rebuild: bash scripts/setup.sh)")
        self.intra = intra
        if (self.options.algorithm == "tree" and intra == "shm") or self.options.device == "cuda":
            from .. import _collective

            slot = self.options.shm_slot_bytes if self.options.device == "cpu" else 4096
            self.shm = _collective.ShmGroup(f"/oallama-{job}-{_instances}-h{self.host}", self.local_rank,
                                            len(self.local_ranks), slot, self.options.timeout_s)
        if self.options.device == "cuda":
            self._cuda = CudaIpcStage(self)

    # --- public API ---------------------------------------------------------------------------

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """x <- sum of every rank's x, in place; x is a C-contiguous float32 array. Returns x."""
        _check_f32(x)
        t0 = time.perf_counter()
        flat = x.reshape(-1)
        alg = self.options.algorithm
        if alg == "tree":
            self._tree(flat)
        elif alg == "ring":
            self._ring(flat)
        else:
            self._star(flat)
        c = self.counters
        c.allreduce_calls += 1
        c.allreduce_elements += flat.size
        c.allreduce_seconds += time.perf_counter() - t0
        return x

    def reduce(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        """x on `root` <- sum of every rank's x (other ranks' x is left undefined)."""
        _check_f32(x)
        t0 = time.perf_counter()
        flat = x.reshape(-1)
        if self.options.algorithm == "tree" and root == self.gm:
            self._tree(flat, down=False)
        elif self.options.algorithm == "star" and root == 0:
            self._star(flat, down=False)
        else:
            self._dist.reduce(self._torch.from_numpy(flat), dst=root)
        self._other(t0)
        return x

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        """x <- root's x on every rank."""
        _check_f32(x)
        t0 = time.perf_counter()
        flat = x.reshape(-1)
        if self.options.algorithm == "tree" and root == self.gm:
            self._tree(flat, up=False)
        elif self.options.algorithm == "star" and root == 0:
            self._star(flat, up=False)
        else:
            self._dist.broadcast(self._torch.from_numpy(flat), src=root)
        self._other(t0)
        return x

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """[world, *x.shape]: every rank's x (the transport's own all-gather, for every algorithm)."""
        _check_f32(x)
        t0 = time.perf_counter()
        torch = self._torch
        out = np.empty((self.topo.world_size, *x.shape), np.float32)
        self._dist.all_gather(list(torch.from_numpy(out).unbind(0)), torch.from_numpy(x))
        self._other(t0)
        return out

    def barrier(self) -> None:
        t0 = time.perf_counter()
        self._dist.barrier()
        self._other(t0)

    def close(self) -> None:
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        if self.shm is not None:
            self.shm.close()
            self.shm = None

    # --- algorithms ---------------------------------------------------------------------------

    def _other(self, t0: float) -> None:
        self.counters.other_calls += 1
        self.counters.other_seconds += time.perf_counter() - t0

    def _send(self, buf: np.ndarray, dst: int, group: Any) -> Any:
        c = self.counters
        if self.topo.crosses(self.rank, dst):
            c.inter_msgs += 1
            c.inter_bytes += buf.nbytes
        else:
            c.intra_msgs += 1
            c.intra_bytes += buf.nbytes
        return self._dist.isend(self._torch.from_numpy(buf), dst=dst, group=group)

    def _recv(self, buf: np.ndarray, src: int, group: Any) -> Any:
        return self._dist.irecv(self._torch.from_numpy(buf), src=src, group=group)

    def _gather_sum(self, buf: np.ndarray, root: int, members: Sequence[int], group: Any) -> None:
        """buf on root <- sum over members (point-to-point; root receives len(members)-1)."""
        if self.rank == root:
            others = [m for m in members if m != root]
            tmp = np.empty((len(others), buf.size), np.float32)
            works = [self._recv(tmp[i], m, group) for i, m in enumerate(others)]
            for w in works:
                w.wait()
            for row in tmp:
                buf += row
        elif self.rank in members:
            self._send(buf, root, group).wait()

    def _scatter_copy(self, buf: np.ndarray, root: int, members: Sequence[int], group: Any) -> None:
        """buf on every member <- root's buf (root sends len(members)-1 messages)."""
        if self.rank == root:
            works = [self._send(buf, m, group) for m in members if m != root]
            for w in works:
                w.wait()
        elif self.rank in members:
            self._recv(buf, root, group).wait()

    def _tree(self, flat: np.ndarray, up: bool = True, down: bool = True) -> None:
        if self._cuda is not None:
            raise CollectiveError("device='cuda': use all_reduce_cuda(tensor) for CUDA tensors")
        lms, is_lm = self.topo.local_masters, self.rank == self.lm
        if self.shm is None:  # intra-host stage over the transport (p2p to/from the LM)
            if up:
                self._gather_sum(flat, self.lm, self.local_ranks, self.host_group)
            if is_lm and len(lms) > 1:
                self._inter_host(flat, up, down)
            if down:
                self._scatter_copy(flat, self.lm, self.local_ranks, self.host_group)
            return
        cap = int(self.shm.capacity)
        for c0 in range(0, max(flat.size, 1), cap):
            part = flat[c0 : c0 + cap]
            if up:
                self.shm.reduce(part)  # (1) the host's sum in the segment's result area
                self.counters.shm_bytes += part.nbytes
            else:  # broadcast only: nobody may still be reading the previous result
                self.shm.barrier()
                if self.rank == self.gm:
                    self.shm.write(part)
                    self.counters.shm_bytes += part.nbytes
            if is_lm and len(lms) > 1:
                # the LMs exchange the segment directly: (2) up, (3) down
                self._inter_host(self.shm.result_view(part.size), up, down)
            self.shm.barrier()  # the LM is done with (2)-(3)
            if down or self.rank == self.gm:
                self.shm.read(part)  # (4)

    def _inter_host(self, buf: np.ndarray, up: bool, down: bool) -> None:
        """Stages (2)-(3) on a local master: hosts-1 messages up to the GM, hosts-1 down; for an
        all-reduce of more than pipeline_bytes, in pipelined chunks (k chunks: k times that)."""
        lms, group = self.topo.local_masters, self.lm_group
        step = self.options.pipeline_bytes // _F32 if self.options.pipeline_bytes > 0 else buf.size
        chunks = [(a, min(buf.size, a + max(step, 1))) for a in range(0, buf.size, max(step, 1))]
        if not (up and down) or len(chunks) <= 1:
            if up:
                self._gather_sum(buf, self.gm, lms, group)
            if down:
                self._scatter_copy(buf, self.gm, lms, group)
            return
        if self.rank == self.gm:
            others = [m for m in lms if m != self.gm]
            tmp = np.empty((len(others), buf.size), np.float32)
            # every receive posted at once (gloo matches a pair's messages in order)
            recvs = [[self._recv(tmp[j, a:b], m, group) for j, m in enumerate(others)] for a, b in chunks]
            sends = []
            for (a, b), works in zip(chunks, recvs, strict=True):
                for w in works:
                    w.wait()
                for j in range(len(others)):
                    buf[a:b] += tmp[j, a:b]
                sends += [self._send(buf[a:b], m, group) for m in others]  # chunk k down, k+1 still coming up
            for w in sends:
                w.wait()
        else:
            out = np.empty_like(buf)
            works = [self._send(buf[a:b], self.gm, group) for a, b in chunks]
            works += [self._recv(out[a:b], self.gm, group) for a, b in chunks]
            for w in works:
                w.wait()
            buf[:] = out

    def _ring(self, flat: np.ndarray) -> None:
        self._dist.all_reduce(self._torch.from_numpy(flat))
        # gloo's ring: reduce-scatter + all-gather, each rank sends 2(p-1) chunks to its right
        p = self.topo.world_size
        if p == 1:
            return
        right = (self.rank + 1) % p
        c = self.counters
        for step in range(2 * (p - 1)):
            nbytes = _ring_chunk(flat.size, p, (self.rank - step) % p) * _F32
            if self.topo.crosses(self.rank, right):
                c.inter_msgs += 1
                c.inter_bytes += nbytes
            else:
                c.intra_msgs += 1
                c.intra_bytes += nbytes
            c.modelled_msgs += 1

    def _star(self, flat: np.ndarray, up: bool = True, down: bool = True) -> None:
        everyone = list(range(self.topo.world_size))
        world = self._dist.group.WORLD
        if up:
            self._gather_sum(flat, 0, everyone, world)
        if down:
            self._scatter_copy(flat, 0, everyone, world)

    # --- GPU ----------------------------------------------------------------------------------

    def all_reduce_cuda(self, t: Any) -> Any:
        """Tree all-reduce of a contiguous float32 CUDA tensor, in place (device='cuda' only)."""
        if self._cuda is None:
            raise CollectiveError("all_reduce_cuda needs CollectiveOptions(device='cuda')")
        t0 = time.perf_counter()
        self._cuda.all_reduce(t)
        self.counters.allreduce_calls += 1
        self.counters.allreduce_elements += t.numel()
        self.counters.allreduce_seconds += time.perf_counter() - t0
        return t


_instances = 0


def _check_f32(x: np.ndarray) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise TypeError("collectives take C-contiguous float32 numpy arrays")


class CudaIpcStage:
    """Tree all-reduce of CUDA tensors: intra-host by a kernel that reads the host's peer buffers
    over CUDA IPC (oallama._collective_cuda), inter-host over NCCL point-to-point between the LMs.
    Host-side ordering uses the CPU module's shared-memory barrier. Buffers hold capacity f32."""

    def __init__(self, coll: Collective, capacity: int = 4 << 20) -> None:
        import torch

        from .. import _collective_cuda as cc

        self.cc, self.coll, self.torch = cc, coll, torch
        self.capacity = capacity  # f32 elements per call (larger tensors are chunked)
        torch.cuda.set_device(coll.local_rank % max(1, torch.cuda.device_count()))
        self.buf = cc.IpcBuffer(capacity * _F32)
        handles: list[Any] = [None] * len(coll.local_ranks)
        coll._dist.all_gather_object(handles, self.buf.handle(), group=coll.host_group)
        self.peers = [self.buf.ptr if i == coll.local_rank else cc.open_peer(h) for i, h in enumerate(handles)]
        self.lm_ptr = self.peers[0]  # local rank 0 is the LM
        self.nccl = coll._dist.new_group(coll.topo.local_masters, backend="nccl")
        self.stage = torch.empty(capacity, dtype=torch.float32, device="cuda") if coll.rank == coll.lm else None

    def all_reduce(self, t: Any) -> None:
        cc, coll, shm = self.cc, self.coll, self.coll.shm
        assert shm is not None
        flat = t.view(-1)
        L = len(coll.local_ranks)
        lms = coll.topo.local_masters
        for c0 in range(0, flat.numel(), self.capacity):
            part = flat[c0 : c0 + self.capacity]
            n = part.numel()
            cc.copy(self.buf.ptr, part.data_ptr(), n * _F32)
            cc.synchronize()
            shm.barrier()  # every peer buffer holds its input
            per = -(-n // L)
            lo, hi = min(n, per * coll.local_rank), min(n, per * (coll.local_rank + 1))
            cc.reduce_peers(self.lm_ptr, self.peers, lo, hi)  # (1) my share of the host sum
            cc.synchronize()
            coll.counters.shm_bytes += (hi - lo) * _F32
            shm.barrier()
            if coll.rank == coll.lm and len(lms) > 1:
                assert self.stage is not None
                st = self.stage[:n]
                cc.copy(st.data_ptr(), self.lm_ptr, n * _F32)
                cc.synchronize()
                self._inter(st, lms)  # (2)-(3)
                cc.copy(self.lm_ptr, st.data_ptr(), n * _F32)
                cc.synchronize()
            shm.barrier()  # (4) the LM buffer holds the global sum
            cc.copy(part.data_ptr(), self.lm_ptr, n * _F32)
            cc.synchronize()
            shm.barrier()  # nobody overwrites the LM buffer before everyone copied it

    def _inter(self, st: Any, lms: list[int]) -> None:
        dist, coll = self.coll._dist, self.coll
        c = coll.counters
        if coll.rank == coll.gm:
            tmp = self.torch.empty((len(lms) - 1, st.numel()), dtype=st.dtype, device=st.device)
            works = [dist.irecv(tmp[i], src=m, group=self.nccl) for i, m in enumerate(m for m in lms if m != coll.gm)]
            for w in works:
                w.wait()
            st += tmp.sum(0)
            works = [dist.isend(st, dst=m, group=self.nccl) for m in lms if m != coll.gm]
            c.inter_msgs += len(works)
            c.inter_bytes += len(works) * st.numel() * _F32
            for w in works:
                w.wait()
        else:
            dist.send(st, dst=coll.gm, group=self.nccl)
            c.inter_msgs += 1
            c.inter_bytes += st.numel() * _F32
            dist.recv(st, src=coll.gm, group=self.nccl)

    def close(self) -> None:
        for i, p in enumerate(self.peers):
            if i != self.coll.local_rank:
                with contextlib.suppress(RuntimeError):
                    self.cc.close_peer(p)
        self.peers = []


# --------------------------------------------------------------------------------------------
# processes: launch ranks, join a job
# --------------------------------------------------------------------------------------------


def init_from_env(options: CollectiveOptions | None = None) -> Collective:
    """Join the job described by the environment that ``launch`` set (MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE, OALLAMA_RANK, OALLAMA_HOSTS, OALLAMA_JOB) and return this rank's Collective."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    options = options or CollectiveOptions()
    try:
        rank, topo = int(os.environ[ENV_RANK]), Topology.parse(os.environ[ENV_HOSTS])
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except KeyError as e:
        raise CollectiveError(f"not started by collective.launch: {e.args[0]} is not set") from None
    job = os.environ.get(ENV_JOB, "job")
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=topo.world_size, timeout=timedelta(seconds=options.timeout_s))
    return Collective(topo, rank, options, job=job)
