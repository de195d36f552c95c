"""How fast the machine runs now, against fixed reference ops (issue 13).

This project's 2-core VM shares its cores, caches and memory with other machines: the same
small-model decode ran 25-60% slower for minutes at a time (a prompt too), with no load, steal time
or page fault of its own to show for it. A profile's times hold for the speed the devices had when
they were taken, so the profile records reference ops' times around its measurement, on the host
and on the accelerator, and every benchmark process times them again around its own runs: their
ratio says how far a prediction could be off because the machine, not the model, changed.

    ref = hostspeed.measure_devices(threads=1, accelerator="RPC[127.0.0.1:50052]")
    # {"host": {"n1_us": ..., "n32_us": ..., "big_n1_us": ..., "launch_us": ...}, "accelerator": {...}}
    ...
    hostspeed.ratios(ref, hostspeed.measure_devices(1, "RPC[127.0.0.1:50052]"))
    # {"host": 1.0, "accelerator": 0.7}: the host as fast, the accelerator 30% slower now
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ... import _core

# q4_K weights repacked as loaded: [2048, 2048] (2.3 MiB, in a core's cache as a small model's
# layers are) times 1 token (a decode: dequantisation-bound) and 32 tokens (a prompt: compute-bound),
# and [8192, 8192] (36 MiB, past the core's caches) times 1 token (bound by the shared cache and memory)
REF_TYPE = "q4_K"
REF_OPS = {"n1_us": (2048, 1), "n32_us": (2048, 32), "big_n1_us": (8192, 1)}  # key -> (k = m, columns)
REF_DESCRIPTION = (f"MUL_MAT {REF_TYPE} " + ", ".join(f"{k}x{k} at {n} col(s)" for k, n in REF_OPS.values())
                   + " and a 1-node graph's launch (median us), on the host and on the accelerator")


def measure(device: str = "CPU", threads: int = 1, repeats: int = 15) -> dict[str, float]:
    """The reference ops' median times on `device` (us), keyed as REF_OPS."""
    out: dict[str, float] = {}
    for size in sorted({k for k, _ in REF_OPS.values()}):
        keys = [key for key, (k, _) in REF_OPS.items() if k == size]
        cols = [REF_OPS[key][1] for key in keys]
        reps = repeats if size <= 2048 else max(repeats // 3, 3)  # the large one takes ~2 ms a run here
        res = _core.profile_mul_mat(device, REF_TYPE, size, size, cols, threads, 2, reps, True, "", "")
        out.update({key: float(statistics.median(r.samples_us)) for key, r in zip(keys, res, strict=True)})
    # handing the device a graph and waiting for it: an rpc-server's round trip, which a decode pays
    # at every split (a woken idle core of a busy VM host answers later)
    out["launch_us"] = float(statistics.median(_core.profile_launch(device, threads, 2, repeats).samples_us))
    return out


def measure_devices(threads: int, accelerator: str | None = None) -> dict[str, dict[str, float]]:
    """`measure` on the host (`threads` threads) and, when named, on the accelerator:
    {"host": ..., "accelerator": ...}."""
    out = {"host": measure("CPU", threads)}
    if accelerator:
        out["accelerator"] = measure(accelerator, 1)
    return out


def _roles(doc: Mapping[str, Any]) -> dict[str, Mapping[str, float]]:
    """A measurement by role; a host-only one from before roles were recorded counts as the host's."""
    if doc and all(isinstance(v, (int, float)) for v in doc.values()):
        return {"host": doc}
    return {k: v for k, v in doc.items() if isinstance(v, Mapping)}


def mean(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Several measurements (before and after a run) as one: each role's each op's mean."""
    docs = [_roles(s) for s in samples]
    roles = [r for r in docs[0] if all(r in d for d in docs)] if docs else []
    out: dict[str, dict[str, float]] = {}
    for r in roles:
        keys = [k for k in docs[0][r] if all(k in d[r] for d in docs)]
        out[r] = {k: statistics.fmean(float(d[r][k]) for d in docs) for k in keys}
    return out


def ratio(ref: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> float | None:
    """How fast one device ran `now` against `ref` (> 1: faster now): the geometric mean over the
    ops both have of ref's time / now's. None when either is missing."""
    if not ref or not now:
        return None
    keys = [k for k in ref if k in now and float(ref[k]) > 0 and float(now[k]) > 0]
    if not keys:
        return None
    return math.exp(statistics.fmean(math.log(float(ref[k]) / float(now[k])) for k in keys))


def op_ratios(ref: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Each role's each op's ref time / now time: which of them moved."""
    a, b = _roles(ref or {}), _roles(now or {})
    return {r: {k: float(a[r][k]) / float(b[r][k]) for k in a[r] if k in b[r] and float(b[r][k]) > 0}
            for r in a if r in b}


def ratios(ref: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> dict[str, float]:
    """`ratio` per role both measured: {"host": ..., "accelerator": ...}."""
    a, b = _roles(ref or {}), _roles(now or {})
    out = {r: ratio(a[r], b[r]) for r in a if r in b}
    return {r: v for r, v in out.items() if v is not None}
