"""A pass's time outside its graph: what the generation loop adds to each eval (calibrate.py).

Per pass of n tokens the loop pays llama.cpp's decode around the graph (batch, graph reuse or
build, inputs, logits out) and llama-cpp-python's own work, then samples the token:

  outside   wall - graph span of the eval in split mode (`calibrate._Load`, paired per run);
  sampling  greedy, with the one sampler chain `generate` keeps for a whole generation
            (`sample_us`): a standalone `sample()` builds a chain per call, whose first sample
            fills its n_vocab candidates afresh (~1.1 ms against ~0.16 ms on a 151k vocabulary);
  detached  what an attached accelerator adds to both when the pass runs nothing on it (`saved`:
            the attached load's times less the same passes' in a load without it, `alone_us`): the
            runtime loads a placement that uses no rpc-server without it, while every
            synchronisation with an attached rpc-server is a hand-over to its dispatcher thread
            (llama_synchronize, reading the logits): 0.5-0.7 ms a token on the project's VM, 15%
            of a small model's decode pass.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ...errors import OallamaError, ProfileError
from ...runtime.kvcache import NO_FLASH_ATTN

__all__ = ["alone_us", "overheads", "sample_us", "saved"]


def sample_us(llm: Any, reps: int) -> float:
    """Greedy sampling of one token from the last eval's logits as the generation loop samples
    (us). `_init_sampler` is the pinned llama-cpp-python's builder of `generate`'s chain (its
    defaults at temp 0: penalties off, greedy)."""
    saved = llm._sampler
    llm._sampler = llm._init_sampler(temp=0.0)
    try:
        samples = []
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            llm.sample(temp=0.0)
            samples.append((time.perf_counter() - t0) * 1e6)
    finally:
        llm._sampler = saved
    return statistics.median(samples[1:])  # the first one allocates the chain's candidates


def overheads(llm: Any, outside: Mapping[tuple[int, int], float], reps: int) -> dict[tuple[int, int], float]:
    """(n_tokens, n_past) -> us outside the graph per timed pass: the eval's own (`outside`) plus
    sampling the token from its logits."""
    s = sample_us(llm, reps)
    return {k: us + s for k, us in outside.items()}


def alone_us(path: str | Path, passes: Iterable[tuple[int, int]], measure: Callable[[Any, tuple[int, int]], float], *,
             n_ctx: int, n_prefill: int, threads: int, mmap: bool, reps: int,
             attention: Mapping[str, Any] = NO_FLASH_ATTN) -> dict[tuple[int, int], float]:
    """(n_tokens, n_past) -> us outside the graph (`overheads`) of each of `passes` in a host load
    without the accelerator attached. measure(llm, (n_tokens, n_past)): such a pass's split-mode
    time outside its graph (calibrate._Load)."""
    from ...runtime.llama import Llama

    passes = list(passes)
    n_batch = max([n_prefill, *(n for n, _ in passes)])  # every timed pass in one ubatch
    try:
        llm = Llama(str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                    n_threads_batch=threads, use_mmap=mmap, verbose=False, n_gpu_layers=0, op_offload=False,
                    **attention)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"calibration: could not load {path} (host load, no accelerator): {e}") from None
    try:
        return overheads(llm, {k: measure(llm, k) for k in passes}, reps)
    finally:
        llm.close()


def saved(attached: Mapping[tuple[int, int], float], alone: Mapping[tuple[int, int], float]) -> list[tuple[int, float]]:
    """(n_tokens, us) per pass size: what a pass running nothing on the accelerator saves when the
    accelerator is not attached, the median over the pass size's passes of attached - alone (both
    `overheads`: us outside the graph)."""
    by_n: dict[int, list[float]] = {}
    for (n, n_past), us in attached.items():
        if (n, n_past) in alone:
            by_n.setdefault(n, []).append(us - alone[(n, n_past)])
    return [(n, statistics.median(v)) for n, v in sorted(by_n.items())]
