"""oallama.collective.allreduce: all-reduce across the ranks of several hosts (seed 001: the
communication-tree all-reduce), and the lifetime of a rank's process groups.

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
``ring``  the transport's own all-reduce (gloo's ring: reduce-scatter + all-gather, rank r sending
          2(p-1)S segments of ~n/(pS) floats to r-1, S >= 2 segments per rank; see ring_sends).
``star``  a parameter server: every rank sends its n floats to rank 0, which sums and sends the
          result back to every rank (2(p-1) messages of n floats, all through rank 0).

Counters (``Counters``, in oallama.collective.topology) are per rank, for the messages that rank
*sends*; summing them over the ranks gives the job's totals. Tree and star messages are
point-to-point sends made here and are counted as they are made; the ring's are gloo-internal and
are taken from gloo's ring schedule (``modelled_msgs`` says how many). Tests check all three
against the TCP payload the kernel counted on the ranks' sockets (oallama.collective.wire).

Lifetime: gloo runs collectives on its own C++ threads, which drop their references to the
tensors (and through them to Python objects) when an operation ends. A thread that does so while
the interpreter is finalizing is killed inside a noexcept destructor by CPython's take_gil, and the
process aborts ("terminate called without an active exception"). So every process group is
destroyed, and gloo's threads joined, before finalization: ``Collective.close`` destroys the groups
it made, ``shutdown`` the rest (``init_from_env`` registers it with atexit).

torch is imported only when a process group is made (``pip install oallama[tp]``).

Processes: ``launch`` starts one process per rank (optionally inside per-host network namespaces)
and ``init_from_env`` turns such a process into a member of the job.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import CollectiveError
from .topology import ALGORITHMS, Counters, Topology, expected_counts, ring_sends
from .topology import F32 as _F32

__all__ = [
    "ALGORITHMS",
    "Collective",
    "CollectiveOptions",
    "Counters",
    "Topology",
    "expected_counts",
    "init_from_env",
    "native_available",
    "require_torch",
    "shutdown",
]

# environment of a rank process (set by launch, read by init_from_env)
ENV_RANK, ENV_HOSTS, ENV_JOB = "OALLAMA_RANK", "OALLAMA_HOSTS", "OALLAMA_JOB"


def require_torch() -> None:
    """Raise CollectiveError (with the install hint) unless torch.distributed can be imported: a
    launcher calls it before starting ranks that would all fail on it."""
    _torch()


def _torch() -> tuple[Any, Any]:
    """(torch, torch.distributed), or a CollectiveError that says how to get them."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise CollectiveError("oallama.collective needs torch (torch.distributed with gloo) for its process "
                              f"groups: pip install 'oallama[tp]' ({e})") from None
    if not dist.is_available():
        raise CollectiveError(f"this torch ({torch.__version__}) was built without torch.distributed")
    return torch, dist


def native_available() -> bool:
    """True when the shared-memory module oallama._collective is built."""
    try:
        from .. import _collective  # noqa: F401
    except ImportError:
        return False
    return True


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
        torch, dist = _torch()
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
        # every rank a local master (one rank per host): the LM group is the world; use the world's
        # transport context rather than a second one over the same ranks (measured: the second one's
        # small messages cost more, see bench/results/2026-11-23-vm-allreduce)
        if list(topo.local_masters) == list(range(topo.world_size)):
            self.lm_group = dist.group.WORLD
        else:
            self.lm_group = dist.new_group(topo.local_masters)
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
        _live.add(self)

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
        """Release what this Collective holds: the CUDA stage, the shared-memory segment and the
        process groups it made. Those are destroyed, which joins their gloo threads now, while the
        interpreter is alive (see the module docstring). Every rank calls it after its last
        operation; the default group stays (``shutdown``). Idempotent."""
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        world = self._dist.group.WORLD
        groups = [*self.host_groups, *([self.lm_group] if self.lm_group is not world else [])]  # the world stays
        self.host_groups, self.host_group, self.lm_group = [], None, None
        _destroy_groups(self._dist, groups)
        _live.discard(self)

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
        if len(self.local_ranks) == 1:  # alone on its host: no intra-host stage, only (2)-(3), in
            # the chunks the other hosts' segments take (the same slot size everywhere)
            cap = int(self.shm.capacity) if self.shm is not None else max(flat.size, 1)
            t0 = time.perf_counter()
            for c0 in range(0, max(flat.size, 1), cap) if len(lms) > 1 else ():
                self._inter_host(flat[c0 : c0 + cap], up, down)
            self.counters.stage_inter_seconds += time.perf_counter() - t0
            return
        if self.shm is None:  # intra-host stage over the transport (p2p to/from the LM)
            if up:
                self._gather_sum(flat, self.lm, self.local_ranks, self.host_group)
            if is_lm and len(lms) > 1:
                self._inter_host(flat, up, down)
            if down:
                self._scatter_copy(flat, self.lm, self.local_ranks, self.host_group)
            return
        cap = int(self.shm.capacity)
        c = self.counters
        for c0 in range(0, max(flat.size, 1), cap):
            part = flat[c0 : c0 + cap]
            t0 = time.perf_counter()
            if up:
                self.shm.reduce(part)  # (1) the host's sum in the segment's result area
                c.shm_bytes += part.nbytes
            else:  # broadcast only: nobody may still be reading the previous result
                self.shm.barrier()
                if self.rank == self.gm:
                    self.shm.write(part)
                    c.shm_bytes += part.nbytes
            t1 = time.perf_counter()
            if is_lm and len(lms) > 1:
                # the LMs exchange the segment directly: (2) up, (3) down
                self._inter_host(self.shm.result_view(part.size), up, down)
            t2 = time.perf_counter()
            self.shm.barrier()  # the LM is done with (2)-(3)
            if down or self.rank == self.gm:
                self.shm.read(part)  # (4)
            c.stage_intra_up_seconds += t1 - t0
            c.stage_inter_seconds += t2 - t1
            c.stage_intra_down_seconds += time.perf_counter() - t2

    def _inter_host(self, buf: np.ndarray, up: bool, down: bool) -> None:
        """Stages (2)-(3) on a local master: hosts-1 messages up to the GM, hosts-1 down; for an
        all-reduce of more than pipeline_bytes, in pipelined chunks (k chunks: k times that). Two
        hosts (an all-reduce, not pipelined) swap their sums in one message each way, at once."""
        lms, group = self.topo.local_masters, self.lm_group
        step = self.options.pipeline_bytes // _F32 if self.options.pipeline_bytes > 0 else buf.size
        chunks = [(a, min(buf.size, a + max(step, 1))) for a in range(0, buf.size, max(step, 1))]
        if up and down and len(lms) == 2 and len(chunks) <= 1:
            # two hosts, not pipelined: the local masters swap their sums at once, one message each
            # way with both directions of the link busy together, instead of up to the GM and then
            # back down (the same messages and bytes, half the time once the link is the limit).
            # a + b == b + a exactly in IEEE arithmetic: both hosts hold the same bits.
            other = lms[1] if self.rank == lms[0] else lms[0]
            theirs = np.empty_like(buf)
            works = [self._recv(theirs, other, group), self._send(buf, other, group)]
            for w in works:
                w.wait()
            buf += theirs
            return
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
        # what gloo's ring sent (its messages are internal to gloo): its schedule, to rank-1
        p = self.topo.world_size
        left = (self.rank - 1) % p
        c = self.counters
        for nbytes in ring_sends(flat.size, p, self.rank):
            if self.topo.crosses(self.rank, left):
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
_live: weakref.WeakSet[Collective] = weakref.WeakSet()  # open Collectives of this process (shutdown closes them)


def _destroy_groups(dist: Any, groups: Sequence[Any]) -> None:
    """Destroy these process groups (None and groups this rank is not in are skipped). Dropping
    the last reference joins a gloo group's worker and I/O threads; the GIL is released meanwhile
    (torch's process-group destructor does that), so a worker that frees a tensor can take it."""
    if not dist.is_initialized():
        return
    for g in groups:
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


def _check_f32(x: np.ndarray) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
        raise TypeError("collectives take C-contiguous float32 numpy arrays")


class CudaIpcStage:
    """Tree all-reduce of CUDA tensors: intra-host by a kernel that reads the host's peer buffers
    over CUDA IPC (oallama._collective_cuda), inter-host over NCCL point-to-point between the LMs.
    Host-side ordering uses the CPU module's shared-memory barrier. Buffers hold capacity f32."""

    def __init__(self, coll: Collective, capacity: int = 4 << 20) -> None:
        from .. import _collective_cuda as cc

        torch = coll._torch
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
        nccl, self.nccl = self.nccl, None
        _destroy_groups(self.coll._dist, [nccl])


# --------------------------------------------------------------------------------------------
# processes: launch ranks, join a job
# --------------------------------------------------------------------------------------------


def init_from_env(options: CollectiveOptions | None = None) -> Collective:
    """Join the job described by the environment that ``launch`` set (MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE, OALLAMA_RANK, OALLAMA_HOSTS, OALLAMA_JOB) and return this rank's Collective.
    The first call makes the default process group and registers ``shutdown`` with atexit."""
    torch, dist = _torch()
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
        global _atexit_registered
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    return Collective(topo, rank, options, job=job)


_atexit_registered = False


def shutdown() -> None:
    """Leave the job: close every open Collective of this process and destroy all of
    torch.distributed's process groups, joining gloo's threads while the interpreter is alive.
    Call it (every rank) after the last operation; init_from_env also registers it with atexit,
    for a process that ends otherwise. Idempotent; a no-op where torch was never imported."""
    for c in list(_live):
        c.close()
    if "torch" not in sys.modules:
        return
    _, dist = _torch()
    if dist.is_initialized():
        dist.destroy_process_group()
