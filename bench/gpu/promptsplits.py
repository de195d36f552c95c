#!/usr/bin/env python3
"""Where a prompt pass whose weights stream to the accelerator spends its time, split by split,
beside what the plan predicted for it.

Held-out protocol v2 on an H200 (bench/results/2026-11-27-h200-heldout) measured the prompts of
placements that stream host weights to the GPU 20-38% slower than predicted, and by about the same
15-19 ms per 512-token ubatch whether the plan streamed 133 MB or 29 MB: not the streamed-weight
link alone. This times such passes on the *reference* model (the device model's own, in sample)
and on one held-out model (reported only, never fitted to), each placement of `plan`'s strategies
at each budget loaded alone:

  wall    the 512-token prompt pass without the eval callback (median of REPS, after a warm-up)
  nodes   the same pass stopped at every node: per (device, op) the summed ranges, and the gaps
          between ranges (a split's input copies, streamed weights among them, happen before its
          first node is asked: they fall in the gap before it)
  splits  the same pass stopped at each change of device (as calibration times it): per split its
          device, range and the gap before it (median over REPS)
  together  every placement but the mmap-off one loaded at once, as the held-out protocol measures
          a cell's: each one's wall, in alternated rounds
  pred    the plan's breakdown of that pass (`PlanContext.predict`) and per (device, op) the pass
          model's node times (`PassModel.assign`, `t_host` / `t_acc`)

The plain `-ngl 0` placement is also loaded with mmap off (its host weights then sit in the
accelerator's pinned host buffer rather than the file's pages), to tell pageable from pinned copies.

    python bench/gpu/promptsplits.py --device CUDA0 -o OUT.json [--models reference,qwen3-8b-2l]
    python bench/gpu/promptsplits.py --device rpc -o OUT.json --models M.gguf --calibration model  # here
    python bench/gpu/promptsplits.py --device CUDA0 -o OUT.json --models reference --ctx 1024,4096,16384

Node times are summed per (device, op kind): `calfit.kind`'s, so a transposed V cache's write
(SET_ROWS:scatter) stands apart from the K cache's (SET_ROWS).

Prints one line per placement; the JSON holds everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "heldout"))
from provenance import git_commit

PROMPT, N_CTX, REPS = 512, 4096, 5


def _model(name: str) -> Path:
    if name.endswith(".gguf"):
        return Path(name)
    if name == "reference":
        from oallama.planner.cost.devicemodel import reference_model

        return reference_model()
    import heldout
    from oallama._files import cache_base

    return heldout.model_path(name, cache_base() / "models", synthetic_only=True)[0]


def _by_op(rows: list[tuple[str, str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for dev, op, us in rows:
        out[f"{dev}:{op}"] += us
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda x: -x[1])}


def _predicted_nodes(ctx: Any, p: Any, acc: str) -> dict[str, Any]:
    from oallama.planner.cost.calfit import kind
    from oallama.planner.workload import Ubatch

    pm = ctx.passes[Ubatch(PROMPT)]
    dev = pm.assign(p)
    rows = [(acc if dev[i] else "CPU", kind(pm.graph.nodes[i].op, pm.graph.nodes[i].ne),
             (pm.t_acc[i] if dev[i] else pm.host_us(i, p))) for i in pm.t_host]
    order = [("acc" if dev[i] else "host") for i in pm.order]
    return {"by_op": _by_op(rows), "n_splits": sum(1 for k, d in enumerate(order) if k == 0 or order[k - 1] != d)}


def _measure(llm: Any, acc: str) -> dict[str, Any]:
    from oallama import _core
    from oallama.planner.cost.calfit import kind
    from oallama.planner.cost.calibrate import _split_stops
    from oallama.planner.cost.realpass import timed_eval
    from oallama.runtime.generate import prompt_tokens

    toks = prompt_tokens(llm, PROMPT)
    timed_eval(llm, None, [], toks, [])  # warm-up: the graph's first build, allocations
    walls = [timed_eval(llm, None, [], toks, []).wall_us for _ in range(REPS)]
    with _core.NodeTimer(llm.native_context) as timer:
        node_run = timed_eval(llm, timer, [], toks, [])
        nodes = node_run.nodes
        stops = _split_stops(nodes)
        split_runs = [timed_eval(llm, timer, [], toks, stops) for _ in range(REPS)]
    rows, gaps = [], defaultdict(float)
    prev_done = None
    for r in nodes:
        if r.range_us >= 0:
            rows.append((r.device, kind(r.op, r.ne), r.range_us))
    # node mode: each range is one node; the gap before it is the time since the last range ended
    for r in nodes:
        if r.done_us < 0:
            continue
        start = r.done_us - r.range_us
        if prev_done is not None:
            gaps[r.device] += max(start - prev_done, 0.0)
        prev_done = r.done_us
    splits = []
    for run in split_runs:
        ranges = [r for r in run.nodes if r.done_us >= 0]
        one = []
        for k, r in enumerate(ranges):
            gap = (r.done_us - r.range_us) - ranges[k - 1].done_us if k else 0.0
            one.append({"device": r.device, "range_us": r.range_us, "gap_us": gap, "last": r.name})
        splits.append(one)
    n = min(len(s) for s in splits)
    med = [{"device": splits[0][k]["device"], "last": splits[0][k]["last"],
            "range_us": statistics.median(s[k]["range_us"] for s in splits),
            "gap_us": statistics.median(s[k]["gap_us"] for s in splits)} for k in range(n)]
    span = [(run.nodes[-1].done_us - run.nodes[0].start_us) if run.nodes else 0.0 for run in split_runs]
    return {
        "wall_us": statistics.median(walls), "walls_us": walls,
        "node_mode": {"wall_us": node_run.wall_us, "by_op": _by_op(rows), "gaps_us": dict(gaps),
                      "n_nodes": len(nodes)},
        "split_mode": {"walls_us": [r.wall_us for r in split_runs], "span_us": statistics.median(span),
                       "splits": med,
                       "range_us": {d: round(sum(s["range_us"] for s in med if s["device"] == d), 1)
                                    for d in {s["device"] for s in med}},
                       "gap_us": {d: round(sum(s["gap_us"] for s in med if s["device"] == d), 1)
                                  for d in {s["device"] for s in med}}},
        "buffers": llm.bytes_per_buffer_type(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", required=True)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--models", default="reference,qwen3-8b-2l")
    ap.add_argument("--budgets", default="25%,50%")
    ap.add_argument("--strategies", default="layers,affinity,optimal")
    ap.add_argument("--calibration", default="device")
    ap.add_argument("--ctx", default=str(N_CTX), help="context sizes (cells), comma-separated: each model's placements "
                    "planned and timed at each (a transposed V cache's write strides over the context's cells)")
    a = ap.parse_args()
    threads = max((os.cpu_count() or 2) // 2, 1)
    with contextlib.ExitStack() as stack:
        if a.device == "rpc":  # a loopback rpc-server: the script's own check on a machine without a GPU
            from oallama.runtime import rpc

            a.device = stack.enter_context(rpc.start_server(threads=1)).device_name
        return _run(a, threads)


def _run(a: argparse.Namespace, threads: int) -> int:
    from oallama.planner import confirm as confirmmod
    from oallama.planner import plan as planmod
    from oallama.runtime.llama import Llama

    sizes = [int(c) for c in a.ctx.split(",")]
    if min(sizes) < PROMPT + 4:
        raise SystemExit(f"--ctx {a.ctx}: each context needs the {PROMPT}-token prompt and 4 tokens more")
    doc: dict[str, Any] = {"commit": git_commit(), "machine": platform.node(), "cpu_count": os.cpu_count(),
                           "threads": threads, "device": a.device, "prompt": PROMPT, "n_ctx": sizes,
                           "load_avg_start": os.getloadavg()[0], "models": {}}
    tmp = Path(a.out).with_suffix(".plans")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, n_ctx in ((m, c) for m in a.models.split(",") for c in sizes):
        run = name if len(sizes) == 1 else f"{name}@{n_ctx}"  # the JSON's key for this model and context
        path = _model(name)
        workload = planmod.Workload(PROMPT, 4, "e2e", PROMPT, n_ctx)
        t0 = time.perf_counter()
        ctx = planmod.build_context(path, a.device, workload, threads=threads, progress=True,
                                    calibration=a.calibration)
        entry: dict[str, Any] = {"path": str(path), "n_ctx": n_ctx, "context_s": time.perf_counter() - t0, "placements": {}}
        seen: dict[str, str] = {}
        for budget in a.budgets.split(","):
            plans = planmod.make_plans(ctx, budget, a.strategies.split(","), optional=("fit",))
            for s, plan in plans.items():
                pdoc = plan.to_json()
                key = confirmmod.load_key(pdoc)
                label = f"{s}@{budget}"
                if key in seen:
                    entry["placements"][seen[key]]["labels"].append(label)
                    continue
                seen[key] = label
                f = tmp / f"{Path(run).name.replace('@', '-')}-{s}-{budget.rstrip('%')}.plan.json"
                f.write_text(json.dumps(pdoc, indent=1))
                p = planmod.placement_of(pdoc)
                variants = [("", {})] + ([(" mmap off", {"use_mmap": False})] if s == "layers" else [])
                for suffix, kw in variants:
                    load = {"n_ctx": n_ctx, "n_batch": PROMPT, "n_ubatch": PROMPT, "n_threads": threads,
                            "n_threads_batch": threads, **kw}
                    with contextlib.closing(Llama(str(path), placement=str(f), **load, flash_attn=False,
                                                  verbose=False)) as llm:
                        m = _measure(llm, a.device)
                    pred = ctx.predict(p)
                    e = {"labels": [label + suffix], "plan": str(f), "load": load,
                         "predicted": pred["passes"][str(PROMPT)], "predicted_nodes": _predicted_nodes(ctx, p, a.device),
                         "stream_gb_s": pred.get("stream_gb_s"), "split_us": pred.get("split_us"), **m}
                    entry["placements"][label + suffix] = e
                    pt = e["predicted"]["total_ms"]
                    print(f"{run} {label + suffix}: wall {m['wall_us'] / 1e3:.1f} ms, predicted {pt:.1f} "
                          f"({pt / (m['wall_us'] / 1e3) - 1:+.1%}); split mode ranges "
                          f"{m['split_mode']['range_us']} gaps {m['split_mode']['gap_us']}; predicted stream "
                          f"{e['predicted']['stream_ms']:.1f} ms copies {e['predicted']['copy_ms']:.1f} acc "
                          f"{e['predicted']['acc_ms']:.1f}", flush=True)
        # the same placements loaded at once, as the held-out protocol's measuring process loads a cell's:
        # each one's prompt wall, in alternated rounds
        alone = {k: e for k, e in entry["placements"].items() if "mmap off" not in k}
        with contextlib.ExitStack() as stack:
            llms = {k: stack.enter_context(contextlib.closing(Llama(str(path), placement=e["plan"], **e["load"],
                                                                     flash_attn=False, verbose=False)))
                    for k, e in alone.items()}
            from oallama.planner.cost.realpass import timed_eval
            from oallama.runtime.generate import prompt_tokens

            toks = prompt_tokens(next(iter(llms.values())), PROMPT)
            for llm in llms.values():
                timed_eval(llm, None, [], toks, [])
            together: dict[str, list[float]] = {k: [] for k in llms}
            keys = list(llms)
            for r in range(REPS):
                for k in keys if r % 2 == 0 else reversed(keys):
                    together[k].append(timed_eval(llms[k], None, [], toks, []).wall_us)
        for k, walls in together.items():
            entry["placements"][k]["together"] = {"wall_us": statistics.median(walls), "walls_us": walls}
            print(f"{run} {k}: loaded with the others, wall {statistics.median(walls) / 1e3:.1f} ms "
                  f"(alone {entry['placements'][k]['wall_us'] / 1e3:.1f})", flush=True)
        doc["models"][run] = entry
        Path(a.out).write_text(json.dumps(doc, indent=1))
    doc["load_avg_end"] = os.getloadavg()[0]
    Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
