"""`oallama plan`: plan a model for a budget and workload, print the plan per layer, every
strategy's prediction beside it, what the confirmation measured, and the stock llama.cpp command
(`--emit-ot`); write the plan file (`-o`). The planning itself is `planner.plan`'s."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import PlanError
from ..model import gguf_file
from ..options import add_arguments, from_args, group, option
from ..runtime import devices as devmod
from ..runtime.planfile import ConfirmOptions
from . import layouts as layoutmod
from .confirm import Confirmation
from .context import CALIBRATIONS, PlanContext, build_context, parse_budget
from .cost.profile import DUAL, PLAIN, REPACK, Profile
from .cost.schedmodel import NEVER, Placement
from .plan import Plan, confirmed, make_plans, parse_host_budget
from .strategies import BASELINES, STRATEGIES, TIME_LIMIT_S
from .workload import Workload


@dataclass
class PlanOptions:
    """Everything `oallama plan` takes (its flags are generated from these fields)."""

    model: Path = option(positional=True, help="GGUF model file")
    gpu_budget: str | None = option(None, help="bytes ('12GiB') or a share of the weights ('50%') on the accelerator",
                                    default_help="none: a CPU-only plan (host weight layouts only)")
    host_budget: str | None = option(None, help="host memory for weights ('20GiB', or up to '200%' of the host's "
                                     "weights): dual layouts may use what the weights leave",
                                     default_help="no dual layouts")
    device: str | None = option(None, help="the accelerator", default_help="the first GPU")
    rpc_local: bool = option(False, help="use a loopback rpc-server as the accelerator")
    rpc_threads: int = option(1, minimum=1, help="threads of that rpc-server")
    strategy: str = option("optimal", choices=STRATEGIES + BASELINES, help="the plan to show and write (a "
                           "baseline - fit, flexgen, n-cpu-moe - is planned only when asked for)")
    workload: Workload = group(Workload)
    threads: int | None = option(None, minimum=1, help="CPU threads", default_help="the profiler's")
    profile: Path | None = option(None, help="use this profile JSON instead of measuring (or the cache)")
    calibration: str = option("auto", choices=CALIBRATIONS, help="what a profile measured here is calibrated with: "
                              "the model's own real graph (model), or the devices' model, characterised once on a "
                              "reference model (device); auto: device for a shape-only file (never run), else model")
    time_limit: float = option(TIME_LIMIT_S, help="seconds the exact solver may search per mode (the best plan "
                               "found is kept)")
    confirm: ConfirmOptions = group(ConfirmOptions)  # --strategy optimal: the choice confirmed by measurement
    emit_ot: bool = option(False, help="print -ngl/-ot arguments for stock llama.cpp")
    output: Path | None = option(None, short="-o", help="write the chosen plan here")
    progress: bool = option(True, off="--quiet", help="show progress on stderr")


def layer_table(ctx: PlanContext, plan: Plan) -> str:
    """Per layer: weights on the accelerator, their bytes, the host layouts, and the predicted gain
    of the plan over llama.cpp's default for that layer (weights on the host, default layouts;
    workload-weighted compute time, ms)."""
    pw = ctx.workload.pass_weights()
    base = Placement()
    gain: dict[str, float] = {}
    for n, pm in ctx.passes.items():
        dev = pm.cost(plan.placement).on_acc
        for i in pm.targets:
            th = pm.host_us(i, base)
            w = pm.graph.nodes[i].weight
            gain[w] = gain.get(w, 0.0) + pw.get(n, 0.0) * (th - (pm.t_acc[i] if dev[i] else
                                                                 pm.host_us(i, plan.placement))) / 1e3
    rows: dict[str, list[str]] = {}
    for w in sorted(ctx.weight_bytes):
        m = re.match(r"^blk\.(\d+)\.", w)
        rows.setdefault(m[1] if m else "-", []).append(w)
    lays = plan.placement.layouts
    short = {PLAIN: "P", REPACK: "R", DUAL: "D"}
    acc = ctx.acc or "-"
    lines = [f"{'layer':>6} {'on ' + acc:<40} {'MiB':>9} {'layouts':<12} {'gain ms':>9}  kv"]
    for key in sorted(rows, key=lambda k: -1 if k == "-" else int(k)):
        ws = rows[key]
        on = [w for w in ws if w in plan.placement.on_acc]
        streamed = [w for w in ws if w not in plan.placement.on_acc and plan.placement.min_batch.get(w, NEVER) < NEVER]
        names = " ".join(w.split(".")[-2] if key != "-" else w for w in on) or "-"
        if streamed:
            names += f" (+{len(streamed)} streamed)"
        counts = {c: sum(1 for w in ws if lays.get(w) == lay) for lay, c in short.items()}
        lay_text = " ".join(f"{c}{k}" for k, c in ((c, counts[c]) for c in short.values()) if c) or "-"
        kv = "acc" if key != "-" and int(key) >= ctx.n_layer - plan.placement.kv_layers else ""
        lines.append(f"{key:>6} {names[:40]:<40} {sum(ctx.weight_bytes[w] for w in on) / 2**20:>9.1f} "
                     f"{lay_text:<12} {sum(gain.get(w, 0.0) for w in ws):>9.2f}  {kv}")
    lines.append("layouts: P plain, R repacked (CPU_REPACK), D both (CPU_REPACK_DUAL); "
                 "gain: vs llama.cpp's default for the layer")
    return "\n".join(lines)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..runtime.rpc import local_server_if

    o = from_args(PlanOptions, args)
    info = gguf_file.check_model(o.model)
    cpu_only = o.gpu_budget is None
    if cpu_only and (o.device or o.rpc_local):
        raise PlanError("--device / --rpc-local need --gpu-budget (without one the plan is CPU-only)")
    if not cpu_only:
        parse_budget(o.gpu_budget, info.weight_bytes)  # refuse a bad budget before any work
    if o.host_budget is not None:
        parse_host_budget(o.host_budget, info.weight_bytes)
    with local_server_if(o.rpc_local and not o.device, o.rpc_threads) as server:
        acc: str | None = None
        if o.device:
            acc = devmod.resolve(o.device).name
        elif server is not None:
            acc = server.device_name
        elif not cpu_only:
            found = devmod.default_accelerator()
            if found is None:
                raise PlanError("no accelerator here: name one with --device (e.g. RPC[host:port]) or use --rpc-local; "
                                "without --gpu-budget the plan is CPU-only")
            acc = found.name
        wl = o.workload
        prof = Profile.load(o.profile) if o.profile else None
        ctx = build_context(o.model, acc, wl, profile=prof, threads=o.threads, progress=o.progress,
                            calibration=o.calibration)
        order = ("layers", "optimal") if cpu_only else STRATEGIES
        if o.strategy not in order:  # a baseline: compared only when asked for
            order = (*order, o.strategy)
        conf: Confirmation | None = None
        if o.strategy == "optimal" and o.confirm.confirm:
            chosen, plans, conf = confirmed(ctx, o.gpu_budget, o.confirm, time_limit=o.time_limit,
                                            host_budget=o.host_budget, progress=o.progress)
        else:
            plans = make_plans(ctx, o.gpu_budget, order, time_limit=o.time_limit, host_budget=o.host_budget)
            chosen = plans[o.strategy]
        where = "CPU only" if cpu_only else f"budget {parse_budget(o.gpu_budget, ctx.model.weight_bytes) / 2**20:.1f} " \
                                            f"MiB on {acc}"
        print(f"{ctx.model.path.name}: {ctx.model.weight_bytes / 2**20:.1f} MiB of weights, {ctx.n_layer} layers; "
              f"{where}; workload prompt {wl.prompt}, gen {wl.gen}"
              f"{f' in each of {wl.parallel} sequences' if wl.parallel > 1 else ''}, objective {wl.objective}; "
              f"threads {ctx.settings['threads']}")
        print(f"\nplan '{chosen.strategy}':")
        print(layer_table(ctx, chosen))
        print(f"\n{'strategy':<10} {'on acc MiB':>10} {'TTFT ms':>10} {'TPOT ms':>10} {'e2e ms':>10} {'splits':>7} "
              f"{'plan s':>7}  host layouts")
        rows = [(("default" if cpu_only and s == "layers" else s), p.memory["total"], p.predicted, p.plan_s,
                 layoutmod.summary(p.placement.layouts) if p.placement.layouts else "llama.cpp's")
                for s, p in plans.items()]
        if cpu_only or any(p.placement.layouts for p in plans.values()):
            # a plan that kept llama.cpp's layouts names none: its weights that have both still compare
            both = chosen.placement.layouts or layoutmod.weight_costs(ctx, chosen.placement)
            if both:
                plain = chosen.placement.with_layouts({w: PLAIN for w in both})
                rows.insert(1, ("all plain", chosen.memory["total"], ctx.predict(plain), 0.0, "--no-repack"))
        for name, mem, pred, secs, lay in rows:
            print(f"{name:<10} {mem / 2**20:>10.1f} {pred['ttft_ms']:>10.2f} {pred['tpot_ms']:>10.2f} "
                  f"{pred['e2e_ms']:>10.2f} {pred['passes'][str(wl.decode_pass)]['splits']:>7} {secs:>7.2f}  {lay}")
        lay_choice = chosen.extra.get("layout_choice", {})
        if lay_choice.get("dual_extra_bytes"):
            print(f"dual layouts: {lay_choice['dual_extra_bytes'] / 2**20:.1f} MiB more host memory "
                  f"(repacked copy below {lay_choice['dual_max_batch']} tokens per batch)")
        elif o.host_budget is None and chosen.placement.layouts:
            print("dual layouts: off (give --host-budget to let weights keep both layouts)")
        opt = plans["optimal"].extra if chosen.strategy == "optimal" else {}  # the solver's account, when shown
        if not cpu_only and opt and opt.get("winner") == "host":
            print("optimal: the solver found no placement within the budget; every weight stays on the host")
        elif not cpu_only and opt and opt.get("winner") != "solver":
            print(f"optimal: the solver found no placement that fits and is predicted faster than "
                  f"'{opt['winner']}'; keeping it")
        elif not cpu_only and opt.get("solver_status"):
            gap = float(opt.get("mip_gap") or 0.0)
            print(f"optimal: {'proven optimal' if gap <= 1e-6 else f'best found, within {gap:.1%} of optimal'} "
                  f"(HiGHS, {opt.get('solve_seconds_total', 0.0):.1f} s; raise the limit with --time-limit)")
        if conf is not None:
            print("\n" + confirmation_table(conf))
        if o.emit_ot:
            print("\nstock llama.cpp equivalent of the weight placement (llama-cli takes the same arguments):")
            print(" ".join(_shell_quote(a) for a in chosen.stock_command()))
            if not chosen.stock_streams_as_planned():
                mib = {k: chosen.stock_memory.get(k, 0) / 2**20 for k in ("total", "compute")}
                print("# per-tensor streaming thresholds need oallama (stock llama.cpp has one global "
                      "GGML_OP_OFFLOAD_MIN_BATCH, and streams nothing to an rpc-server): this command streams by "
                      f"stock's rule and takes {mib['total']:.1f} MiB on {chosen.accelerator} "
                      f"({mib['compute']:.1f} MiB compute buffers), the plan {chosen.memory['total'] / 2**20:.1f}")
            if chosen.stock_layouts() is None:
                print("# per-weight host layouts (mixed, or both kept) need oallama: stock -ot names only devices' "
                      "buffer types; the nearest single layout is the default (repacked) or --no-repack")
        if o.output:
            print(f"\nwrote {chosen.save(o.output)}")
    return 0


def confirmation_table(conf: Confirmation) -> str:
    """What the confirmation measured, per candidate, and what it kept."""
    wl = conf.plan.workload
    how = {"together": "loaded together", "in turn": "loaded one at a time", "cached": "cached",
           "none": "nothing to measure"}[conf.mode]
    lines = [f"confirmation ({conf.seconds:.1f} s, {conf.rounds} round(s), {how}): {wl.objective} of prompt "
             f"{wl.prompt}, {conf.to_json()['measured_as'].split(', then ')[-1]}",
             f"{'plan':<28} {'predicted ms':>12} {'measured ms':>12} {'vs base':>8} {'spread':>7}"]
    for c in conf.candidates:
        m = c.measured()
        r = conf.ratios.get(c.label, {})
        meas = f"{m['objective_ms']:>12.1f}" if m else f"{'failed' if c.error else '-':>12}"
        vs = f"{r['vs_baseline']:>8.3f}" if "vs_baseline" in r else f"{'-':>8}"
        spread = f"{r['spread']:>7.1%}" if "spread" in r else f"{'-':>7}"
        mark = " *" if c is conf.chosen else ""
        lines.append(f"{c.label[:28]:<28} {c.predicted_ms:>12.1f} {meas} {vs} {spread}{mark}")
    lines.append("vs base: round by round over the best of llama.cpp's placements (median; spread: half the range)")
    lines.append(f"kept (*): {conf.reason}")
    return "\n".join(lines)


def _shell_quote(a: str) -> str:
    return a if re.fullmatch(r"[\w.,:=/+-]+", a) else "'" + a.replace("'", "'\\''") + "'"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="decide per tensor what goes on the accelerator for a memory budget")
    add_arguments(p, PlanOptions)
    p.set_defaults(func=_cmd_plan)


__all__ = ["PlanOptions", "confirmation_table", "layer_table", "register"]
