"""Each weight matmul shape's share of a pass, from its times in the real graph (calibration).

The one-op profile times each weight matmul alone, and its errors depend on the shape: on the
project's VM its decode times of llama3-8b's 4096x14336 FFN matrices were 1.7x what the same ops
took in the real graph, its attention and output matrices 0.9x, and the next profiling timed that FFN
matrix at 1505 us where the first had 2569 (bench/results/2026-11-24-vm-turns/shapes_*.txt). One factor per pass size over all matmuls (the
calibration's anchors) fits a pass that runs every shape, but misprices a placement that splits
shapes between devices: the 8B with each layer's FFN on an rpc-server had its host turns (attention)
predicted 1.3x fast, its output matrix 1.24x. The calibration times every node of a pass alone, and
where those times are well above the noise of timing a node alone (a view's p10-p90: 4 us on the CPU,
0.7 ms on a loopback rpc-server; over sqrt(nodes timed)) each shape keeps its own ratio of real-graph to
one-op time; the others share their pooled ratio. The shares are relative to the pass size's
ratio over all its matmuls, so they move time between shapes and leave the pass's total (fixed by
its measured splits) as it was.

    >>> sh = fit_shares([(point, one_op_us), ...], h_us=5.0, noise_us=2.0)
    >>> share(sh, class_key("MUL_MAT", "q4_K", (4096, 14336)), n_tokens=1)   # 0.78
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

RELIABLE = 4.0  # a shape's median time alone (less the overhead) over the noise of its median (the noise of
# timing a node alone over sqrt(nodes timed)), at least: below it the shape's ratio is that noise
POOLED = "*"  # the shapes without a reliable ratio of their own


def class_key(op: str, weight_type: str, shape: Sequence[int]) -> str:
    """A weight matmul's shape class: op, weight type, weight shape (trailing 1s trimmed)."""
    dims = list(shape)
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    return f"{op}:{weight_type}:{'x'.join(map(str, dims))}"


def fit_shares(timed: Sequence[tuple[Mapping[str, Any], float]], h_us: float,
               noise_us: float) -> dict[int, dict[str, float]]:
    """n_tokens -> shape class -> its real-graph / one-op ratio over the pass size's ratio of all its
    weight matmuls (POOLED: the shapes timed too close to the noise, together). `timed`: one device's
    timed weight matmuls (calibration points) with their one-op compute time (us); h_us what timing
    a node alone adds, noise_us how much that varies."""
    real: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    prof: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p, t in timed:
        if t <= 0:
            continue
        n, k = int(p["n_tokens"]), class_key(p["op"], p["weight_type"], p["src0_ne"])
        real[n][k].append(max(float(p["us"]) - h_us, 0.0))
        prof[n][k] += t
    out: dict[int, dict[str, float]] = {}
    for n, classes in real.items():
        r_all = sum(sum(v) for v in classes.values())
        p_all = sum(prof[n].values())
        if r_all <= 0 or p_all <= 0:
            continue
        g = r_all / p_all
        # a median over n nodes varies ~1/sqrt(n) as much as one node's time
        own = {k: v for k, v in classes.items() if statistics.median(v) >= RELIABLE * noise_us / math.sqrt(len(v))}
        shares = {k: sum(v) / prof[n][k] / g for k, v in own.items()}
        r_rest = sum(sum(v) for k, v in classes.items() if k not in own)
        p_rest = sum(t for k, t in prof[n].items() if k not in own)
        if own and p_rest > 0:
            shares[POOLED] = r_rest / p_rest / g
        if own:
            out[n] = shares
    return out


def share(shares: Mapping[int, Mapping[str, float]], key: str, n_tokens: int | None) -> float:
    """The shape's share at a pass of n_tokens: between timed sizes interpolated on log tokens,
    beyond them the nearest size's; 1 where the calibration has none."""
    if n_tokens is None or not shares:
        return 1.0
    by = {n: s.get(key, s.get(POOLED, 1.0)) for n, s in shares.items()}
    return interpolated(by, n_tokens)


def interpolated(by_size: Mapping[int, float], n_tokens: int | None) -> float:
    """A per-pass-size factor for a pass of n_tokens: between two timed sizes, interpolated on a log
    scale of tokens; beyond them, the nearest one's; 1 with none."""
    if n_tokens is None or not by_size:
        return 1.0
    sizes = sorted(by_size)
    if n_tokens <= sizes[0] or n_tokens >= sizes[-1]:
        return by_size[sizes[0] if n_tokens <= sizes[0] else sizes[-1]]
    hi = next(n for n in sizes if n >= n_tokens)
    lo = max(n for n in sizes if n < n_tokens)
    t = (math.log(n_tokens) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return by_size[lo] + t * (by_size[hi] - by_size[lo])
