"""How fast the host runs now, against a fixed reference op (issue 13).

This project's 2-core VM shares its cores with other machines: the same small-model decode ran
25-60% slower for minutes at a time (a prompt too), with no load, steal time or page fault of its
own to show for it, and a compute-bound [256, 256] matmul timed beside the decode moved with it.
A profile's times hold for the host's speed when they were taken, so the profile records a
reference op's time around its measurement, and every benchmark process times it again around its
own runs: their ratio says how far a prediction could be off because the machine, not the model,
changed.

    ref = hostspeed.measure(threads=1)   # {"n1_us": ..., "n32_us": ...}, ~30 ms
    ...
    hostspeed.ratio(ref, hostspeed.measure(threads=1))   # 1.0: as fast; 0.7: 30% slower now
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core

# a q4_K [2048, 2048] weight (2.3 MiB, in cache as a small model's are) times 1 token (a decode:
# dequantisation-bound) and 32 tokens (a prompt: compute-bound), on the CPU, repacked as loaded
REF_TYPE, REF_K, REF_M = "q4_K", 2048, 2048
REF_COLS = (1, 32)
REF_DESCRIPTION = f"CPU MUL_MAT {REF_TYPE} {REF_K}x{REF_M} at {', '.join(map(str, REF_COLS))} cols (median us)"


def measure(threads: int = 1, repeats: int = 15) -> dict[str, float]:
    """The reference op's median time at each column count: {"n1_us": us, "n32_us": us}."""
    res = _core.profile_mul_mat("CPU", REF_TYPE, REF_K, REF_M, list(REF_COLS), threads, 3, repeats, True, "", "")
    return {f"n{n}_us": float(statistics.median(r.samples_us)) for n, r in zip(REF_COLS, res, strict=True)}


def mean(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Several measurements (before and after a run) as one: each column's mean."""
    keys = [k for k in samples[0] if all(k in s for s in samples)] if samples else []
    return {k: statistics.fmean(s[k] for s in samples) for k in keys}


def ratio(ref: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> float | None:
    """How fast the host ran `now` against `ref` (> 1: faster now): the geometric mean over the
    columns both have of ref's time / now's. None when either is missing."""
    if not ref or not now:
        return None
    cols = [k for k in ref if k in now and float(ref[k]) > 0 and float(now[k]) > 0]
    if not cols:
        return None
    return math.exp(statistics.fmean(math.log(float(ref[k]) / float(now[k])) for k in cols))
