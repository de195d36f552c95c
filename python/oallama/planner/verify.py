"""Plans checked against llama.cpp's own memory accounting (seed 002).

A placement's accelerator bytes are never estimated from tensor sizes alone: `measure_memory`
asks llama.cpp, through a metadata-only load of exactly that placement (weights, KV cache, and
compute buffers sized for the splits it makes), and `fit_to_budget` corrects a strategy's
compute-buffer reserve until that accounting says the plan fits the budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime import place
from .context import PlanContext, log
from .cost.schedmodel import HOST, NEVER, Placement
from .graph import GraphSession

ATTEMPTS = 5  # reserve corrections before a strategy gives up (all weights on the host)

# a strategy's placement for a compute-buffer reserve (bytes): (placement, details)
PlaceFn = Callable[[int], tuple[Placement, dict[str, Any]]]


def session_memory(session: GraphSession, acc: str) -> dict[str, int]:
    """Bytes llama.cpp accounts on `acc` for a loaded session: model (weights), context (KV
    cache), compute (buffers), and their total."""
    rows = [m for m in session.memory() if m.device == acc]
    out = {k: sum(int(getattr(m, k)) for m in rows) for k in ("model", "context", "compute")}
    out["total"] = out["model"] + out["context"] + out["compute"]
    return out


def measure_memory(ctx: PlanContext, p: Placement, *, stock_layers: int | None = None) -> dict[str, int]:
    """Accelerator bytes of a load with this placement, by llama.cpp's own accounting (a
    metadata-only load: weights, KV cache, compute buffers sized for the plan's splits).
    stock_layers: load with this n_gpu_layers alone (llama.cpp's own placement) instead."""
    kw: dict[str, Any] = {"devices": [ctx.acc], **ctx.session_kwargs()}
    if stock_layers is not None:
        kw["n_gpu_layers"] = stock_layers
    else:
        assign = {w: (ctx.acc if w in p.on_acc else HOST) for w in ctx.weight_bytes}
        # as the load compiles it (place.explicit): a tied embedding's two copies go where the load puts them
        kw.update(overrides=place.compile_patterns(place.explicit(assign, p.n_gpu_layers, ctx.n_layer,
                                                                  output_device=ctx.acc)),
                  n_gpu_layers=p.n_gpu_layers,
                  offload_policy={w: b for w, b in p.min_batch.items() if w not in p.on_acc} or None)
    with GraphSession(ctx.model.path, **kw) as s:
        return session_memory(s, ctx.acc)


def all_on_host(ctx: PlanContext) -> Placement:
    """Every weight in host memory and none streamed: what fits any budget."""
    return Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes})


def fit_to_budget(ctx: PlanContext, name: str, budget: int, place_for: PlaceFn, *, reserve: int = 0,
                  progress: bool = False) -> tuple[Placement, dict[str, int], dict[str, Any]]:
    """Run a strategy (`place_for(reserve)`), then correct its compute-buffer reserve (bytes)
    until llama.cpp's accounting of the load fits `budget` bytes: (placement, memory, details).
    After ATTEMPTS tries every weight stays on the host, and the details say so."""
    for attempt in range(ATTEMPTS):
        p, details = place_for(reserve)
        mem = measure_memory(ctx, p)
        if progress:
            log(f"{name}: attempt {attempt + 1}: {mem['total'] / 2**20:.1f} MiB on {ctx.acc} "
                f"(budget {budget / 2**20:.1f} MiB) {details.get('modes', '')}")
        if mem["total"] <= budget:
            return p, mem, {**details, "attempts": attempt + 1, "reserve_bytes": reserve}
        overhead = mem["total"] - ctx.acc_bytes(p)
        reserve = max(reserve + (mem["total"] - budget), overhead)
    p = all_on_host(ctx)
    return p, measure_memory(ctx, p), {"attempts": ATTEMPTS, "note": "nothing fits: all weights on the host"}
