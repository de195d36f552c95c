"""A prompt pass's attention cost per unit of work, by pass size and KV cache length, in one load.

The calibration times a prompt pass's attention spans (planner/cost/attnspan) at no cache and after
1024 cells, and the cost model extends that line to longer contexts. This script asks whether the
line's slope depends on the pass's size: for each pass size and each past, the layers' attention
spans (KQ ... KQV, or flash attention's node; found as attnspan finds them) are timed whole, the
pasts and sizes alternated round by round (the VM drifts between minutes), and each median is
divided by the spans' work (calfit.work: multiply-adds, the mean token's attended cells).

    python bench/scripts/bench_attnpass.py MODEL.gguf --pasts 0,1024,3584 --sizes 128,512 \
        [--threads 1] [--rounds 3] [--reps 3] [--fa on --cache f16] --out bench/results/SET

Writes SET/attnpass.json (every run's span sum, the works, the settings, commit, machine, load
average before and after) and SET/attnpass.md (the table: median ms, spread, ps per unit of work,
and the slope between consecutive pasts). CPU only. Nothing else may run on the machine meanwhile."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def measure(model: Path, pasts: list[int], sizes: list[int], threads: int, rounds: int, reps: int,
            fa: str, cache: str) -> dict[str, Any]:
    from oallama.planner.cost import attnspan
    from oallama.planner.cost.realpass import VIEW_OPS
    from oallama.runtime.generate import prompt_tokens
    from oallama.runtime.kvcache import llama_kwargs
    from oallama.runtime.llama import Llama

    n_ctx = -(-(max(pasts) + max(sizes) + 1) // 256) * 256
    llm = Llama(str(model), n_gpu_layers=0, op_offload=False, n_ctx=n_ctx, n_batch=max(sizes),
                n_ubatch=max(sizes), n_threads=threads, n_threads_batch=threads, verbose=False,
                **llama_kwargs(fa == "on", cache, cache))
    try:
        toks = prompt_tokens(llm, n_ctx)
        # per size: the stops bounding each span, which stop ends each span, and the spans' work per past
        info: dict[int, tuple[list[int], list[int], dict[int, float]]] = {}
        for n in sizes:
            nodes = {p: attnspan.node_list(llm, toks, n, p) for p in pasts}
            found = attnspan.spans(nodes[min(pasts)], nodes[max(pasts)], n, min(pasts), max(pasts))
            if not found:
                raise SystemExit(f"{model}: no attention spans found in a {n}-token pass")
            stops = sorted({k for a, b in found for k in (a - 1, b)})
            ends = [stops.index(b) for _, b in found]
            works = {p: sum(x for a, b in found for k, x in enumerate(attnspan.works(nodes[p], n, p))
                            if a <= k <= b and nodes[p][k].op not in VIEW_OPS) for p in pasts}
            info[n] = (stops, ends, works)
        runs: dict[tuple[int, int], list[float]] = defaultdict(list)  # (size, past) -> span sums, us
        for rnd in range(rounds):
            print(f"round {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
            for p in sorted(pasts, reverse=rnd % 2 == 0):
                for n in (sizes if rnd % 2 == 0 else sizes[::-1]):
                    stops, ends, _ = info[n]
                    for r in attnspan.time_stops(llm, toks, n, p, stops, reps):
                        runs[(n, p)].append(sum(r[c] for c in ends))
    finally:
        llm.close()
    rows = []
    for n in sizes:
        prev = None
        for p in pasts:
            v, w = runs[(n, p)], info[n][2][p]
            med = statistics.median(v)
            row = {"size": n, "past": p, "median_us": med, "min_us": min(v), "max_us": max(v), "runs_us": v,
                   "work": w, "ps_per_work": med / w * 1e6}
            if prev is not None:  # the growth between consecutive pasts per unit of added work
                row["slope_ps_per_work"] = (med - prev["median_us"]) / (w - prev["work"]) * 1e6
            rows.append(row)
            prev = row
    return {"rows": rows}


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| pass tokens | past cells | spans, median ms (min-max) | ps per unit of work | growth from the "
           "previous past, ps per unit of added work |", "|---|---|---|---|---|"]
    for r in rows:
        slope = f"{r['slope_ps_per_work']:.0f}" if "slope_ps_per_work" in r else ""
        out.append(f"| {r['size']} | {r['past']} | {r['median_us'] / 1e3:.2f} ({r['min_us'] / 1e3:.2f}-"
                   f"{r['max_us'] / 1e3:.2f}) | {r['ps_per_work']:.0f} | {slope} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--pasts", type=_ints, default=[0, 1024, 3584], help="KV cells before the pass")
    ap.add_argument("--sizes", type=_ints, default=[128, 512], help="tokens per pass")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="timed runs per pass, past and round")
    ap.add_argument("--fa", choices=("on", "off"), default="on")
    ap.add_argument("--cache", default="f16", help="K and V cache type")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not a.model.is_file():
        raise SystemExit(f"{a.model}: no such model file")
    load0 = os.getloadavg()
    res = measure(a.model, a.pasts, a.sizes, a.threads, a.rounds, a.reps, a.fa, a.cache)
    res.update(model=a.model.name, commit=git_commit(), machine=platform.node(), cpu=platform.processor(),
               date=date.today().isoformat(), threads=a.threads, rounds=a.rounds, reps=a.reps, flash_attn=a.fa,
               cache_type=a.cache, loadavg_before=load0, loadavg_after=os.getloadavg())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "attnpass.json").write_text(json.dumps(res, indent=1) + "\n")
    head = (f"{a.model.name}, CPU, {a.threads} thread(s), flash attention {a.fa}, {a.cache} cache; "
            f"{a.rounds} rounds x {a.reps} runs, pasts and sizes alternated; commit {res['commit'][:10]}, "
            f"{res['date']}, load average {load0[0]:.2f} before, {res['loadavg_after'][0]:.2f} after\n\n")
    (a.out / "attnpass.md").write_text(head + table(res["rows"]))
    print(head + table(res["rows"]))


if __name__ == "__main__":
    main()
