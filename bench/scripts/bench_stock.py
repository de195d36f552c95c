#!/usr/bin/env python3
"""Benchmark: what a stock llama.cpp loses of an oallama plan — its per-weight streaming thresholds.

`oallama plan --emit-ot` gives stock llama-server the plan's weight placement (-ngl/-ot), but not its
per-weight op-offload thresholds (stock has one global GGML_OP_OFFLOAD_MIN_BATCH, and none for
rpc-servers). For each budget this plans `optimal` and times, alternated in the same process:

  plan     the plan as oallama loads it (weights placed, host weights streamed per their thresholds)
  stock    the same placement with no per-weight thresholds: what the emitted stock command runs
           (ggml's default offload rule), loaded through oallama so that only this differs

Both are predicted by the same cost model (the plan's per-pass breakdown and the stock variant's).
Writes stock.json / stock.csv / stock.md to --out with the machine, commit and load average.

    python bench/scripts/bench_stock.py MODEL [--rpc-local | --device DEV] [--gpu-budget 25%,50%] \\
        [--prompt 256] [--gen 32] [--reps 3] [-o DIR]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import oallama  # noqa: F401  (oallama's libraries before llama_cpp's)
from oallama import Llama
from oallama.planner.cost.profile import _cpu_name, build_info, cpu_detail
from oallama.planner.cost.schedmodel import NEVER, Placement
from oallama.planner.plan import Workload, build_context, make_plan
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens, timed_generate
from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)


def _stock_variant(ctx: Any, plan: Any) -> Any:
    """The plan's placement with no per-weight thresholds, predicted by the same model."""
    p = plan.placement
    bare = Placement(p.on_acc, p.kv_layers, {}, dict(p.layouts), p.dual_max_batch)
    return dataclasses.replace(plan, strategy=f"{plan.strategy}-stock", placement=bare, predicted=ctx.predict(bare))


def _time(model: Path, plan_path: Path, n_prompt: int, n_gen: int, threads: int, ubatch: int) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of one generation after one warm-up generation."""
    llm = Llama(str(model), placement=str(plan_path), n_ctx=n_prompt + n_gen + 8, n_batch=ubatch, n_ubatch=ubatch,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        toks = prompt_tokens(llm, n_prompt)
        timed_generate(llm, toks, 4)  # warm-up: graphs built, weights paged in
        g = timed_generate(llm, toks, n_gen)
        return g.ttft_s * 1e3, g.tpot_s * 1e3
    finally:
        llm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--device", help="the accelerator (default: --rpc-local's)")
    ap.add_argument("--rpc-local", action="store_true", help="a loopback rpc-server as the accelerator")
    ap.add_argument("--rpc-threads", type=int, default=1)
    ap.add_argument("--gpu-budget", default="25%,50%")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ubatch", type=int, default=256)
    ap.add_argument("-o", "--out", type=Path, default=Path(f"bench/results/{date.today()}-{platform.node()}-stock"))
    args = ap.parse_args()
    if not args.device and not args.rpc_local:
        ap.error("name the accelerator: --device DEV or --rpc-local")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with rpc.local_server_if(args.rpc_local and not args.device, args.rpc_threads) as server, \
            tempfile.TemporaryDirectory(prefix="oallama-stock-") as tmp:
        acc = args.device or server.device_name  # type: ignore[union-attr]
        wl = Workload(prompt=args.prompt, gen=args.gen, objective="e2e", n_ubatch=args.ubatch)
        print(f"profiling/calibrating {args.model.name} on CPU + {acc} (cached after the first run) ...",
              file=sys.stderr)
        ctx = build_context(args.model, acc, wl, threads=args.threads, progress=True)
        for budget in args.gpu_budget.split(","):
            plan = make_plan(ctx, "optimal", budget)
            variants = {"plan": plan, "stock": _stock_variant(ctx, plan)}
            paths = {k: v.save(Path(tmp) / f"{budget.strip('%')}-{k}.json") for k, v in variants.items()}
            streamed = sum(1 for b in plan.offload_policy().values() if b < NEVER)
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
            loads = []
            for rep in range(args.reps):
                for k in (variants if rep % 2 == 0 else reversed(list(variants))):  # alternated
                    loads.append(os.getloadavg()[0])
                    times[k].append(_time(args.model, paths[k], args.prompt, args.gen, args.threads, args.ubatch))
                    print(f"  {budget} {k} rep {rep + 1}/{args.reps}: TTFT {times[k][-1][0]:.1f} ms, "
                          f"TPOT {times[k][-1][1]:.2f} ms", file=sys.stderr)
            for k, v in variants.items():
                ttft = [t for t, _ in times[k]]
                tpot = [t for _, t in times[k]]
                rows.append({"budget": budget, "variant": k, "weights_on_acc": len(v.placement.on_acc),
                             "streamed_weights": streamed if k == "plan" else 0,
                             "ttft_ms_median": statistics.median(ttft), "ttft_ms_stdev": statistics.pstdev(ttft),
                             "tpot_ms_median": statistics.median(tpot), "tpot_ms_stdev": statistics.pstdev(tpot),
                             "predicted_ttft_ms": v.predicted["ttft_ms"], "predicted_tpot_ms": v.predicted["tpot_ms"],
                             "ttft_ms": ttft, "tpot_ms": tpot, "load_avg_max": max(loads)})
    doc = {"schema": "oallama.bench-stock/1", "commit": git_commit(), "build": build_info(), "date": str(date.today()),
           "device": {"machine": platform.node(), "cpu": _cpu_name(), "cpu_detail": cpu_detail(), "cpu_count": os.cpu_count(), "accelerator": acc},
           "settings": {"model": args.model.name, "prompt": args.prompt, "gen": args.gen, "reps": args.reps,
                        "threads": args.threads, "ubatch": args.ubatch, "rpc_threads": args.rpc_threads,
                        "strategy": "optimal"},
           "rows": rows}
    (args.out / "stock.json").write_text(json.dumps(doc, indent=1))
    keys = [k for k in rows[0] if k not in ("ttft_ms", "tpot_ms")]
    with (args.out / "stock.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = ["| budget | variant | weights on acc | streamed | TTFT ms (median ± sd) | predicted | "
             "TPOT ms (median ± sd) | predicted | max load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['budget']} | {r['variant']} | {r['weights_on_acc']} | {r['streamed_weights']} | "
                     f"{r['ttft_ms_median']:.1f} ± {r['ttft_ms_stdev']:.1f} | {r['predicted_ttft_ms']:.1f} | "
                     f"{r['tpot_ms_median']:.2f} ± {r['tpot_ms_stdev']:.2f} | {r['predicted_tpot_ms']:.2f} | "
                     f"{r['load_avg_max']:.2f} |")
    (args.out / "stock.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"commit {doc['commit'][:9]}; {time.strftime('%Y-%m-%d %H:%M')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
