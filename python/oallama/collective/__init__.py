"""All-reduce across the ranks of several hosts (seed 001: the communication-tree all-reduce)
and, in ``tp``, the tensor-parallel decoder built on it.

    topology    which host each rank is on, per-rank counters, the counting model (expected_counts)
    allreduce   tree / ring / star all-reduce behind one API; process-group lifetime (shutdown)
    wire        what the ranks sent over TCP, from the kernel's socket counters (ss)
    launch      rank processes (one per rank, optionally in network namespaces) and a self-test
    tp/         decoder (tensor-parallel llama with All-Reduce+LayerNorm), memory (layer streaming)

Importing this package needs no torch; making a process group does: `pip install 'oallama[tp]'`.
"""

from .allreduce import (
    Collective,
    CollectiveOptions,
    init_from_env,
    native_available,
    require_torch,
    shutdown,
)
from .launch import LaunchResult, free_port, launch, selftest
from .topology import ALGORITHMS, Counters, Topology, expected_counts, ring_sends

__all__ = [
    "ALGORITHMS", "Collective", "CollectiveOptions", "Counters", "LaunchResult", "Topology", "expected_counts",
    "free_port", "init_from_env", "launch", "native_available", "require_torch", "ring_sends", "selftest", "shutdown",
]
