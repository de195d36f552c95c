"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import gc
import socket
import sys
from collections.abc import Callable
from typing import Any

import pytest


def raises_cleanly(exc: type[Exception] | tuple[type[Exception], ...], match: str,
                   build: Callable[[], object]) -> str:
    """pytest.raises(exc, match=match) around build(); returns the message.

    A half-built object is collected inside, so that a failing __del__ (a refused model must
    leave nothing behind to free) fails this test and not a later one."""
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with pytest.raises(exc, match=match) as info:
            build()
        message = str(info.value)
        del info
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert not seen, [f"{u.exc_type.__name__}: {u.exc_value} ({u.object!r})" for u in seen]
    return message


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sched_model_mismatches(path: Any, acc: str, n_tokens: int, seed: str, trials: int = 6) -> list[str]:
    """Random placements of a 2-layer model's weights, KV layers and per-weight streaming thresholds
    on `acc`: the scheduler model's node -> device assignment against ggml's real scheduler. Returns
    one line per trial that disagreed (empty: the model is the scheduler, node for node)."""
    import random

    from oallama.planner.graph import GraphSession
    from oallama.planner.schedmodel import HOST, NEVER, PassModel, Placement
    from oallama.runtime.place import compile_patterns

    kw = {"devices": [acc], "n_ctx": 256, "n_ubatch": 64}
    with GraphSession(path, **kw) as s:
        base = s.graph(n_tokens)
    with GraphSession(path, n_gpu_layers=3, **kw) as s:
        full = s.graph(n_tokens)
    pm = PassModel(base, None, acc, n_layer=2, full_graph=full)
    weights = sorted(pm.weights)
    rng = random.Random(seed)
    out = []
    for trial in range(trials):
        on = frozenset(w for w in weights if rng.random() < 0.5)
        policy = {w: rng.choice([1, 16, NEVER]) for w in weights if w not in on and rng.random() < 0.7}
        p = Placement(on, [0, 1, 2][trial % 3], policy)
        assign = {w: (acc if w in on else HOST) for w in weights}
        with GraphSession(path, overrides=compile_patterns(assign), offload_policy=policy,
                          n_gpu_layers=p.n_gpu_layers, **kw) as s:
            real = s.graph(n_tokens)
        model_dev = pm.assign(p)
        wrong = [(real.nodes[i].name, real.nodes[i].op, real.nodes[i].backend) for i in pm.order
                 if (real.nodes[i].backend == acc) != model_dev[i]]
        if wrong:
            out.append(f"trial {trial} ({p.kv_layers} kv layers): {wrong[:5]}")
    return out
