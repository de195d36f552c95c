#!/usr/bin/env python3
"""Benchmark: host weight layouts chosen per weight (CPU-only plans) against llama.cpp's default
(every weight it can repacked) and against --no-repack (every weight plain), on one model and
several workloads, measured end to end through llama.cpp with the predicted TTFT/TPOT beside.

    python bench/scripts/bench_layouts.py MODEL [--workloads 512:32,64:128,64:32:4] [--threads 2] [--reps 3]
        [--host-budget 200%] [--confirm SECONDS|auto] [-o bench/results/<date>-<machine>-layouts]

A workload is prompt:gen, or prompt:gen:parallel for that many sequences decoded together (llama.cpp's
-np: every decode pass carries one token of each, `runtime.generate.timed_parallel`).

Per workload it plans (CPU only: `oallama plan` without a GPU budget) `optimal` without and with
a host budget (the dual layout, patch 0006), then runs each distinct placement in a fresh process
per repeat, the placements alternated within each round (the machine is shared: ratios of
neighbouring runs are what to compare), one discarded warm-up generation per process. Records
per run: TTFT, TPOT, e2e, greedy tokens' hash, peak host memory, the 1-minute load average.
Writes layouts.json / layouts.csv / layouts.md, the plans (with their per-pass predictions) and
the profile into the output directory.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)

PROMPT_WARMUP = (32, 4)  # tokens: the discarded warm-up generation (touches every weight once)


def _worker(spec_path: str) -> int:
    """One run in this fresh process: load with the plan, warm up, generate, write the result."""
    from oallama import Llama
    from oallama.runtime.devices import peak_rss_bytes
    from oallama.runtime.generate import prompt_tokens, timed_generate, timed_parallel

    spec = json.loads(Path(spec_path).read_text())
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"placement": spec["plan"]} if spec.get("plan") else {}
    np_ = int(spec.get("parallel", 1))
    if np_ > 1:  # llama-server's slots given -np: a KV stream each, or one for all (`u`)
        kw |= {"n_seq_max": np_, "kv_unified": bool(spec.get("kv_unified"))}
    llm = Llama(spec["model"], n_ctx=spec["n_ctx"], n_threads=spec["threads"], n_threads_batch=spec["threads"],
                verbose=False, **kw)
    load_s = time.perf_counter() - t0
    kinds: dict[str, int] = {}
    for t in llm.tensor_placements():
        bt = "CPU" if t.buffer_type == "CPU_Mapped" else t.buffer_type
        kinds[bt] = kinds.get(bt, 0) + 1
    def gen(n_prompt: int, n_gen: int) -> Any:
        toks = prompt_tokens(llm, n_prompt)
        return timed_parallel(llm, toks, np_, n_gen) if np_ > 1 else timed_generate(llm, toks, n_gen)

    gen(*PROMPT_WARMUP)
    load_before = os.getloadavg()[0]
    g = gen(spec["prompt"], spec["gen"])
    out = {"ttft_ms": g.ttft_s * 1e3, "tpot_ms": g.tpot_s * 1e3, "e2e_ms": g.e2e_s * 1e3, "load_s": load_s,
           "buffer_types": kinds, "tokens_sha": hashlib.sha256(json.dumps(g.tokens).encode()).hexdigest()[:16],
           "host_peak_bytes": peak_rss_bytes(),
           "load_avg_before": load_before, "load_avg_after": os.getloadavg()[0]}
    llm.close()
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


def _plans(model: Path, wl: Any, threads: int, host_budget: str, out: Path,
           confirm: str | None = None) -> dict[str, Path | None]:
    """name -> plan file (None: llama.cpp's default load) of every distinct placement to measure;
    confirm: also `optimal` confirmed by measurement within that many seconds, or "auto": the planner's
    default bound (`optimal-confirmed`)."""
    from oallama.planner.cost.profile import PLAIN
    from oallama.planner.plan import build_context, confirmed, make_plan
    from oallama.runtime.planfile import ConfirmOptions

    ctx = build_context(model, None, wl, threads=threads, progress=True)
    default = make_plan(ctx, "layers", None)
    opt = make_plan(ctx, "optimal", None)
    dual = make_plan(ctx, "optimal", None, host_budget=host_budget)
    all_plain = opt.placement.with_layouts({w: PLAIN for w in opt.placement.layouts})
    plain = dataclasses.replace(opt, strategy="all-plain", placement=all_plain, predicted=ctx.predict(all_plain))
    rows = [("default", default), ("all-plain", plain), ("optimal", opt), ("optimal-dual", dual)]
    if confirm is not None:
        bound = None if confirm == "auto" else float(confirm)
        kept, _, _ = confirmed(ctx, None, ConfirmOptions(confirm_time=bound), progress=True)
        rows.append(("optimal-confirmed", kept))
    files: dict[str, Path | None] = {}
    seen: dict[str, str] = {}
    for name, p in rows:
        key = json.dumps([sorted(p.placement.layouts.items()), p.placement.dual_max_batch])
        if key in seen:  # the same placement as another row: measured once, under the first name
            print(f"bench_layouts: {name} is the same placement as {seen[key]}", file=sys.stderr)
            p.save(out / "plans" / f"{_tag(wl)}-{name}.json")  # kept: a confirmed plan records its measurement
            continue
        seen[key] = name
        path = out / "plans" / f"{_tag(wl)}-{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        p.save(path)
        files[name] = None if name == "default" else path
    ctx.profile.save(out / "profiles" / f"{ctx.profile.key[:16]}.json")
    return files


def _tag(wl: Any) -> str:
    """A workload's name in file names: p<prompt>-g<gen>[-np<parallel>[u]]."""
    return _name(wl.prompt, wl.gen, wl.parallel, wl.unified)


def _name(prompt: int, gen: int, parallel: int, unified: bool) -> str:
    return f"p{prompt}-g{gen}" + (f"-np{parallel}{'u' if unified else ''}" if parallel > 1 else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--workloads", default="512:32,64:128", help="prompt:gen[:parallel[u]], comma-separated (u: the "
                    "sequences in one unified KV stream)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="rounds; each runs every placement once, alternated")
    ap.add_argument("--host-budget", default="200%", help="host memory for weights of the dual-layout plan")
    ap.add_argument("-o", "--out", type=Path, default=Path(f"bench/results/{date.today()}-{platform.node()}-layouts"))
    ap.add_argument("--confirm", metavar="SECONDS|auto", help="also measure `optimal` confirmed by measurement "
                    "within this time (the planner's confirmation, auto: its default bound; its choice saved in plans/)")
    ap.add_argument("--report", action="store_true", help="only write the summaries again from OUT/runs/")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args.worker)
    if args.report:
        from oallama.planner.cost.profile import build_info

        _write(args.out, _rows_from_runs(args.out), args, build_info())
        return 0
    if args.model is None:
        ap.error("the model is required")

    from oallama.planner.cost.profile import build_info
    from oallama.planner.plan import Workload

    out: Path = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for wl in args.workloads.split(","):
        prompt_s, gen_s, *rest = wl.split(":")
        prompt, gen, par = int(prompt_s), int(gen_s), rest[0] if rest else "1"
        work = Workload(prompt=prompt, gen=gen, parallel=int(par.removesuffix("u")), kv_unified=par.endswith("u"))
        plans = _plans(args.model, work, args.threads, args.host_budget, out, args.confirm)
        n_ctx = work.n_ctx
        names = list(plans)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: no placement always first
            for name in order:
                res = out / "runs" / f"{_tag(work)}-{name}-r{rep}.json"
                spec = {"model": str(args.model), "plan": str(plans[name]) if plans[name] else None, "prompt": prompt,
                        "gen": gen, "parallel": work.parallel, "kv_unified": work.unified, "threads": args.threads,
                        "n_ctx": n_ctx,
                        "result": str(res)}
                spec_path = res.with_suffix(".spec.json")
                spec_path.write_text(json.dumps(spec))
                print(f"bench_layouts: {_tag(work)} {name} round {rep + 1}/{args.reps} "
                      f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
                subprocess.run([sys.executable, __file__, "--worker", str(spec_path)], check=True)
                r = json.loads(res.read_text())
                rows.append({"prompt": prompt, "gen": gen, "parallel": work.parallel, "kv_unified": work.unified,
                             "placement": name, "round": rep, **r})
    _write(out, rows, args, build_info())
    return 0


def _rows_from_runs(out: Path) -> list[dict[str, Any]]:
    """The rows of every finished run in OUT/runs/ (its spec beside its result; the placement and
    round from the file's name: <tag>-<placement>-r<round>.json)."""
    rows = []
    for spec_path in sorted((out / "runs").glob("*.spec.json")):
        spec = json.loads(spec_path.read_text())
        res = Path(spec["result"])
        if not res.exists():
            continue
        tag = _name(spec["prompt"], spec["gen"], spec["parallel"], bool(spec.get("kv_unified")))
        stem = res.name.removesuffix(".json")
        name, rep = stem[len(tag) + 1:].rsplit("-r", 1)
        rows.append({"prompt": spec["prompt"], "gen": spec["gen"], "parallel": spec["parallel"],
                     "kv_unified": bool(spec.get("kv_unified")), "placement": name, "round": int(rep),
                     **json.loads(res.read_text())})
    return rows


def _write(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace, build: dict[str, Any]) -> None:
    from oallama.planner.cost.profile import _cpu_name, cpu_detail

    commit = git_commit(short=True)
    summary: list[dict[str, Any]] = []
    def key(r: dict[str, Any]) -> tuple[int, int, int, bool, str]:
        return r["prompt"], r["gen"], r.get("parallel", 1), bool(r.get("kv_unified")), r["placement"]

    for (prompt, gen, np_, unified, name) in dict.fromkeys(key(r) for r in rows):
        rs = [r for r in rows if key(r) == (prompt, gen, np_, unified, name)]
        tag = _name(prompt, gen, np_, unified)
        plan_path = out / "plans" / f"{tag}-{name}.json"
        pred = json.loads(plan_path.read_text())["predicted"] if plan_path.exists() else {}
        s: dict[str, Any] = {"prompt": prompt, "gen": gen, "parallel": np_, "kv_unified": unified, "placement": name,
                             "n": len(rs),
                             "buffer_types": rs[0]["buffer_types"], "tokens_sha": sorted({r["tokens_sha"] for r in rs}),
                             "host_peak_mib": max(r["host_peak_bytes"] for r in rs) / 2**20,
                             "load_avg_max": max(r["load_avg_after"] for r in rs)}
        for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = [r[k] for r in rs]
            s[k] = statistics.median(v)
            s[k.replace("_ms", "_stdev_ms")] = statistics.stdev(v) if len(v) > 1 else 0.0
            s["predicted_" + k] = pred.get(k)
        summary.append(s)
    doc = {"benchmark": "host_layouts", "model": str(args.model), "cpu": _cpu_name(), "cpu_detail": cpu_detail(), "machine": platform.node(),
           "threads": args.threads, "reps": args.reps, "host_budget": args.host_budget, "commit": commit,
           "build": build, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "runs": rows}
    (out / "layouts.json").write_text(json.dumps(doc, indent=1))
    with (out / "layouts.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in summary[0] if k not in ("buffer_types", "tokens_sha")])
        w.writeheader()
        for s in summary:
            w.writerow({k: v for k, v in s.items() if k in w.fieldnames})
    md = [f"# Host weight layouts: {Path(args.model).name}, CPU only ({_cpu_name()}, {args.threads} threads)", "",
          f"Commit {commit}, llama.cpp {build['llama_cpp_commit'][:9]}; median of {args.reps} fresh processes per "
          "placement, alternated, one discarded warm-up each; predicted = the plan's prediction "
          "(`plans/`, per-pass breakdown inside). Ratios are against llama.cpp's default in the same workload.", "",
          "| prompt:gen:parallel | placement | layouts (weights) | TTFT ms (pred) | TPOT ms (pred) | e2e ms (pred) | "
          "TTFT x | TPOT x | e2e x | host peak MiB | load max |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        base = next(b for b in summary if key(b) == (*key(s)[:4], "default"))
        lay = ", ".join(f"{n} {k}" for k, n in sorted(s["buffer_types"].items()))

        def cell(k: str, s: dict[str, Any] = s) -> str:
            p = s["predicted_" + k]
            return f"{s[k]:.0f} ± {s[k.replace('_ms', '_stdev_ms')]:.0f} ({p:.0f})" if p else f"{s[k]:.0f}"

        md.append(f"| {s['prompt']}:{s['gen']}:{s['parallel']}{'u' if s.get('kv_unified') else ''} | {s['placement']} | {lay} | {cell('ttft_ms')} | {cell('tpot_ms')} | "
                  f"{cell('e2e_ms')} | {base['ttft_ms'] / s['ttft_ms']:.2f} | {base['tpot_ms'] / s['tpot_ms']:.2f} | "
                  f"{base['e2e_ms'] / s['e2e_ms']:.2f} | {s['host_peak_mib']:.0f} | {s['load_avg_max']:.2f} |")
    md += ["", "x: llama.cpp's default time / this placement's (above 1: faster). Greedy tokens per placement "
           "(hash): " + "; ".join(f"{s['prompt']}:{s['gen']}:{s['parallel']}{'u' if s.get('kv_unified') else ''} {s['placement']} {','.join(s['tokens_sha'])}"
                                  for s in summary)]
    (out / "layouts.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
