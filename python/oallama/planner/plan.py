"""Plan: decide, tensor by tensor, what lives on the accelerator, for a memory budget and a
stated workload; predict TTFT and TPOT; write the plan file `Llama(placement=...)` loads (seed 002).

`make_plan` builds every plan, whatever its strategy, in one place: the strategy (`strategies`:
layers, affinity, optimal, and the benchmark baselines fit and flexgen) places the weights within
the budget, checked with llama.cpp's own memory accounting (`verify`); the plan adds the
prediction of the workload (`context.PlanContext`) and becomes the plan file. `LoadPlanner` is what
`Llama(placement="optimal", gpu_budget=...)` asks; `oallama plan` is the command.

Budget: bytes ("12GiB", "512MiB", "8000000000") or a share of the model's weights ("50%"). The
KV cache, compute buffers and streamed weights that a placement puts on the accelerator count
against it.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._files import write_json
from ..errors import PlanError
from ..model import gguf_file
from ..options import add_arguments, from_args, group, option
from ..runtime import devices as devmod
from ..runtime import place, planfile
from . import strategies
from .context import OBJECTIVES, PlanContext, Workload, build_context, parse_budget
from .profile import Profile, build_info
from .schedmodel import HOST, NEVER, Placement
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

SCHEMA = planfile.PLAN_SCHEMA


# --- plans --------------------------------------------------------------------------------------


@dataclass
class Plan:
    """One strategy's placement for one budget and workload, with its prediction and llama.cpp's
    accounting of its memory; `to_json` is the plan file."""

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
            overrides = [] if self.stock_layers else place.compile_patterns(
                place.explicit(self.assignment(), self.n_gpu_layers, int(self.model.get("n_layer", 0))))
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
        try:
            write_json(p, self.to_json())  # atomic: a failed write leaves no partial plan
        except OSError as e:
            raise PlanError(f"{p}: cannot write the plan: {e.strerror or e}") from None
        return p


def _model_doc(ctx: PlanContext) -> dict[str, Any]:
    return {"name": ctx.model.metadata.get("general.name", ctx.model.path.stem), "path": str(ctx.model.path),
            "identity": ctx.model.identity(), "architecture": ctx.model.architecture, "n_layer": ctx.n_layer,
            "weight_bytes": ctx.model.weight_bytes}


def make_plan(ctx: PlanContext, strategy: str, budget: str | int, *, progress: bool = False,
              candidates: Sequence[Plan] = (), time_limit: float | None = None) -> Plan:
    """Plan with `strategy` within `budget`, verified against llama.cpp's memory accounting.
    candidates: plans already made for this budget (optimal starts from the best of them and
    keeps one that is predicted faster, saying so in extra["winner"]); time_limit: seconds the
    exact solver may search per offload mode (default strategies.TIME_LIMIT_S)."""
    s = strategies.get(strategy)
    budget_bytes = parse_budget(budget, ctx.model.weight_bytes)
    search = Search(tuple(candidates), TIME_LIMIT_S if time_limit is None else time_limit, progress)
    t0 = time.perf_counter()
    placed = s.place(ctx, budget_bytes, search)
    elapsed = time.perf_counter() - t0
    return Plan(s.name, ctx.acc, placed.placement, budget_bytes, str(budget), ctx.workload,
                ctx.predict(placed.placement), placed.memory, _model_doc(ctx), ctx.settings, ctx.profile.key,
                placed.stock_layers, elapsed, placed.details, sorted(ctx.weight_bytes), placed.raw_overrides)


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


# --- CLI ----------------------------------------------------------------------------------------


@dataclass
class PlanOptions:
    """Everything `oallama plan` takes (its flags are generated from these fields)."""

    model: Path = option(positional=True, help="GGUF model file")
    gpu_budget: str = option(help="bytes ('12GiB') or a share of the weights ('50%')")
    device: str | None = option(None, help="the accelerator", default_help="the first GPU")
    rpc_local: bool = option(False, help="use a loopback rpc-server as the accelerator")
    rpc_threads: int = option(1, minimum=1, help="threads of that rpc-server")
    strategy: str = option("optimal", choices=STRATEGIES, help="the plan to show and write")
    workload: Workload = group(Workload)
    threads: int | None = option(None, minimum=1, help="CPU threads", default_help="the profiler's")
    profile: Path | None = option(None, help="use this profile JSON instead of measuring (or the cache)")
    time_limit: float = option(TIME_LIMIT_S, help="seconds the exact solver may search per mode (the best plan "
                               "found is kept)")
    emit_ot: bool = option(False, help="print -ngl/-ot arguments for stock llama.cpp")
    output: Path | None = option(None, short="-o", help="write the chosen plan here")
    progress: bool = option(True, off="--quiet", help="show progress on stderr")


def layer_table(ctx: PlanContext, plan: Plan) -> str:
    """Per layer: weights on the accelerator, their bytes, and the predicted gain of the plan
    over keeping that layer's ops on the host (workload-weighted compute time, ms)."""
    pw = ctx.workload.pass_weights()
    gain: dict[str, float] = {}
    for n, pm in ctx.passes.items():
        dev = pm.cost(plan.placement).on_acc
        for i in pm.targets:
            th = pm.t_host[i]
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

    o = from_args(PlanOptions, args)
    parse_budget(o.gpu_budget, gguf_file.check_model(o.model).weight_bytes)  # refuse a bad budget before any work
    with local_server_if(o.rpc_local and not o.device, o.rpc_threads) as server:
        if o.device:
            acc = devmod.resolve(o.device).name
        elif server is not None:
            acc = server.device_name
        else:
            found = devmod.default_accelerator()
            if found is None:
                raise PlanError("no accelerator here: name one with --device (e.g. RPC[host:port]) or use --rpc-local")
            acc = found.name
        wl = o.workload
        prof = Profile.load(o.profile) if o.profile else None
        ctx = build_context(o.model, acc, wl, profile=prof, threads=o.threads, progress=o.progress)
        budget_bytes = parse_budget(o.gpu_budget, ctx.model.weight_bytes)
        plans: dict[str, Plan] = {}
        for s in STRATEGIES:
            plans[s] = make_plan(ctx, s, o.gpu_budget, candidates=list(plans.values()), time_limit=o.time_limit)
        chosen = plans[o.strategy]
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
        if opt.get("winner") == "host":
            print("optimal: the solver found no placement within the budget; every weight stays on the host")
        elif opt.get("winner") != "solver":
            print(f"optimal: the solver found no placement that fits and is predicted faster than "
                  f"'{opt['winner']}'; keeping it")
        elif opt.get("solver_status"):
            gap = float(opt.get("mip_gap") or 0.0)
            print(f"optimal: {'proven optimal' if gap <= 1e-6 else f'best found, within {gap:.1%} of optimal'} "
                  f"(HiGHS, {opt.get('solve_seconds_total', 0.0):.1f} s; raise the limit with --time-limit)")
        if o.emit_ot:
            print("\nstock llama.cpp equivalent of the weight placement:")
            print(" ".join(_shell_quote(a) for a in chosen.emit_args()))
            if chosen.offload_policy():
                print("# per-tensor streaming thresholds need oallama (stock llama.cpp has one global "
                      "GGML_OP_OFFLOAD_MIN_BATCH)")
        if o.output:
            print(f"\nwrote {chosen.save(o.output)}")
    return 0


def _shell_quote(a: str) -> str:
    return a if re.fullmatch(r"[\w.,:=/+-]+", a) else "'" + a.replace("'", "'\\''") + "'"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="decide per tensor what goes on the accelerator for a memory budget")
    add_arguments(p, PlanOptions)
    p.set_defaults(func=_cmd_plan)


__all__ = ["BASELINES", "OBJECTIVES", "SCHEMA", "STRATEGIES", "LoadPlanner", "Plan", "PlanContext", "PlanOptions",
           "Workload", "affinity_order", "build_context", "make_plan", "measure_memory", "parse_budget",
           "place_affinity", "place_layers", "read_plan"]
