"""oallama.collective.topology: which host each rank runs on, what a rank sent, and what an
all-reduce should send (seed 001: the communication-tree all-reduce).

    Topology          host_of[r] per rank; local masters (LM) and the global master (GM)
    Counters          per-rank message and byte counters (payload only) kept by Collective
    expected_counts   the counting model: inter-host messages and payload bytes of one all-reduce
    ring_sends        gloo's ring all-reduce schedule (what the transport's own all-reduce sends)

``expected_counts`` is a model, not a measurement: tests compare it with the bytes the kernel saw
on the ranks' TCP sockets (oallama.collective.wire). No torch here: this module imports without
the ``tp`` extra.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ALGORITHMS", "F32", "Counters", "Topology", "expected_counts", "ring_sends"]

ALGORITHMS = ("tree", "ring", "star")
F32 = 4  # bytes per element: every collective here moves float32


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
    """What one rank sent, summed over calls. Bytes are payload bytes (no transport headers)."""

    allreduce_calls: int = 0
    allreduce_elements: int = 0  # f32 elements all-reduced, summed over calls
    allreduce_seconds: float = 0.0  # wall time inside all_reduce
    inter_msgs: int = 0  # messages this rank sent to another host
    inter_bytes: int = 0
    intra_msgs: int = 0  # transport messages this rank sent within its host
    intra_bytes: int = 0
    shm_bytes: int = 0  # bytes this rank wrote into the host's shared-memory segment
    modelled_msgs: int = 0  # of the messages above, those taken from ring_sends (gloo-internal)
    # tree, shared-memory path: wall seconds this rank spent in each stage, summed over calls
    stage_intra_up_seconds: float = 0.0    # (1) the host's sum in the segment (waits for the host's ranks)
    stage_inter_seconds: float = 0.0       # (2)-(3) on a local master: the inter-host exchange
    stage_intra_down_seconds: float = 0.0  # the segment barrier after (2)-(3), and (4) copying the result
    other_calls: int = 0  # reduce/broadcast/all_gather/barrier calls (head, Megatron mode)
    other_seconds: float = 0.0

    def add(self, other: Counters) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# gloo's AllreduceOptions::kMaxSegmentSize (gloo/allreduce.h): a ring message carries at most 1 MiB
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def ring_sends(n: int, p: int, rank: int, max_segment_bytes: int = GLOO_MAX_SEGMENT_BYTES) -> list[int]:
    """Payload bytes of each message `rank` sends in gloo's ring all-reduce of n f32 elements over
    p ranks (gloo/allreduce.cc, ring()); every message goes to rank-1 (mod p).

    The n*4 bytes are cut into numSegments = roundUp(max(ceil(bytes/1 MiB), 2p), p) segments of
    roundUp(ceil(bytes/numSegments), 4) bytes, S = numSegments/p per rank. Reduce-scatter and
    all-gather each send (p-1)*S segments; segments that fall past the end are not sent and the
    last one may be short. So 2(p-1)S messages of ~n/(pS) floats: for small inputs S = 2, twice
    the 2(p-1) steps of the textbook ring, with the same 2(p-1)n/p floats.
    """
    total = n * F32
    if p <= 1 or total == 0:
        return []
    max_seg = F32 * max(1, max_segment_bytes // F32)
    n_seg = _round_up(max(-(-total // max_seg), 2 * p), p)
    per_rank = n_seg // p
    seg = _round_up(-(-total // n_seg), F32)
    out: list[int] = []
    for first in ((rank + 1) * per_rank, rank * per_rank):  # reduce-scatter, then all-gather
        for i in range(n_seg - per_rank):
            length = min(seg, total - ((first + i) * seg) % (n_seg * seg))
            if length > 0:
                out.append(length)
    return out


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def expected_counts(algorithm: str, topo: Topology, n: int, pipeline_bytes: int = 0) -> dict[str, int]:
    """Job totals of one all-reduce of n f32 elements: inter-host messages and payload bytes.

    tree: 2 (hosts-1) messages of n (times the number of pipeline chunks, if pipelined);
    ring (gloo): rank r sends ring_sends(n, p, r) to r-1, the edges that cross hosts carry them;
    star: every rank off rank 0's host sends n and receives n.
    """
    p, H = topo.world_size, topo.n_hosts
    if algorithm == "tree":
        k = -(-n * F32 // pipeline_bytes) if pipeline_bytes > 0 and n > 0 else 1
        return {"inter_msgs": 2 * (H - 1) * k, "inter_bytes": 2 * (H - 1) * n * F32}
    if algorithm == "ring":
        msgs = nbytes = 0
        for r in range(p):
            if topo.crosses(r, (r - 1) % p):
                sends = ring_sends(n, p, r)
                msgs += len(sends)
                nbytes += sum(sends)
        return {"inter_msgs": msgs, "inter_bytes": nbytes}
    if algorithm == "star":
        off = sum(1 for r in range(p) if topo.crosses(r, 0))
        return {"inter_msgs": 2 * off, "inter_bytes": 2 * off * n * F32}
    raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
