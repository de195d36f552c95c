"""Plan: decide, tensor by tensor, what lives on the accelerator, for a memory budget and a
stated workload; predict TTFT and TPOT; write the plan file `Llama(placement=...)` loads.

Strategies (all costed by the same scheduler model, `schedmodel`, and all checked against the
budget with llama.cpp's own memory accounting of the resulting load):

  layers    what llama.cpp's -ngl gives on the same budget: the largest n_gpu_layers that fits.
  affinity  the paper's Algorithm 1 (seed 000), see `affinity_order`.
  optimal   the least predicted time for the workload, exactly (`optimal.solve`), stage-aware:
            a host weight also gets the batch from which its op is streamed to the accelerator.

Budget: bytes ("12GiB", "512MiB", "8000000000") or a share of the model's weights ("50%"). The
KV cache, compute buffers and streamed weights that a placement puts on the accelerator count
against it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BudgetError, PlanError
from ..model import gguf_file
from ..runtime import devices as devmod
from ..runtime import place, planfile
from . import optimal
from .graph import Graph, GraphSession, target_ops
from .profile import DEFAULT_TOKENS, Profile, build_info, profile_model
from .schedmodel import HOST, NEVER, PassModel, Placement, kv_bytes_per_layer, layer_weights, weight_bytes

SCHEMA = planfile.PLAN_SCHEMA
STRATEGIES = ("layers", "affinity", "optimal")
# baselines for the benchmark: llama.cpp's own --fit aimed at the budget, and FlexGen-style
# streaming of every weight from host memory
BASELINES = ("fit", "flexgen")
OBJECTIVES = ("ttft", "tpot", "e2e")
_BINARY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_budget(value: str | int, model_weight_bytes: int) -> int:
    """Budget in bytes: an int, "12GiB", "512MiB", "8000000000", or "50%" of the weights."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BudgetError(f"budget {value!r}: expected bytes or a string such as '12GiB' or '50%'")
    if isinstance(value, int):
        if value <= 0:
            raise BudgetError(f"budget {value}: must be more than 0 bytes")
        return value
    text = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", text)
    if m:
        pct = float(m[1])
        if not 0 < pct <= 100:
            raise BudgetError(f"budget {value!r}: a share of the model's weights must be in (0%, 100%]")
        return max(int(model_weight_bytes * pct / 100), 1)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(B|KiB|MiB|GiB|TiB)?", text)
    if m:
        n = float(m[1]) * _BINARY[m[2] or "B"]
        if n < 1:
            raise BudgetError(f"budget {value!r}: must be at least 1 byte")
        return int(n)
    if re.fullmatch(r"\d+(?:\.\d+)?\s*[kKMGT]?B", text) or re.fullmatch(r"\d+(?:\.\d+)?\s+\w+", text):
        raise BudgetError(f"budget {value!r}: write binary units without a space, e.g. '12GiB' or '512MiB' "
                          "(decimal GB/MB are ambiguous)")
    raise BudgetError(f"budget {value!r}: expected bytes ('12GiB', '512MiB', '8000000000') or a share of "
                      "the model's weights ('50%')")


@dataclass(frozen=True)
class Workload:
    """What the plan is optimised for: one prompt of `prompt` tokens, then `gen` tokens."""

    prompt: int = 512
    gen: int = 128
    objective: str = "e2e"  # ttft | tpot | e2e
    n_ubatch: int = 512

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise PlanError(f"objective '{self.objective}': choose one of {', '.join(OBJECTIVES)}")
        if self.prompt < 1 or self.gen < 1 or self.n_ubatch < 1:
            raise PlanError(f"workload needs prompt, gen and n_ubatch >= 1 (got {self.prompt}, {self.gen}, "
                            f"{self.n_ubatch})")

    def ubatches(self) -> list[int]:
        """Token counts of the prompt's ubatches (llama.cpp splits a prompt by n_ubatch)."""
        full, rest = divmod(self.prompt, self.n_ubatch)
        return [self.n_ubatch] * full + ([rest] if rest else [])

    @property
    def n_ctx(self) -> int:
        return max(256, -(-(self.prompt + self.gen) // 256) * 256)

    def pass_weights(self, objective: str | None = None) -> dict[int, float]:
        """n_tokens -> how often that pass counts in the objective."""
        obj = objective or self.objective
        prefill: dict[int, float] = {}
        for n in self.ubatches():
            prefill[n] = prefill.get(n, 0.0) + 1.0
        if obj == "ttft":
            return prefill
        if obj == "tpot":
            return {1: 1.0}
        out = dict(prefill)
        out[1] = out.get(1, 0.0) + float(self.gen - 1)
        return out


@dataclass
class PlanContext:
    """One model on (CPU, accelerator) for one workload: pass models, sizes, profile."""

    model: gguf_file.GGUFInfo
    acc: str
    workload: Workload
    profile: Profile
    passes: dict[int, PassModel]  # n_tokens -> model of that pass
    weight_bytes: dict[str, int]
    kv_bytes: dict[int, int]  # per layer
    n_layer: int
    settings: dict[str, Any]

    def predict(self, p: Placement) -> dict[str, Any]:
        costs = {n: pm.cost(p) for n, pm in self.passes.items()}
        ttft = sum(costs[n].total_us for n in self.workload.ubatches())
        tpot = costs[1].total_us
        return {"ttft_ms": ttft / 1e3, "tpot_ms": tpot / 1e3, "e2e_ms": (ttft + (self.workload.gen - 1) * tpot) / 1e3,
                "passes": {str(n): {"compute_ms": c.compute_us / 1e3, "copy_ms": c.copy_us / 1e3,
                                    "launch_ms": c.launch_us / 1e3, "splits": c.n_splits, "copies": c.n_copies,
                                    "copy_bytes": c.copy_bytes} for n, c in costs.items()}}

    def objective_ms(self, p: Placement) -> float:
        pred = self.predict(p)
        return float(pred[f"{self.workload.objective}_ms"])

    def acc_bytes(self, p: Placement) -> int:
        """Weights + KV the placement puts on the accelerator (bytes, without compute buffers)."""
        return sum(self.weight_bytes[w] for w in p.on_acc) + sum(
            b for layer, b in self.kv_bytes.items() if layer >= self.n_layer - p.kv_layers)


def _progress(msg: str) -> None:
    print(f"plan: {msg}", file=sys.stderr, flush=True)


def build_context(path: str | Path, acc: str, workload: Workload, *, profile: Profile | None = None,
                  threads: int | None = None, op_offload: bool = True, progress: bool = True) -> PlanContext:
    """Graphs of every pass (all weights on the host, and fully offloaded), and the profile."""
    model = gguf_file.check_model(path)
    dev = devmod.resolve(acc)
    if dev.is_host:
        raise PlanError(f"device {acc} is host memory; name an accelerator (a GPU or an rpc-server device)")
    n_layer = int(model.hparam("block_count", 0))
    sizes = sorted(set(workload.ubatches()) | {1})
    kw = {"devices": [dev.name], "n_ctx": workload.n_ctx, "n_ubatch": max(sizes), "op_offload": op_offload}
    if progress:
        _progress(f"building llama.cpp's graphs for {', '.join(map(str, sizes))} token(s)")
    with GraphSession(path, **kw) as s:
        graphs = {n: s.graph(n) for n in sizes}
    with GraphSession(path, n_gpu_layers=n_layer + 1, **kw) as s:
        full = {n: s.graph(n) for n in sizes}
    if profile is None:
        if progress:
            _progress("profiling (cached after the first time)")
        profile = profile_model(path, [HOST, dev.name], threads=threads, n_tokens=DEFAULT_TOKENS,
                                n_ctx=workload.n_ctx, op_offload=op_offload, progress=progress)
    _check_profile(profile, dev.name, graphs)
    passes = {n: PassModel(graphs[n], profile, dev.name, n_layer=n_layer, op_offload=op_offload, full_graph=full[n])
              for n in sizes}
    g1 = graphs[1]
    settings = {**profile.settings.as_dict(), "n_ctx": workload.n_ctx, "n_ubatch": workload.n_ubatch,
                "flash_attn": False}
    return PlanContext(model, dev.name, workload, profile, passes, weight_bytes(g1), kv_bytes_per_layer(g1),
                       n_layer, settings)


def _check_profile(profile: Profile, acc: str, graphs: Mapping[int, Graph]) -> None:
    for d in (HOST, acc):
        if d not in profile.ops:
            raise PlanError(f"profile {profile.key[:12]} was not measured on {d} (it has {', '.join(profile.ops)})")
    for g in graphs.values():
        for op in target_ops(g):
            profile.op_time_us(HOST, op)  # raises if the profile lacks this op shape


# --- strategies ---------------------------------------------------------------------------------


def place_layers(ctx: PlanContext, n_gpu_layers: int) -> Placement:
    """What llama.cpp's n_gpu_layers puts on the accelerator (default op offload)."""
    on = frozenset(w for w in layer_weights(ctx.weight_bytes, n_gpu_layers, ctx.n_layer) if w in ctx.weight_bytes)
    return Placement(on, min(max(n_gpu_layers - 1, 0), ctx.n_layer))


def affinity_order(ops: Sequence[tuple[str, float, float, int]], limit: float,
                   transfer_us: Callable[[frozenset[str]], Mapping[str, float]],
                   max_iter: int = 50) -> tuple[list[str], frozenset[str], int]:
    """The paper's Algorithm 1. ops: (name, T_c, T_g, M) with times in us and M in bytes.

    1. B_i = (T_c,i - T_g,i) / M_i, min-max normalised to G_i; order by G descending.
    2. Repeat: place by the current order (step 3); T'_i = transfer_us(placement)[i], the copy
       and launch time op i incurs on the accelerator given where its neighbours are under that
       placement; B_i = (T_c,i - T_g,i - T'_i) / M_i; normalise, re-sort; stop when the order no
       longer changes (or after max_iter rounds, keeping the last order).
    3. Walk the order adding M_i while the running total stays <= limit (the caller passes 90%
       of the memory available for weights): those go to the accelerator.
    Returns (order, names on the accelerator, rounds).
    """

    def rank(b: Mapping[str, float]) -> list[str]:
        lo, hi = min(b.values()), max(b.values())
        g = {k: (v - lo) / (hi - lo) if hi > lo else 0.0 for k, v in b.items()}
        return sorted(g, key=lambda k: (-g[k], k))

    def fill(order: Sequence[str]) -> frozenset[str]:
        chosen, total = [], 0
        size = {name: m for name, _, _, m in ops}
        for name in order:
            if total + size[name] > limit:
                break
            chosen.append(name)
            total += size[name]
        return frozenset(chosen)

    if not ops:
        return [], frozenset(), 0
    order = rank({n: (tc - tg) / max(m, 1) for n, tc, tg, m in ops})
    for it in range(1, max_iter + 1):
        tp = transfer_us(fill(order))
        new = rank({n: (tc - tg - tp.get(n, 0.0)) / max(m, 1) for n, tc, tg, m in ops})
        if new == order:
            return order, fill(order), it
        order = new
    return order, fill(order), max_iter


def place_affinity(ctx: PlanContext, weight_budget: float) -> tuple[Placement, dict[str, Any]]:
    """Algorithm 1 on the target ops' weights; T' from the scheduler model (see affinity_order)."""
    pw = ctx.workload.pass_weights()
    tc: dict[str, float] = {}
    tg: dict[str, float] = {}
    for n, pm in ctx.passes.items():
        for i, t in pm.t_host.items():
            w = pm.graph.nodes[i].weight
            tc[w] = tc.get(w, 0.0) + pw.get(n, 0.0) * t
            tg[w] = tg.get(w, 0.0) + pw.get(n, 0.0) * pm.t_acc[i]
    ops = [(w, tc[w], tg[w], ctx.weight_bytes[w]) for w in sorted(tc) if all(pm.acc_ok.get(w, True)
                                                                            for pm in ctx.passes.values())]

    def transfer_us(on: frozenset[str]) -> dict[str, float]:
        # T'_i: what op i would pay to run on the accelerator while every other node runs where
        # the current placement `on` puts it: its activation inputs that live on the host come
        # over (h2d), its result goes back if any reader runs on the host (d2h), and each graph
        # neighbour on the host means one more split to launch
        out: dict[str, float] = {}
        p = Placement(on)
        for n, pm in ctx.passes.items():
            dev = pm.assign(p)
            pos = {i: k for k, i in enumerate(pm.order)}
            for i in pm.t_host:
                node = pm.graph.nodes[i]
                t = 0.0
                for src, nbytes in pm.reads[i]:
                    if src[0] != "w" and not pm.source_on_acc(src, dev, p):
                        t += pm.h2d.time_us(nbytes)
                if any(not dev[r] for r in pm.graph.readers(i) if r in dev):
                    t += pm.d2h.time_us(node.nbytes)
                k = pos[i]
                for j in (k - 1, k + 1):
                    if 0 <= j < len(pm.order) and not dev[pm.order[j]]:
                        t += pm.launch[1] / 2 + pm.launch[0] / 2
                out[node.weight] = out.get(node.weight, 0.0) + pw.get(n, 0.0) * t
        return out

    order, on, rounds = affinity_order(ops, 0.9 * weight_budget, transfer_us)
    return Placement(on, 0), {"order": order, "rounds": rounds}


# --- plans --------------------------------------------------------------------------------------


@dataclass
class Plan:
    strategy: str
    accelerator: str
    placement: Placement
    budget_bytes: int
    budget_request: str
    workload: Workload
    predicted: dict[str, Any]
    memory: dict[str, int]  # bytes on the accelerator, from llama.cpp's accounting of the load
    model: dict[str, Any]
    settings: dict[str, Any]
    profile_key: str
    stock_layers: bool = False  # load with n_gpu_layers alone (llama.cpp's own placement)
    plan_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    all_weights: list[str] = field(default_factory=list)
    raw_overrides: list[tuple[str, str]] = field(default_factory=list)  # "fit": llama.cpp's own patterns

    @property
    def devices(self) -> list[str]:
        return [HOST, self.accelerator]

    @property
    def n_gpu_layers(self) -> int:
        return int(self.extra.get("n_gpu_layers", self.placement.n_gpu_layers))

    def assignment(self) -> dict[str, str]:
        return {w: (self.accelerator if w in self.placement.on_acc else HOST) for w in self.all_weights}

    def offload_policy(self) -> dict[str, int]:
        """host weight -> min batch from which its op is streamed (empty: llama.cpp's default)."""
        return {w: int(b) for w, b in self.placement.min_batch.items() if w not in self.placement.on_acc}

    @property
    def load_mode(self) -> str:
        return "fit" if self.strategy == "fit" else "n_gpu_layers" if self.stock_layers else "overrides"

    def load_spec(self) -> place.LoadSpec:
        if self.load_mode == "fit":
            overrides = list(self.raw_overrides)
        else:
            overrides = [] if self.stock_layers else place.compile_patterns(self.assignment())
        return place.LoadSpec(self.assignment(), [self.accelerator], overrides,
                              {self.accelerator: devmod.resolve(self.accelerator).buffer_type, HOST: "CPU"})

    def emit_args(self) -> list[str]:
        """Arguments reproducing the weight placement in stock llama-server / llama-cli."""
        args = ["-ngl", str(self.n_gpu_layers)]
        if not self.stock_layers:
            args += self.load_spec().ot_arguments()
        if self.strategy == "flexgen":
            args += ["--op-offload"]  # and GGML_OP_OFFLOAD_MIN_BATCH=1 in the environment
        return args

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "strategy": self.strategy, "model": self.model, "devices": self.devices,
                "accelerator": self.accelerator,
                "budget": {"request": self.budget_request, "bytes": self.budget_bytes},
                "workload": asdict(self.workload), "settings": self.settings, "profile": self.profile_key,
                "build": build_info(), "load": self.load_mode,
                "overrides": [list(o) for o in self.raw_overrides],
                "n_gpu_layers": self.n_gpu_layers, "kv_layers": self.placement.kv_layers,
                "placement": self.assignment(),
                "offload_min_batch": {w: (None if b >= NEVER else b) for w, b in self.offload_policy().items()},
                "predicted": self.predicted, "memory": self.memory, "plan_seconds": self.plan_s,
                "extra": {k: v for k, v in self.extra.items() if k != "order"}}

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=1))
        return p


def read_plan(path: str | Path, model: gguf_file.GGUFInfo | None = None) -> dict[str, Any]:
    """A plan file's JSON, checked: schema, and (given the model) that it was made for it."""
    return planfile.read_document(path, model)


class LoadPlanner:
    """The planner `Llama(placement=<strategy>, gpu_budget=...)` asks (runtime.planfile.Planner);
    the top-level package installs it, so the runtime never imports this module."""

    strategies = STRATEGIES + BASELINES

    def __call__(self, model_path: Path, strategy: str, budget: str | int, *, device: str, workload: Any,
                 profile: Any, threads: int | None, op_offload: bool, n_ubatch: int,
                 progress: bool) -> dict[str, Any]:
        if isinstance(workload, Mapping):
            workload = Workload(**{"n_ubatch": n_ubatch, **workload})
        wl = workload or Workload(n_ubatch=n_ubatch)
        if isinstance(profile, (str, Path)):
            profile = Profile.load(profile)
        ctx = build_context(model_path, device, wl, profile=profile, threads=threads, op_offload=op_offload,
                            progress=progress)
        return make_plan(ctx, strategy, budget).to_json()


def measure_memory(ctx: PlanContext, p: Placement, *, stock_layers: int | None = None) -> dict[str, int]:
    """Accelerator bytes of a load with this placement, by llama.cpp's own accounting (a
    metadata-only load: weights, KV cache, compute buffers sized for the plan's splits)."""
    kw: dict[str, Any] = {"devices": [ctx.acc], "n_ctx": ctx.workload.n_ctx, "n_ubatch": ctx.workload.n_ubatch,
                          "op_offload": bool(ctx.settings["op_offload"])}
    if stock_layers is not None:
        kw["n_gpu_layers"] = stock_layers
    else:
        assign = {w: (ctx.acc if w in p.on_acc else HOST) for w in ctx.weight_bytes}
        kw.update(overrides=place.compile_patterns(assign), n_gpu_layers=p.n_gpu_layers,
                  offload_policy={w: b for w, b in p.min_batch.items() if w not in p.on_acc} or None)
    with GraphSession(ctx.model.path, **kw) as s:
        mem = [m for m in s.memory() if m["device"] == ctx.acc]
    out = {k: sum(int(m[k]) for m in mem) for k in ("model", "context", "compute")}
    out["total"] = out["model"] + out["context"] + out["compute"]
    return out


def _model_doc(ctx: PlanContext) -> dict[str, Any]:
    return {"name": ctx.model.metadata.get("general.name", ctx.model.path.stem), "path": str(ctx.model.path),
            "identity": ctx.model.identity(), "architecture": ctx.model.architecture, "n_layer": ctx.n_layer,
            "weight_bytes": ctx.model.weight_bytes}


def make_plan(ctx: PlanContext, strategy: str, budget: str | int, *, progress: bool = False,
              candidates: Sequence[Plan] = (), time_limit: float = 10.0) -> Plan:
    """Plan with `strategy` within `budget`, verified against llama.cpp's memory accounting."""
    if strategy not in STRATEGIES + BASELINES:
        raise PlanError(f"strategy '{strategy}': choose one of {', '.join(STRATEGIES + BASELINES)}")
    budget_bytes = parse_budget(budget, ctx.model.weight_bytes)
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    stock = False
    raw: list[tuple[str, str]] = []
    if strategy == "fit":
        p, mem, extra, raw = _plan_fit(ctx, budget_bytes)
    elif strategy == "flexgen":
        p = Placement(frozenset(), 0, {w: 1 for w in ctx.weight_bytes})
        mem = measure_memory(ctx, p)
    elif strategy == "layers":
        p, mem, n = _search_layers(ctx, budget_bytes)
        stock = True
        extra["n_gpu_layers"] = n
    else:
        # the baselines that fit: the best one starts the search; their measured compute-buffer
        # overhead is the first estimate of the reserve
        fitting = [c for c in candidates if c.memory["total"] <= budget_bytes and c.strategy != "flexgen"]
        start = min(fitting, key=lambda c: ctx.objective_ms(c.placement)).placement if fitting else None
        reserve0 = max((c.memory["total"] - ctx.acc_bytes(c.placement) for c in fitting if c.placement.on_acc),
                       default=0)
        p, mem, extra = _fit(ctx, strategy, budget_bytes, progress, start=start, reserve=reserve0,
                             time_limit=time_limit)
    elapsed = time.perf_counter() - t0
    plan = Plan(strategy, ctx.acc, p, budget_bytes, str(budget), ctx.workload, ctx.predict(p), mem, _model_doc(ctx),
                ctx.settings, ctx.profile.key, stock, elapsed, extra, sorted(ctx.weight_bytes), raw)
    if strategy == "optimal":
        # the program is exact for its memory model; a baseline that llama.cpp's accounting shows
        # to fit and that predicts less time can only win through that model's reserve estimate
        for c in candidates:
            if c.memory["total"] <= budget_bytes and ctx.objective_ms(c.placement) < ctx.objective_ms(p) - 1e-9:
                plan = Plan(strategy, ctx.acc, c.placement, budget_bytes, str(budget), ctx.workload,
                            ctx.predict(c.placement), c.memory, _model_doc(ctx), ctx.settings, ctx.profile.key,
                            c.stock_layers, elapsed, {**c.extra, "from": c.strategy}, sorted(ctx.weight_bytes))
    return plan


def _plan_fit(ctx: PlanContext, budget: int) -> tuple[Placement, dict[str, int], dict[str, Any], list]:
    """llama.cpp's --fit (common_fit_params) leaving free(accelerator) - budget bytes free there."""
    from .. import _core

    if not hasattr(_core, "fit_params"):
        raise PlanError("this oallama was built without llama-common (OALLAMA_TOOLS=OFF): no 'fit' baseline")
    free, _ = devmod.device_memory(ctx.acc)  # this device only: others may be gone
    margin = max(free - budget, 0)
    n_ubatch = ctx.workload.n_ubatch
    r = _core.fit_params(str(ctx.model.path), [ctx.acc], [margin], ctx.workload.n_ctx, n_ubatch, n_ubatch, False)
    ngl = int(r["n_gpu_layers"]) if r["n_gpu_layers"] >= 0 else ctx.n_layer + 1
    raw = [(str(a), str(b)) for a, b in r["overrides"]]
    # where llama.cpp puts the weights with these parameters, read from a metadata-only load
    with GraphSession(ctx.model.path, devices=[ctx.acc], overrides=raw, n_gpu_layers=ngl, n_ctx=ctx.workload.n_ctx,
                      n_ubatch=n_ubatch) as s:
        placed = _core.model_tensors(s._s.model())
        mem_rows = [m for m in s.memory() if m["device"] == ctx.acc]
    on = frozenset(t["name"] for t in placed if t["device"] == ctx.acc)
    mem = {k: sum(int(m[k]) for m in mem_rows) for k in ("model", "context", "compute")}
    mem["total"] = mem["model"] + mem["context"] + mem["compute"]
    extra = {"n_gpu_layers": ngl, "fits": bool(r["fits"]), "margin_bytes": margin}
    return Placement(on, min(max(ngl - 1, 0), ctx.n_layer)), mem, extra, raw


def _search_layers(ctx: PlanContext, budget: int) -> tuple[Placement, dict[str, int], int]:
    """Largest n_gpu_layers whose load fits (memory grows with n: binary search)."""
    lo, hi = 0, ctx.n_layer + 1
    mem_lo = measure_memory(ctx, place_layers(ctx, 0), stock_layers=0)
    best = (place_layers(ctx, 0), mem_lo, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        p = place_layers(ctx, mid)
        mem = measure_memory(ctx, p, stock_layers=mid)
        if mem["total"] <= budget:
            lo, best = mid, (p, mem, mid)
        else:
            hi = mid - 1
    return best


def _fit(ctx: PlanContext, strategy: str, budget: int, progress: bool, *, start: Placement | None = None,
         reserve: int = 0, time_limit: float = 10.0) -> tuple[Placement, dict[str, int], dict]:
    """Run a strategy, then correct its compute-buffer reserve until llama.cpp's accounting fits."""
    extra: dict[str, Any] = {}
    solve_total = 0.0
    for attempt in range(5):
        if strategy == "affinity":
            p, extra = place_affinity(ctx, max(budget - reserve, 0))
        else:
            p, extra = _optimal(ctx, budget, reserve, start, time_limit)
            solve_total += float(extra.get("solve_seconds", 0.0))
            extra["solve_seconds_total"] = solve_total
        mem = measure_memory(ctx, p)
        if progress:
            _progress(f"{strategy}: attempt {attempt + 1}: {mem['total'] / 2**20:.1f} MiB on {ctx.acc} "
                      f"(budget {budget / 2**20:.1f} MiB) {extra.get('modes', '')}")
        if mem["total"] <= budget:
            return p, mem, {**extra, "attempts": attempt + 1, "reserve_bytes": reserve}
        overhead = mem["total"] - ctx.acc_bytes(p)
        reserve = max(reserve + (mem["total"] - budget), overhead)
    p = Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes})
    return p, measure_memory(ctx, p), {"attempts": 5, "note": "nothing fits: all weights on the host"}


def _optimal(ctx: PlanContext, budget: int, reserve: int, start: Placement | None,
             time_limit: float) -> tuple[Placement, dict[str, Any]]:
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    best: optimal.Solution | None = None
    spent = 0.0
    modes: dict[str, Any] = {}
    # partial offload first; full offload (every layer's KV on the accelerator) only where it beats that
    for full in (False, True):
        t0 = time.perf_counter()
        sol = optimal.solve(passes, weight_bytes=ctx.weight_bytes, kv_bytes=ctx.kv_bytes, budget=budget,
                            reserve=reserve, full=full, cutoff_us=best.objective_us if best else None,
                            start=start, time_limit=time_limit)
        spent += time.perf_counter() - t0
        modes["full" if full else "partial"] = {"seconds": round(time.perf_counter() - t0, 3),
                                                "objective_ms": sol.objective_us / 1e3 if sol else None,
                                                "status": sol.status if sol else "no better solution",
                                                "gap": sol.gap if sol else None}
        if sol is not None and (best is None or sol.objective_us < best.objective_us):
            best = sol
    host = Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes})
    if best is None or ctx.objective_ms(host) * 1e3 < best.objective_us:  # nothing fits, or the host wins
        return host, {"solver": "infeasible" if best is None else "all on the host is best",
                      "solve_seconds": spent, "modes": modes}
    return best.placement, {"solver_status": best.status, "mip_gap": best.gap, "solve_seconds": spent,
                            "modes": modes, "vars": best.n_vars,
                            "rows": best.n_rows, "objective_ms": best.objective_us / 1e3,
                            "streamed": best.stream_batches}


# --- CLI ----------------------------------------------------------------------------------------


def layer_table(ctx: PlanContext, plan: Plan) -> str:
    """Per layer: weights on the accelerator, their bytes, and the predicted gain of the plan
    over keeping that layer's ops on the host (workload-weighted compute time, ms)."""
    pw = ctx.workload.pass_weights()
    gain: dict[str, float] = {}
    for n, pm in ctx.passes.items():
        dev = pm.cost(plan.placement).on_acc
        for i, th in pm.t_host.items():
            w = pm.graph.nodes[i].weight
            gain[w] = gain.get(w, 0.0) + pw.get(n, 0.0) * (th - (pm.t_acc[i] if dev[i] else th)) / 1e3
    rows: dict[str, list[str]] = {}
    for w in sorted(ctx.weight_bytes):
        m = re.match(r"^blk\.(\d+)\.", w)
        rows.setdefault(m[1] if m else "-", []).append(w)
    lines = [f"{'layer':>6} {'on ' + ctx.acc:<44} {'MiB':>9} {'gain ms':>9}  kv"]
    for key in sorted(rows, key=lambda k: -1 if k == "-" else int(k)):
        ws = rows[key]
        on = [w for w in ws if w in plan.placement.on_acc]
        streamed = [w for w in ws if w not in plan.placement.on_acc and plan.placement.min_batch.get(w, NEVER) < NEVER]
        names = " ".join(w.split(".")[-2] if key != "-" else w for w in on) or "-"
        if streamed:
            names += f" (+{len(streamed)} streamed)"
        kv = "acc" if key != "-" and int(key) >= ctx.n_layer - plan.placement.kv_layers else ""
        lines.append(f"{key:>6} {names[:44]:<44} {sum(ctx.weight_bytes[w] for w in on) / 2**20:>9.1f} "
                     f"{sum(gain.get(w, 0.0) for w in ws):>9.2f}  {kv}")
    return "\n".join(lines)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..runtime.rpc import local_server_if

    with local_server_if(args.rpc_local and not args.device, args.rpc_threads) as server:
        if args.device:
            acc = devmod.resolve(args.device).name
        elif server is not None:
            acc = server.device_name
        else:
            found = devmod.default_accelerator()
            if found is None:
                raise PlanError("no accelerator here: name one with --device (e.g. RPC[host:port]) or use --rpc-local")
            acc = found.name
        wl = Workload(args.prompt, args.gen, args.objective, args.ubatch)
        prof = Profile.load(args.profile) if args.profile else None
        ctx = build_context(args.model, acc, wl, profile=prof, threads=args.threads, progress=not args.quiet)
        budget_bytes = parse_budget(args.gpu_budget, ctx.model.weight_bytes)
        plans: dict[str, Plan] = {}
        for s in STRATEGIES:
            plans[s] = make_plan(ctx, s, args.gpu_budget, candidates=list(plans.values()),
                                 time_limit=args.time_limit)
        chosen = plans[args.strategy]
        print(f"{ctx.model.path.name}: {ctx.model.weight_bytes / 2**20:.1f} MiB of weights, {ctx.n_layer} layers; "
              f"budget {budget_bytes / 2**20:.1f} MiB on {acc}; workload prompt {wl.prompt}, gen {wl.gen}, "
              f"objective {wl.objective}; threads {ctx.settings['threads']}")
        print(f"\nplan '{chosen.strategy}':")
        print(layer_table(ctx, chosen))
        print(f"\n{'strategy':<10} {'on acc MiB':>10} {'TTFT ms':>10} {'TPOT ms':>10} {'e2e ms':>10} {'splits':>7} "
              f"{'plan s':>7}")
        for s, p in plans.items():
            print(f"{s:<10} {p.memory['total'] / 2**20:>10.1f} {p.predicted['ttft_ms']:>10.2f} "
                  f"{p.predicted['tpot_ms']:>10.2f} {p.predicted['e2e_ms']:>10.2f} "
                  f"{p.predicted['passes']['1']['splits']:>7} {p.plan_s:>7.2f}")
        opt = plans["optimal"].extra
        if "from" in opt:
            print(f"optimal: no placement predicted faster than '{opt['from']}' was found; keeping it")
        elif opt.get("solver_status"):
            gap = float(opt.get("mip_gap") or 0.0)
            print(f"optimal: {'proven optimal' if gap <= 1e-6 else f'best found, within {gap:.1%} of optimal'} "
                  f"(HiGHS, {opt.get('solve_seconds_total', 0.0):.1f} s; raise the limit with --time-limit)")
        if args.emit_ot:
            print("\nstock llama.cpp equivalent of the weight placement:")
            print(" ".join(_shell_quote(a) for a in chosen.emit_args()))
            if chosen.offload_policy():
                print("# per-tensor streaming thresholds need oallama (stock llama.cpp has one global "
                      "GGML_OP_OFFLOAD_MIN_BATCH)")
        if args.output:
            print(f"\nwrote {chosen.save(args.output)}")
    return 0


def _shell_quote(a: str) -> str:
    return a if re.fullmatch(r"[\w.,:=/+-]+", a) else "'" + a.replace("'", "'\\''") + "'"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="decide per tensor what goes on the accelerator for a memory budget")
    p.add_argument("model")
    p.add_argument("--gpu-budget", required=True, help="bytes ('12GiB') or a share of the weights ('50%%')")
    p.add_argument("--device", help="the accelerator (default: the first GPU)")
    p.add_argument("--rpc-local", action="store_true", help="use a loopback rpc-server as the accelerator")
    p.add_argument("--rpc-threads", type=int, default=1)
    p.add_argument("--strategy", choices=STRATEGIES, default="optimal")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens of the workload")
    p.add_argument("--gen", type=int, default=128, help="generated tokens of the workload")
    p.add_argument("--objective", choices=OBJECTIVES, default="e2e")
    p.add_argument("--ubatch", type=int, default=512, help="llama.cpp's n_ubatch")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", help="use this profile JSON instead of measuring (or the cache)")
    p.add_argument("--time-limit", type=float, default=10.0,
                   help="seconds the exact solver may search per mode (default 10; the best plan found is kept)")
    p.add_argument("--emit-ot", action="store_true", help="print -ngl/-ot arguments for stock llama.cpp")
    p.add_argument("-o", "--output", help="write the chosen plan here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_plan)
