#!/usr/bin/env python3
"""Benchmark: how long planning takes for a full-size model (issue 3's targets: a 32B-shaped
model planned in < 1 s with `affinity` and < 5 s with `optimal`; issue 15's: a 30B-A3B mixture of
experts in < 2 s with `optimal`, with llama.cpp's --n-cpu-moe and --fit predicted beside it).

The model is a shape-only synthetic GGUF (real shapes and quantization mix, zero data: planning
never reads weights). The accelerator is the first GPU, else a loopback rpc-server. Timings
are split into the planning algorithm itself and the verification of the plan's memory with
llama.cpp's own accounting (metadata-only loads). The profile is measured once (cached).

    python bench/scripts/bench_plan.py --preset qwq-32b --budget 50% [--reps 3] [-o bench/results/...]
    python bench/scripts/bench_plan.py --preset qwen3-30b-a3b --strategies layers,fit,n-cpu-moe,affinity,optimal \
        --no-calibrate   # a shape-only file has no weights to run the real graph with
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import oallama  # noqa: F401
from oallama.model import synthetic
from oallama.planner import plan
from oallama.planner.cost.profile import _cpu_name, build_info, cpu_detail
from oallama.runtime import devices, rpc


def _time_strategy(ctx: plan.PlanContext, strategy: str, budget_text: str, reps: int) -> dict:
    """Median/stdev of one strategy's planning time: the algorithm alone, and make_plan as
    `oallama plan` runs it (optimal gets the baselines as candidates; memory checks are
    metadata-only loads of the planned placement)."""
    budget = plan.parse_budget(budget_text, ctx.model.weight_bytes)
    algo, total = [], []
    for _ in range(reps):
        cands = [] if strategy != "optimal" else [plan.make_plan(ctx, s, budget_text) for s in ("layers", "affinity")]
        t1 = time.perf_counter()
        if strategy == "affinity":
            plan.place_affinity(ctx, budget)
        elif strategy == "layers":
            plan.place_layers(ctx, 1)
        t2 = time.perf_counter()
        p = plan.make_plan(ctx, strategy, budget_text, candidates=cands)
        total.append(time.perf_counter() - t2)
        algo.append(float(p.extra.get("solve_seconds_total", 0.0)) if strategy == "optimal" else t2 - t1)
    keep = ("vars", "rows", "solve_seconds_total", "rounds", "n_gpu_layers", "n_cpu_moe", "attempts", "winner", "solver_status",
            "mip_gap", "modes")
    return {"budget": budget_text, "strategy": strategy, "algorithm_s_median": statistics.median(algo),
            "algorithm_s_stdev": statistics.stdev(algo) if len(algo) > 1 else 0.0,
            "with_memory_check_s_median": statistics.median(total),
            "with_memory_check_s_stdev": statistics.stdev(total) if len(total) > 1 else 0.0,
            "n": reps, "predicted_e2e_ms": p.predicted["e2e_ms"], "predicted_ttft_ms": p.predicted["ttft_ms"],
            "predicted_tpot_ms": p.predicted["tpot_ms"], "acc_MiB": p.memory["total"] / 2**20,
            "budget_MiB": budget / 2**20, "extra": {k: v for k, v in p.extra.items() if k in keep}}


def _compare_solvers(ctx: plan.PlanContext, budgets: list[str], limit: float) -> list[dict]:
    """optimal's program at each budget and offload mode, by HiGHS alone and by chaindp alone."""
    from oallama.planner.solvers import chaindp, optimal

    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    rows = []
    for budget_text in budgets:
        budget = plan.parse_budget(budget_text, ctx.model.weight_bytes)
        for full in (False, True):
            for method in ("milp", "dp"):
                t0 = time.perf_counter()
                try:
                    sol = optimal.solve(passes, weight_bytes=ctx.weight_bytes, kv_bytes=ctx.kv_bytes, budget=budget,
                                        full=full, time_limit=limit, method=method)
                    status = "nothing fits" if sol is None else (
                        "proven optimal" if sol.gap <= 1e-6 else f"{sol.status}, gap {sol.gap:.2%}")
                except chaindp.NotDecomposable as e:
                    sol, status = None, f"stopped: {e}"
                rows.append({"budget": budget_text, "mode": "full" if full else "partial", "method": method,
                             "seconds": time.perf_counter() - t0, "status": status,
                             "objective_ms": None if sol is None else sol.objective_us / 1e3})
                print(f"{budget_text:>4} {rows[-1]['mode']:7s} {method:4s} {rows[-1]['seconds']:.2f} s {status}",
                      file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwq-32b")
    ap.add_argument("--type", default="q4_k_m")
    ap.add_argument("--budget", default="25%,50%,75%", help="comma-separated budgets")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--strategies", default=",".join(plan.STRATEGIES), help="comma-separated; baselines too")
    ap.add_argument("--time-limits", default="", help="also: optimal at the first budget under each of these "
                    "solver limits (comma-separated seconds), predicted objective beside the limit")
    ap.add_argument("--no-calibrate", action="store_true", help="plan with the one-op profile alone (a shape-only "
                    "model's zero weights cannot be run for the calibration)")
    ap.add_argument("--compare-solvers", type=float, default=0.0, metavar="SECONDS",
                    help="also: the program of optimal solved by HiGHS alone and by the dynamic program alone at each "
                    "budget and offload mode, each within this limit (objective, status, seconds)")
    ap.add_argument("--no-op-offload", action="store_true", help="plan without per-weight op offload (no weight "
                    "is streamed: llama.cpp's op_offload off)")
    ap.add_argument("--model-dir", default="build/bench-models")
    ap.add_argument("-o", "--out", default=None, help="results directory (default bench/results/<date>-<machine>/plan)")
    args = ap.parse_args()

    model = Path(args.model_dir) / f"{args.preset}-{args.type}-shape.gguf"
    model.parent.mkdir(parents=True, exist_ok=True)
    if not model.exists():
        synthetic.write_model(model, args.preset, args.type, shape_only=True, progress=False)
    server = None
    acc = devices.default_accelerator()
    if acc is None or acc.kind == "rpc":
        server = rpc.start_server(threads=args.threads or 1)
        acc = devices.resolve(server.device_name)
    try:
        wl = plan.Workload(args.prompt, args.gen, "e2e")
        t0 = time.perf_counter()
        prof = None
        if args.no_calibrate:
            from oallama.planner.cost.measure import profile_model
            from oallama.planner.cost.profile import DEFAULT_TOKENS

            prof = profile_model(model, ["CPU", acc.name], threads=args.threads, n_tokens=DEFAULT_TOKENS,
                                 n_ctx=wl.n_ctx, calibrated=False)
        ctx = plan.build_context(model, acc.name, wl, profile=prof, threads=args.threads, progress=True,
                                 op_offload=not args.no_op_offload)
        context_s = time.perf_counter() - t0
        rows = []
        for budget_text in args.budget.split(","):
            for strategy in args.strategies.split(","):
                rows.append(_time_strategy(ctx, strategy, budget_text, args.reps))
                print(f"{budget_text:>4} {strategy:9s} algorithm {rows[-1]['algorithm_s_median']:.3f} s, "
                      f"with memory checks {rows[-1]['with_memory_check_s_median']:.3f} s", file=sys.stderr)
        record = {"benchmark": "plan_time", "model": {"preset": args.preset, "type": args.type,
                                                      "n_layer": ctx.n_layer, "target_ops": sum(
                                                          len(pm.t_host) for pm in ctx.passes.values()),
                                                      "weight_GiB": ctx.model.weight_bytes / 2**30},
                  "device": {"accelerator": acc.name, "kind": acc.kind, "cpu": _cpu_name(), "cpu_detail": cpu_detail(),
                             "machine": platform.node()},
                  "settings": ctx.settings, "workload": {"prompt": wl.prompt, "gen": wl.gen, "objective": "e2e"},
                  "build": build_info(), "context_build_s": context_s, "profile_s": ctx.profile.elapsed_s,
                  "calibrated": ctx.profile.calibration is not None,
                  "results": rows}
        out = Path(args.out or f"bench/results/{date.today()}-{platform.node()}/plan")
        out.mkdir(parents=True, exist_ok=True)
        stem = f"plan_time_{args.preset}{'_no_op_offload' if args.no_op_offload else ''}"
        (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
        md = [f"# Planning time, {args.preset} {args.type} ({ctx.n_layer} layers, "
              f"{ctx.model.weight_bytes / 2**30:.1f} GiB, {record['model']['target_ops']} target ops over "
              f"{len(ctx.passes)} passes), workload prompt {wl.prompt} / gen {wl.gen}"
              f"{', op offload off' if args.no_op_offload else ''}",
              "", f"Machine: {_cpu_name()}, accelerator {acc.name} ({acc.kind}); threads {ctx.settings['threads']}; "
              f"llama.cpp {build_info()['llama_cpp_commit'][:9]}; median of {args.reps}.", "",
              "'algorithm': the strategy's own computation (for optimal: HiGHS and the dynamic program of "
              "chaindp, both offload modes; the solver column names which proved or found the plan); "
              "'with memory checks': the whole make_plan, including metadata-only loads that check the plan "
              "against llama.cpp's memory accounting. The accelerator here is a loopback rpc-server (another "
              "CPU process): the predictions are for that device, not a GPU.", "",
              "| budget | strategy | algorithm s | with memory checks s | solver | predicted TTFT ms | "
              "predicted TPOT ms | on acc MiB |",
              "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ex = r["extra"]
            methods = "+".join(sorted({m["method"] for m in (ex.get("modes") or {}).values() if m.get("method")}))
            solver = (f"--n-cpu-moe {ex.get('n_cpu_moe')}" if r["strategy"] == "n-cpu-moe" else
                      "" if r["strategy"] != "optimal" else
                      f"from {ex['winner']}" if ex.get("winner", "solver") != "solver" else
                      f"proven optimal ({methods})" if float(ex.get("mip_gap") or 0) <= 1e-6 else
                      f"gap {ex['mip_gap']:.1%} ({methods})")
            md.append(f"| {r['budget']} | {r['strategy']} | {r['algorithm_s_median']:.3f} ± {r['algorithm_s_stdev']:.3f} | "
                      f"{r['with_memory_check_s_median']:.2f} ± {r['with_memory_check_s_stdev']:.2f} | {solver} | "
                      f"{r['predicted_ttft_ms']:.1f} | {r['predicted_tpot_ms']:.1f} | {r['acc_MiB']:.0f} |")
        if args.time_limits:
            budget_text = args.budget.split(",")[0]
            cands = [plan.make_plan(ctx, s, budget_text) for s in ("layers", "affinity")]
            md += ["", f"optimal at {budget_text} under each solver limit (s per offload mode):", "",
                   "| limit s | make_plan s | predicted e2e ms | MIP gap | winner |", "|---|---|---|---|---|"]
            for lim in (float(x) for x in args.time_limits.split(",")):
                t0 = time.perf_counter()
                p = plan.make_plan(ctx, "optimal", budget_text, candidates=cands, time_limit=lim)
                gap = p.extra.get("mip_gap")
                md.append(f"| {lim:g} | {time.perf_counter() - t0:.2f} | {p.predicted['e2e_ms']:.1f} | "
                          f"{'-' if gap is None else f'{gap:.1%}'} | {p.extra.get('winner')} |")
        if args.compare_solvers:
            record["solvers"] = _compare_solvers(ctx, args.budget.split(","), args.compare_solvers)
            (out / f"{stem}.json").write_text(json.dumps(record, indent=1))
            md += ["", f"The program of optimal at the budget (no compute-buffer reserve), each solver alone, "
                   f"limit {args.compare_solvers:g} s per run (dp: `planner.solvers.chaindp`; milp: HiGHS):", "",
                   "| budget | offload mode | solver | seconds | objective ms | status |", "|---|---|---|---|---|---|"]
            for r in record["solvers"]:
                obj = "-" if r["objective_ms"] is None else f"{r['objective_ms']:.1f}"
                md.append(f"| {r['budget']} | {r['mode']} | {r['method']} | {r['seconds']:.2f} | {obj} | {r['status']} |")
        (out / f"{stem}.md").write_text("\n".join(md) + "\n")
        print("\n".join(md))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
