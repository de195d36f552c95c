"""Plan: decide, tensor by tensor, what lives on the accelerator, for a memory budget and a
stated workload, and in which layout each host weight lives (`layouts`); predict TTFT and TPOT;
write the plan file `Llama(placement=...)` loads (seed 002).

Without an accelerator (no GPU budget) a plan is CPU-only: its only choices are host weight
layouts (plain, repacked, or both within --host-budget), which still pay off on some CPUs.

`make_plan` builds every plan, whatever its strategy, in one place: the strategy (`strategies`:
layers, affinity, optimal, and the benchmark baselines fit and flexgen) places the weights within
the budget, checked with llama.cpp's own memory accounting (`verify`); the plan adds the
prediction of the workload (`context.PlanContext`) and becomes the plan file. `LoadPlanner` is what
`Llama(placement="optimal", gpu_budget=...)` asks; `oallama plan` is the command (`plancmd`).

Budget: bytes ("12GiB", "512MiB", "8000000000") or a share of the model's weights ("50%"). The
KV cache, compute buffers and streamed weights that a placement puts on the accelerator count
against it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._files import write_json
from ..errors import PlanError
from ..model import gguf_file
from ..runtime import devices as devmod
from ..runtime import place, planfile
from ..runtime.planfile import ConfirmOptions
from . import confirm as confirmmod
from . import layouts as layoutmod
from . import strategies
from .confirm import Confirmation
from .context import PlanContext, build_context, log, parse_budget
from .cost.profile import PLAIN, REPACK, Profile, build_info
from .cost.schedmodel import HOST, NEVER, Placement
from .strategies import (
    BASELINES,
    STRATEGIES,
    TIME_LIMIT_S,
    Search,
    affinity_order,
    place_affinity,
    place_layers,
)
from .verify import measure_memory
from .workload import OBJECTIVES, Workload

SCHEMA = planfile.PLAN_SCHEMA
LAYOUT_STRATEGIES = ("affinity", "optimal")  # strategies that also choose host weight layouts
DEFAULT_LAYOUTS_LABEL = "optimal-default-layouts"  # optimal's placement with llama.cpp's host layouts
NO_REPACK_LABEL = "no-repack"  # llama.cpp's default load with every weight plain (its --no-repack)


# --- plans --------------------------------------------------------------------------------------


@dataclass
class Plan:
    """One strategy's placement for one budget and workload, with its prediction and llama.cpp's
    accounting of its memory; `to_json` is the plan file."""

    strategy: str
    accelerator: str | None  # None: a CPU-only plan
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

    host_budget: int | None = None  # bytes of host memory for weights (dual layouts), when given

    @property
    def devices(self) -> list[str]:
        return [HOST, self.accelerator] if self.accelerator else [HOST]

    @property
    def n_gpu_layers(self) -> int:
        return int(self.extra.get("n_gpu_layers", self.placement.n_gpu_layers))

    def assignment(self) -> dict[str, str]:
        return {w: (self.accelerator if self.accelerator and w in self.placement.on_acc else HOST)
                for w in self.all_weights}

    def offload_policy(self) -> dict[str, int]:
        """host weight -> min batch from which its op is streamed (empty: llama.cpp's default)."""
        return {w: int(b) for w, b in self.placement.min_batch.items() if w not in self.placement.on_acc}

    def streams_nothing(self) -> bool:
        """The plan keeps every host weight's op on the host ("never" for each weight it names; the
        weights it does not name are those no pass of its workload would stream anyway)."""
        pol = self.offload_policy()
        return bool(self.accelerator) and bool(pol) and all(b >= NEVER for b in pol.values())

    def stock_streams_as_planned(self) -> bool:
        """Whether the emitted stock command streams exactly what the plan streams: nothing (it says
        --no-op-offload) or what llama.cpp's own rule streams (the plan names no threshold). Per-weight
        thresholds need oallama: stock has one global threshold, and none at all for an rpc-server
        (its backend has no offload_op)."""
        return not self.accelerator or not self.offload_policy() or self.streams_nothing()

    @property
    def stock_memory(self) -> dict[str, int]:
        """Accelerator bytes of the emitted stock command's load (llama.cpp's accounting): the plan's
        own, unless the stock command streams otherwise (`stock_streams_as_planned`), when its
        compute buffers differ and make_plan measured that load too."""
        return dict(self.extra.get("stock_memory") or self.memory)

    @property
    def load_mode(self) -> str:
        """How the plan loads: llama.cpp's fit patterns as they are, n_gpu_layers alone, or overrides
        (by what the placement is, not by its strategy's name: a confirmed `optimal` may be either)."""
        return "fit" if self.raw_overrides else "n_gpu_layers" if self.stock_layers else "overrides"

    def load_spec(self) -> place.LoadSpec:
        if self.load_mode == "fit":
            overrides = list(self.raw_overrides)
        else:
            overrides = [] if self.stock_layers else place.compile_patterns(
                place.explicit(self.assignment(), self.n_gpu_layers, int(self.model.get("n_layer", 0)),
                               output_device=self.accelerator))
        accs = [self.accelerator] if self.accelerator else []
        buft = {HOST: "CPU", **{a: devmod.resolve(a).buffer_type for a in accs}}
        lays = dict(self.placement.layouts)
        lay_ov = place.layout_overrides(lays, {})
        buft.update({lay: lay for _, lay in lay_ov})
        return place.LoadSpec(self.assignment(), accs, lay_ov + overrides, buft, lays, self.placement.dual_max_batch)

    def stock_layouts(self) -> list[str] | None:
        """Arguments giving stock llama.cpp this plan's host layouts: [] (its default: repacked
        wherever it can), ["--no-repack"] (all plain), or None when the plan mixes layouts or
        keeps both (per-weight layouts need oallama: stock -ot knows only devices' buffer types)."""
        kinds = set(self.placement.layouts.values())
        if not kinds or kinds == {REPACK}:
            return []
        if kinds == {PLAIN}:
            return ["--no-repack"]
        return None

    def emit_args(self) -> list[str]:
        """Arguments reproducing the weight placement in stock llama-server / llama-cli."""
        if self.extra.get("n_cpu_moe") is not None:  # n-cpu-moe's placement (or optimal confirming it)
            return ["-ngl", str(self.n_gpu_layers), "--n-cpu-moe", str(self.extra["n_cpu_moe"])]
        args = ["-ngl", str(self.n_gpu_layers)]
        if not self.stock_layers and self.accelerator:
            spec = self.load_spec()
            # device overrides only: stock -ot cannot choose host layouts (stock_layouts below). Not
            # "every target but a layout name": the plain layout is called "CPU" like the device, and
            # dropping a weight's "=CPU" would let -ngl put it on the accelerator
            layout_ov = set(place.layout_overrides(dict(self.placement.layouts), {}))
            args += place.LoadSpec(spec.assignment, spec.devices, [o for o in spec.overrides if o not in layout_ov],
                                   spec.buffer_types).ot_arguments()
        args += self.stock_layouts() or []
        if self.streams_nothing():  # stock's one switch says exactly that (its default streams at 32 tokens)
            args += ["--no-op-offload"]
        if self.strategy == "flexgen":
            args += ["--op-offload"]  # and GGML_OP_OFFLOAD_MIN_BATCH=1 in the environment
        return args

    def stock_settings(self) -> list[str]:
        """The settings this plan was costed at, pinned for stock llama.cpp. Left unset, llama-server
        runs its own: flash attention `auto`, `--fit on` (which rewrites the context size and the
        placement to fill device memory), 4 slots, 2048/512-token batches, its thread count, none of
        which the plan costed. Flash attention as the plan resolved it (an `auto` workload's result),
        the KV cache's types, and the workload's sequences: `-np N` slots, each with a KV stream of
        its own (`--no-kv-unified`, llama-server's default for a given -np, said) or all in one
        (`--kv-unified`)."""
        s = self.settings
        args: list[str] = []
        if s.get("n_ctx"):
            args += ["-c", str(s["n_ctx"])]
        if s.get("n_ubatch"):  # the runtime runs a plan's passes at n_batch = n_ubatch
            args += ["-b", str(s["n_ubatch"]), "-ub", str(s["n_ubatch"])]
        # --swa-full: a sliding-window layer's cache holds the whole context, as llama-cpp-python's
        # default (and so the plan's bytes) has it; llama-server's own keeps the window only
        args += ["-fa", "on" if s.get("flash_attn") else "off", "-ctk", str(s.get("type_k", "f16")),
                 "-ctv", str(s.get("type_v", "f16")), "--swa-full", "-np", str(s.get("n_seq_max", 1)),
                 *([("--kv-unified" if s.get("kv_unified") else "--no-kv-unified")] if int(s.get("n_seq_max", 1)) > 1
                   else []), "--fit", "off"]
        if s.get("threads"):
            args += ["-t", str(s["threads"]), "-tb", str(s["threads"])]
        if s.get("op_offload") is False and not self.streams_nothing():  # else emit_args says it
            args.append("--no-op-offload")
        if s.get("mmap") is False:
            args.append("--no-mmap")
        return args

    def stock_command(self, binary: str = "llama-server") -> list[str]:
        """The whole stock llama.cpp command line running this plan: the model, the accelerator as
        stock names it (an rpc-server: `--rpc host:port --device RPC0`), `emit_args` (the placement)
        and `stock_settings` (what the plan was costed at)."""
        cmd = [binary, "-m", str(self.model.get("path", "MODEL.gguf"))]
        if self.accelerator:
            ep = devmod.rpc_endpoint(self.accelerator)
            if ep is not None:  # stock numbers one server's devices RPC0, RPC1, ... ("RPC[ep]#1": RPC1)
                index = self.accelerator.rpartition("#")[2] if "#" in self.accelerator else "0"
                cmd += ["--rpc", ep, "--device", f"RPC{index}"]
            else:
                cmd += ["--device", self.accelerator]  # ggml's own name (CUDA0, Vulkan0)
        return cmd + self.emit_args() + self.stock_settings()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "strategy": self.strategy, "model": self.model, "devices": self.devices,
                "accelerator": self.accelerator,
                "budget": {"request": self.budget_request, "bytes": self.budget_bytes},
                "workload": asdict(self.workload), "settings": self.settings, "profile": self.profile_key,
                "build": build_info(), "load": self.load_mode,
                "overrides": [list(o) for o in self.raw_overrides],
                "n_gpu_layers": self.n_gpu_layers, "kv_layers": self.placement.kv_layers,
                "placement": self.assignment(), "layouts": dict(sorted(self.placement.layouts.items())),
                "dual_max_batch": self.placement.dual_max_batch, "host_budget_bytes": self.host_budget,
                "offload_min_batch": {w: (None if b >= NEVER else b) for w, b in self.offload_policy().items()},
                "predicted": self.predicted, "memory": self.memory, "plan_seconds": self.plan_s,
                "extra": {k: v for k, v in self.extra.items() if k != "order"}}

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        try:
            write_json(p, self.to_json())  # atomic: a failed write leaves no partial plan
        except OSError as e:
            raise PlanError(f"{p}: cannot write the plan: {e.strerror or e}") from None
        return p


def _model_doc(ctx: PlanContext) -> dict[str, Any]:
    return {"name": ctx.model.metadata.get("general.name", ctx.model.path.stem), "path": str(ctx.model.path),
            "identity": ctx.model.identity(), "architecture": ctx.model.architecture, "n_layer": ctx.n_layer,
            "weight_bytes": ctx.model.weight_bytes}


def parse_host_budget(value: str | int, host_weight_bytes: int) -> int:
    """Host memory for weights (bytes): bytes as for the GPU budget, or a share of the weights the
    host keeps, up to "200%" (every layout-capable weight in both layouts)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            pct = float(value.strip()[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 200:
            raise PlanError(f"--host-budget {value!r}: a share of the host's weights must be in (0%, 200%]")
        return int(host_weight_bytes * pct / 100)
    return parse_budget(value, host_weight_bytes)


def _host_extra(ctx: PlanContext, p: Placement, host_budget: str | int | None) -> tuple[int, int | None]:
    """(bytes the dual copies may use, the host budget in bytes) for placement p."""
    if host_budget is None:
        return 0, None
    on_host = sum(b for w, b in ctx.weight_bytes.items() if w not in p.on_acc)
    budget = parse_host_budget(host_budget, on_host)
    if budget < on_host:
        raise PlanError(f"--host-budget {host_budget!r} ({budget / 2**20:.1f} MiB) is less than the weights the "
                        f"host keeps ({on_host / 2**20:.1f} MiB); the host budget counts them too")
    return budget - on_host, budget


def unnamed_defaults(ctx: PlanContext, p: Placement) -> Placement:
    """`p` without what llama.cpp's default load does anyway, so that a plan that chose the default
    loads as the baselines do (and `--emit-ot` carries all of it):

      layouts     dropped when every host weight keeps the layout a default load gives it and no
                  host weight sits in a layer n_gpu_layers offloads (its override to the CPU would
                  force plain memory; naming every layout keeps such weights repacked);
      thresholds  a "never stream" entry dropped for a weight whose op no pass of the workload
                  streams by default (an rpc-server has no offload rule of its own: every entry).

    The pass models cost both forms alike: each weight's op runs where it did."""
    layouts = dict(p.layouts)
    if layouts and not p.dual_max_batch:
        costs = layoutmod.weight_costs(ctx, p)
        host = [w for w in ctx.weight_bytes if w not in p.on_acc]
        if (all(w in costs and costs[w].default == lay for w, lay in layouts.items())
                and all(c.default == PLAIN or w in layouts for w, c in costs.items())
                and not place.layer_weights(host, p.n_gpu_layers, ctx.n_layer)):
            layouts = {}
    streamed_by_default: set[str] = set()
    for pm in ctx.passes.values():
        for k in pm.kinds[pm.full(p)].values():
            if k[0] == "w" and k[2] and k[3]:  # ("w", weight, offloadable, default, batch)
                streamed_by_default.add(k[1])
    min_batch = {w: b for w, b in p.min_batch.items() if b < NEVER or w in streamed_by_default}
    if layouts == dict(p.layouts) and min_batch == dict(p.min_batch):
        return p
    return Placement(p.on_acc, p.kv_layers, min_batch, layouts, p.dual_max_batch if layouts else 0)


def make_plan(ctx: PlanContext, strategy: str, budget: str | int | None, *, progress: bool = False,
              candidates: Sequence[Plan] = (), time_limit: float | None = None,
              host_budget: str | int | None = None) -> Plan:
    """Plan with `strategy` within `budget`, verified against llama.cpp's memory accounting.
    candidates: plans already made for this budget (optimal starts from the best of them and
    keeps one that is predicted faster, saying so in extra["winner"]); time_limit: seconds the
    exact solver may search per offload mode (default strategies.TIME_LIMIT_S); host_budget:
    host memory for weights, which dual layouts may fill (None: no dual layouts).
    A CPU-only context (ctx.acc None) takes no budget: `layers` is llama.cpp's default, and the
    layout strategies choose host layouts only."""
    s = strategies.get(strategy)
    t0 = time.perf_counter()
    if ctx.acc is None:
        if budget is not None:
            raise PlanError("a GPU budget needs an accelerator (name one with --device or --rpc-local)")
        if s.baseline:
            raise PlanError(f"strategy '{strategy}' needs an accelerator")
        budget_bytes = 0
        placed = strategies.Placed(Placement(), {"total": 0}, {"cpu_only": True}, stock_layers=True)
    else:
        if budget is None:
            raise PlanError(f"strategy '{strategy}' needs a GPU budget (bytes such as '12GiB' or a share such as '50%')")
        budget_bytes = parse_budget(budget, ctx.model.weight_bytes)
        search = Search(tuple(candidates), TIME_LIMIT_S if time_limit is None else time_limit, progress)
        placed = s.place(ctx, budget_bytes, search)
    placement, details, host_bytes = placed.placement, dict(placed.details), None
    if ctx.acc is not None and (over := confirmmod.over_budget_bytes(placed.memory, budget_bytes)):
        # a strategy not fitted to the budget (llama.cpp's own, flexgen): -ngl 0 still puts op offload's
        # compute buffers on the accelerator; kept for comparison, never kept by a confirmation
        details["over_budget_bytes"] = over
        if progress:
            log(f"{s.name}: its load takes {placed.memory['total'] / 2**20:.0f} MiB on {ctx.acc}, "
                f"{over / 2**20:.0f} MiB over the budget: a confirmation compares with it, never keeps it")
    if s.name in LAYOUT_STRATEGIES and not placed.raw_overrides:
        extra, host_bytes = _host_extra(ctx, placement, host_budget)
        placement, lay_details = layoutmod.choose(ctx, placement, extra)
        details["layout_choice"] = lay_details
        placement = unnamed_defaults(ctx, placement)
    plan = Plan(s.name, ctx.acc, placement, budget_bytes, str(budget) if budget is not None else "",
                ctx.workload, ctx.predict(placement), placed.memory, _model_doc(ctx), ctx.settings, ctx.profile.key,
                placed.stock_layers, 0.0, details, sorted(ctx.weight_bytes), placed.raw_overrides, host_bytes)
    with_stock_memory(ctx, plan)
    plan.plan_s = time.perf_counter() - t0
    return plan


def with_stock_memory(ctx: PlanContext, plan: Plan) -> Plan:
    """`plan`, with extra["stock_memory"] measured where its stock command streams otherwise than it
    does (`Plan.stock_streams_as_planned`): the stock command streams by llama.cpp's own rule, so its
    compute buffers are those of the placement loaded with no per-weight thresholds. A stock_layers or
    fit placement is measured as stock loads it already; flexgen's command sets stock's global
    threshold instead."""
    if plan.stock_streams_as_planned() or plan.stock_layers or plan.raw_overrides or plan.strategy == "flexgen":
        return plan
    p = plan.placement
    plan.extra["stock_memory"] = measure_memory(ctx, Placement(p.on_acc, p.kv_layers, {}, p.layouts, p.dual_max_batch))
    return plan


def confirm_strategies(ctx: PlanContext) -> tuple[str, ...]:
    """The strategies whose plans a confirmation shortlists from: llama.cpp's own placements (on the
    CPU alone its default load; `n-cpu-moe` only for a mixture of experts), then oallama's."""
    if ctx.acc is None:
        return ("layers", "optimal")
    moe = bool(strategies.expert_layers(ctx.weight_bytes))
    return ("layers", "fit", *(("n-cpu-moe",) if moe else ()), "affinity", "optimal")


def make_plans(ctx: PlanContext, budget: str | int | None, wanted: Sequence[str], *, optional: Sequence[str] = (),
               time_limit: float | None = None, host_budget: str | int | None = None,
               progress: bool = False) -> dict[str, Plan]:
    """Plans of the `wanted` strategies, `optimal` last and started from the others. A strategy in
    `optional` that cannot plan here (`fit` without llama.cpp's common library, say) is left out,
    saying why when `progress`."""
    order = [s for s in wanted if s != "optimal"] + [s for s in wanted if s == "optimal"]
    plans: dict[str, Plan] = {}
    for s in order:
        try:
            plans[s] = make_plan(ctx, s, budget, candidates=list(plans.values()), time_limit=time_limit,
                                 host_budget=host_budget)
        except PlanError as e:
            if s not in optional:
                raise
            if progress:
                print(f"plan: no '{s}' plan to compare with ({e})", file=sys.stderr)
    return plans


def confirmed(ctx: PlanContext, budget: str | int | None, opts: ConfirmOptions, *, load: Mapping[str, Any] | None = None,
              time_limit: float | None = None, host_budget: str | int | None = None, progress: bool = False,
              plans: dict[str, Plan] | None = None) -> tuple[Plan, dict[str, Plan], Confirmation | None]:
    """The `optimal` plan, confirmed by measurement (`confirm`) against the plans of
    `confirm_strategies` (those in `plans` reused, the rest made): (the kept plan, every plan made,
    the confirmation; None when opts.confirm is off: the predicted plan)."""
    want = confirm_strategies(ctx)
    plans = dict(plans or {})
    plans.update(make_plans(ctx, budget, [s for s in want if s not in plans], optional=("fit", "n-cpu-moe"),
                            time_limit=time_limit, host_budget=host_budget, progress=progress))
    if not opts.confirm or ctx.model.shape_only:  # a shape-only file (zero weights) is never run
        if opts.confirm and progress:
            log(f"{ctx.model.path} is shape-only: the plan is not confirmed by measurement")
        return plans["optimal"], plans, None
    shortlisted = {s: p for s, p in plans.items() if s in want}
    if ctx.acc is None:  # llama.cpp's --no-repack (beside a GPU its plain weights would be in pinned memory)
        plain = layoutmod.with_plain_layouts(ctx, plans["layers"], sorted(layoutmod.weight_costs(ctx, Placement())))
        if plain is not None:
            shortlisted[NO_REPACK_LABEL] = plain
    variant = layoutmod.with_default_layouts(ctx, plans["optimal"])
    if variant is not None:
        shortlisted[DEFAULT_LAYOUTS_LABEL] = variant
    conf = confirmmod.confirm(ctx, shortlisted, opts, load=load, progress=progress)
    return conf.plan, plans, conf


def placement_of(doc: Mapping[str, Any]) -> Placement:
    """The placement a plan file's JSON records (`Plan.to_json`), to be costed again."""
    on = frozenset(w for w, dev in doc["placement"].items() if dev == doc["accelerator"])
    mb = {w: (NEVER if b is None else int(b)) for w, b in (doc.get("offload_min_batch") or {}).items()}
    return Placement(on, doc["kv_layers"], mb, doc.get("layouts") or {}, doc.get("dual_max_batch") or 0)


def read_plan(path: str | Path, model: gguf_file.GGUFInfo | None = None) -> dict[str, Any]:
    """A plan file's JSON, checked: schema, and (given the model) that it was made for it."""
    return planfile.read_document(path, model)


class LoadPlanner:
    """The planner `Llama(placement=<strategy>, gpu_budget=...)` asks (runtime.planfile.Planner);
    the top-level package installs it, so the runtime never imports this module."""

    strategies = STRATEGIES + BASELINES

    def __call__(self, model_path: Path, strategy: str, budget: str | int | None, *, device: str | None,
                 workload: Any, profile: Any, threads: int | None, op_offload: bool, n_ubatch: int,
                 progress: bool, host_budget: str | int | None = None, confirm: ConfirmOptions | None = None,
                 load: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if isinstance(workload, Mapping):
            workload = Workload(**{"n_ubatch": n_ubatch, **workload})
        wl = workload or Workload(n_ubatch=n_ubatch)
        if isinstance(profile, (str, Path)):
            profile = Profile.load(profile)
        ctx = build_context(model_path, device, wl, profile=profile, threads=threads, op_offload=op_offload,
                            progress=progress)
        opts = confirm or ConfirmOptions()
        if strategy != "optimal" or not opts.confirm:
            return make_plan(ctx, strategy, budget, host_budget=host_budget).to_json()
        return confirmed(ctx, budget, opts, load=load, host_budget=host_budget, progress=progress)[0].to_json()


__all__ = ["BASELINES", "LAYOUT_STRATEGIES", "OBJECTIVES", "SCHEMA", "STRATEGIES", "LoadPlanner", "Plan",
           "PlanContext", "Workload", "affinity_order", "build_context", "make_plan", "measure_memory",
           "parse_budget", "parse_host_budget", "place_affinity", "place_layers", "read_plan"]
