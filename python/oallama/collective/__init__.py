"""All-reduce across the ranks of several hosts (seed 001: the communication-tree all-reduce)
and, in ``tp``, the tensor-parallel decoder built on it.

    allreduce   tree / ring / star all-reduce behind one API, topology and message counters
    launch      rank processes (one per rank, optionally in network namespaces) and a self-test
    tp/         decoder (tensor-parallel llama with All-Reduce+LayerNorm), memory (layer streaming)

torch is imported only where a process group is made: `pip install oallama[tp]`.
"""

from .allreduce import (
    ALGORITHMS,
    Collective,
    CollectiveOptions,
    Counters,
    Topology,
    expected_counts,
    init_from_env,
    native_available,
)
from .launch import LaunchResult, free_port, launch, selftest

__all__ = [
    "ALGORITHMS", "Collective", "CollectiveOptions", "Counters", "LaunchResult", "Topology", "expected_counts",
    "free_port", "init_from_env", "launch", "native_available", "selftest",
]
