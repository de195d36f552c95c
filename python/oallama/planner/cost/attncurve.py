"""Attention past the calibrated cells: how much more a prompt pass's attention costs per unit of work
once the KV cache outgrows the calibration's long span (attnspan.LONG_PAST), measured once per device
and settings on a small reference model and shared by every model calibrated there.

A calibration fits the attention kinds' lines to spans timed after a short and a 1024-cell cache
(attnspan.py), and a line through those extrapolates. On this VM's CPU a prompt pass's attention
growth costs 60-87 ps per multiply-add up to 1024 cells on three head shapes and a median 108 beyond
(bench/results/2026-11-28-vm-attention-per-mac): the line is optimistic for every longer cache, by
22-38% on a held-out model's prompts, and much the same ratio on every head shape. So the device is
characterised by that ratio, per segment of cells: the growth's cost per unit of work between two
adjacent pasts over its cost between the short and the long span, all in one load of the reference,
the pasts alternated. A model's span lines then cost a prompt pass attending to c cells as
line(w * calfit.long_multiplier(segments, c)): the work up to the long span at the line's own slope, each
segment beyond at its ratio (the last one's ratio past the last measured cells).

A decode pass's growth is not one device ratio per multiply-add (the same set: 3x apart between
models, a memory-bound pass whose cost depends on each head's K/V bytes): decode lines keep their
own extrapolation.

  curve       the segments for these settings: cached, else measured (this VM: 11 s at 2 threads, 20 at 1)
  measure     the reference's prompt spans at each past and the segments' ratios

calfit.long_multiplier applies the segments.

Cached in $OALLAMA_CACHE/devices/attention-<key>.json; the key is the host's identity, the threads,
the attention settings, the build and VERSION.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._files import cache_base, read_json, write_json
from ...errors import OallamaError, ProfileError
from ...runtime import devices as devmod
from . import attnspan
from .profile import build_info, device_identity
from .realpass import VIEW_OPS

VERSION = 2  # of the measurement: part of the cache key; 2: 512-token passes (attnspan.PROMPT_TOKENS)
REFERENCE = ("tiny", "q4_k_m", 2)  # preset, type, layers: small weights, so its long caches fill in seconds
PASTS = (attnspan.LONG_PAST, 2048, 4096, 8192)  # cells before the timed prompt passes (besides none)
REPS = 5  # timed runs of each past in each of the two sweeps (longest first, then shortest first)
SCHEMA = "oallama.attncurve/1"

Segments = list[list[float]]  # [[lo_cells, hi_cells, ratio], ...]: attended cells (a pass's mean token's)


def ratios(pasts: Sequence[int], cells: Sequence[float], us: Sequence[float], work: Sequence[float]) -> Segments:
    """Segments between adjacent pasts after the first (the calibration's long span), each with its
    growth's cost per unit of work over the growth's between the pass after no cache and that span
    (pasts[0] == 0)."""
    base = (us[1] - us[0]) / (work[1] - work[0])
    if base <= 0:
        raise ProfileError(f"attention curve: no growth between {pasts[0]} and {pasts[1]} cells "
                           f"({us[0]:.0f} -> {us[1]:.0f} us): the machine was disturbed, measure again")
    return [[cells[k], cells[k + 1], max((us[k + 1] - us[k]) / (work[k + 1] - work[k]) / base, 0.0)]
            for k in range(1, len(pasts) - 1)]


def measure(path: str | Path, *, threads: int, attention: Mapping[str, Any], reps: int = REPS,
            pasts: Sequence[int] = PASTS) -> dict[str, Any]:
    """The model's prompt passes (attnspan.PROMPT_TOKENS tokens) after no cache and after each of
    `pasts`, host only: per past its attended cells, its attention spans' summed time (us, median
    over both sweeps' runs) and work, and the segments' ratios (`ratios`)."""
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    n = attnspan.PROMPT_TOKENS
    all_pasts = [0, *pasts]
    n_ctx = -(-(max(all_pasts) + n + 1) // 256) * 256
    try:
        llm = Llama(str(path), n_gpu_layers=0, op_offload=False, n_ctx=n_ctx, n_batch=n, n_ubatch=n,
                    n_threads=threads, n_threads_batch=threads, verbose=False, **attention)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"attention curve: could not load {path}: {e}") from None
    try:
        tokens = prompt_tokens(llm, n_ctx)
        nodes = {p: attnspan.node_list(llm, tokens, n, p) for p in all_pasts}
        found = attnspan.spans(nodes[0], nodes[max(all_pasts)], n, 0, max(all_pasts))
        if not found:
            raise ProfileError(f"attention curve: {path}'s prompt pass has no attention span")
        stops = sorted({k for a, b in found for k in (a - 1, b)})
        ends = [stops.index(b) for _, b in found]
        runs: dict[int, list[float]] = {p: [] for p in all_pasts}
        # longest first: each shorter past reuses the cache's prefix; then shortest first
        for p in [*sorted(all_pasts, reverse=True), *sorted(all_pasts)]:
            runs[p] += [sum(r[c] for c in ends) for r in attnspan.time_stops(llm, tokens, n, p, stops, reps)]
    finally:
        llm.close()
    cells = [p + (n + 1) / 2 for p in all_pasts]  # the mean token's attended cells
    work = [sum(w for a, b in found for k, w in enumerate(attnspan.works(nodes[p], n, p)) if a <= k <= b
                and nodes[p][k].op not in VIEW_OPS) for p in all_pasts]
    us = [statistics.median(runs[p]) for p in all_pasts]
    return {"pasts": all_pasts, "cells": cells, "us": us, "work": work,
            "spread": [[min(runs[p]), max(runs[p])] for p in all_pasts],
            "segments": ratios(all_pasts, cells, us, work)}


def _key(threads: int, attention: Mapping[str, Any]) -> str:
    doc = {"schema": SCHEMA, "version": VERSION, "host": device_identity(devmod.resolve("CPU")), "threads": threads,
           "attention": {k: str(v) for k, v in sorted(attention.items())}, "build": build_info()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def reference_model(progress: bool) -> Path:
    """`REFERENCE`, written once into the cache (a synthetic model, as `oallama synth` writes it)."""
    from ...model import synthetic

    preset, qtype, layers = REFERENCE
    p = cache_base() / "models" / f"reference-{preset}-{qtype}-{layers}l.gguf"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_model(p, preset, qtype, n_layer=layers, progress=progress)
    return p


def cache_path(threads: int, attention: Mapping[str, Any]) -> Path:
    """Where the host's curve for these settings is cached."""
    return cache_base() / "devices" / f"attention-{_key(threads, attention)}.json"


def curve(*, threads: int, attention: Mapping[str, Any], progress: bool = True) -> Segments:
    """The host's segments for these settings: cached, else measured on the reference and cached."""
    p = cache_path(threads, attention)
    if p.exists():
        doc = read_json(p, "attention curve", ProfileError)
        if doc.get("schema") != SCHEMA or "segments" not in doc:
            raise ProfileError(f"{p}: not an attention curve (schema {doc.get('schema')!r}); delete it")
        return [list(map(float, s)) for s in doc["segments"]]
    if progress:
        print(f"\rcalibrate: the CPU's attention after up to {max(PASTS)} cells (once per device and settings)"
              .ljust(100), end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    ref = reference_model(progress=False)
    rec = measure(ref, threads=threads, attention=attention)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json(p, {"schema": SCHEMA, "model": str(ref), "threads": threads, "elapsed_s": time.perf_counter() - t0,
                   "created": time.time(), **rec})
    return rec["segments"]


def describe(segments: Sequence[Sequence[float]]) -> str:
    """`segments` for a progress line: '1088-2112 x1.42, ...'."""
    return ", ".join(f"{lo:.0f}-{hi:.0f} x{r:.2f}" for lo, hi, r in segments)
