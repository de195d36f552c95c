"""Long contexts with and without flash attention: the planner's prediction of a prompt (TTFT) and
of decode after it (TPOT) against a real load's, and its KV cache bytes against the load's. Each
model is planned and loaded with flash attention off and on (and a q8_0 KV cache with it on), the
settings alternated round by round; every figure is the median of the rounds. CPU only, or with
--rpc-local a loopback rpc-server, or with --device a ggml device (Vulkan0: run with
GGML_VK_VISIBLE_DEVICES=0), holding llama.cpp's -ngl placement for --gpu-budget (`layers`).

    python bench/scripts/bench_attention.py MODEL.gguf [...] --prompt 2000,4000 [--rpc-local | --device Vulkan0]
        [--gpu-budget 50%] --out bench/results/SET

Writes SET/attention.json (every round, the predictions' per-pass breakdown, the profiles' keys) and
SET/attention.md (the table), the plans and profiles beside them. Nothing else may run on the
machine meanwhile."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)

SETTINGS = (("off", "f16"), ("on", "f16"), ("on", "q8_0"))  # (flash attention, K and V cache type)


def _plan(model: Path, prompt: int, gen: int, fa: str, ctype: str, threads: int, acc: str | None, budget: str,
          out: Path) -> tuple[Any, Path | None, dict[str, Any]]:
    """The planning context (its calibration measured with these settings), the plan file (None:
    CPU only) and its prediction: every weight on the host, or `layers` at the budget on `acc`."""
    from oallama.planner.context import Workload, build_context
    from oallama.planner.cost.schedmodel import NEVER, Placement
    from oallama.planner.plan import make_plan

    wl = Workload(prompt=prompt, gen=gen, n_ubatch=512, flash_attn=fa, cache_type_k=ctype, cache_type_v=ctype)
    ctx = build_context(model, acc, wl, threads=threads, progress=True)
    if acc is None:
        return ctx, None, ctx.predict(Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes}))
    plan = make_plan(ctx, "layers", budget)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    path = plan.save(out / "plans" / f"{model.stem}-p{prompt}-fa{fa}-{ctype}.json")
    return ctx, path, dict(plan.predicted)


def _measure(model: Path, ctx: Any, plan: Path | None, threads: int, steps: int) -> dict[str, Any]:
    """One real load with the context's settings (and the plan's placement): the prompt's wall time
    (ms), the mean decode step after it (ms), and the KV cache's bytes on every device."""
    from oallama import Llama, _core
    from oallama.runtime import kvcache
    from oallama.runtime.generate import prompt_tokens

    wl = ctx.workload
    kw = {"placement": str(plan)} if plan is not None else kvcache.llama_kwargs(**ctx.attention())  # a plan: its own
    llm = Llama(str(model), n_ctx=wl.n_ctx, n_batch=wl.n_ubatch, n_ubatch=wl.n_ubatch, n_threads=threads,
                n_threads_batch=threads, verbose=False, **kw)
    try:
        toks = prompt_tokens(llm, wl.n_ctx)
        llm.eval(toks[:64])  # warm-up: graphs built, buffers touched
        llm.reset()  # the next eval drops the cache's cells from position 0 on
        t0 = time.perf_counter()
        llm.eval(toks[:wl.prompt])
        ttft = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        for k in range(steps):
            llm.eval(toks[wl.prompt + k:wl.prompt + k + 1])
        tpot = (time.perf_counter() - t0) * 1e3 / steps
        kv = sum(int(m.context) for m in _core.memory(llm.native_context))
    finally:
        llm.close()
    return {"ttft_ms": ttft, "tpot_ms": tpot, "kv_bytes": kv}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--prompt", default="2000,4000", help="prompt lengths (tokens), comma-separated")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed after the prompt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rpc-local", action="store_true", help="a loopback rpc-server (1 thread) as the accelerator")
    ap.add_argument("--device", help="a ggml device as the accelerator (e.g. Vulkan0)")
    ap.add_argument("--gpu-budget", default="50%", help="its budget (llama.cpp's -ngl placement for it)")
    ap.add_argument("--settings", default=",".join(f"{fa}:{ct}" for fa, ct in SETTINGS),
                    help="flash attention:KV cache type pairs, comma-separated")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompt.split(",")]
    try:
        args.settings = [(fa, ct) for fa, ct in (x.split(":") for x in args.settings.split(","))]
    except ValueError:
        ap.error(f"--settings {args.settings}: give pairs such as on:f16,off:f16")
    args.out.mkdir(parents=True, exist_ok=True)
    from oallama.runtime import rpc

    if args.rpc_local and args.device:
        ap.error("--rpc-local and --device name two accelerators: give one")
    server = rpc.start_server(threads=1) if args.rpc_local else None
    acc = server.device_name if server is not None else args.device
    try:
        rows = _run(args, prompts, acc)
    finally:
        if server is not None:
            server.stop()
    from oallama.planner.cost.profile import cpu_detail

    doc = {"date": date.today().isoformat(), "commit": git_commit(), "machine": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cpu_detail": cpu_detail(), "cores": os.cpu_count(),
           "threads": args.threads,
           "accelerator": "loopback rpc-server, 1 thread" if server is not None else acc,
           "placement": f"layers at {args.gpu_budget}" if acc else "every weight on the host", "n_ubatch": 512,
           "steps": args.steps, "rounds": args.rounds, "rows": rows}
    (args.out / "attention.json").write_text(json.dumps(doc, indent=1) + "\n")
    where = (f"CPU + {'loopback rpc-server' if server is not None else acc}, layers at {args.gpu_budget}" if acc
             else "CPU only")
    lines = [f"# Long contexts, flash attention off and on, {where} ({doc['date']}, commit {doc['commit'][:12]}, "
             f"{doc['cores']} cores ({doc['cpu_detail'] or doc['cpu']}), {args.threads} thread(s), ubatch 512, median of {args.rounds} alternated rounds)",
             "", "| model | prompt | n_ctx | fa | KV | TTFT pred / meas ms | ratio | TPOT pred / meas ms | ratio | "
             "KV bytes plan = load | load avg |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        kv_ok = all(x["kv_bytes"] == c["planned_kv_bytes"] for x in c["rounds"])
        tt, tp = c["ttft_ms"]["median"], c["tpot_ms"]["median"]
        lines.append(f"| {c['model']} | {c['prompt']} | {c['n_ctx']} | {c['flash_attn']} | {c['cache_type']} | "
                     f"{c['predicted']['ttft_ms']:.1f} / {tt:.1f} ({c['ttft_ms']['min']:.1f}-{c['ttft_ms']['max']:.1f}) | "
                     f"{tt / c['predicted']['ttft_ms']:.2f} | {c['predicted']['tpot_ms']:.2f} / {tp:.2f} "
                     f"({c['tpot_ms']['min']:.2f}-{c['tpot_ms']['max']:.2f}) | {tp / c['predicted']['tpot_ms']:.2f} | "
                     f"{'yes' if kv_ok else 'NO'} ({c['planned_kv_bytes'] / 2**20:.1f} MiB) | "
                     f"{max(x['loadavg'] for x in c['rounds']):.2f} |")
    (args.out / "attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _run(args: argparse.Namespace, prompts: list[int], acc: str | None) -> list[dict[str, Any]]:
    """Every model x prompt x setting: planned once, then measured in alternated rounds (the
    profiles the plans were costed with saved into args.out/profiles)."""
    from oallama.bench import profiles as bench_profiles

    rows: list[dict[str, Any]] = []
    for model in args.models:
        for prompt in prompts:
            cells = []
            for fa, ctype in args.settings:
                ctx, plan, pred = _plan(model, prompt, args.steps + 1, fa, ctype, args.threads, acc, args.gpu_budget,
                                        args.out)
                cells.append({"model": model.name, "prompt": prompt, "n_ctx": ctx.workload.n_ctx, "flash_attn": fa,
                              "cache_type": ctype, "predicted": pred, "profile": bench_profiles.save(args.out, ctx.profile),
                              "plan": plan.name if plan is not None else None,
                              "planned_kv_bytes": sum(ctx.kv_bytes.values()), "rounds": [], "ctx": ctx, "path": plan})
            for r in range(args.rounds):  # the settings alternated within each round
                for c in cells:
                    m = _measure(model, c["ctx"], c["path"], args.threads, args.steps)
                    c["rounds"].append({**m, "loadavg": os.getloadavg()[0]})
                    print(f"{model.name} prompt {prompt} fa {c['flash_attn']} {c['cache_type']} round {r + 1}: "
                          f"TTFT {m['ttft_ms']:.1f} ms, TPOT {m['tpot_ms']:.2f} ms", file=sys.stderr, flush=True)
            for c in cells:
                c.pop("ctx"), c.pop("path")
                for k in ("ttft_ms", "tpot_ms"):
                    vals = [x[k] for x in c["rounds"]]
                    c[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
                rows.append(c)
    return rows


if __name__ == "__main__":
    sys.exit(main())
