#!/usr/bin/env python3
"""Benchmark: a bench cell's placements loaded side by side in ONE process and measured alternately.

`oallama bench` runs every configuration in its own process, seconds to minutes apart. On a
machine whose speed drifts (the project's VM: the same placement 1.5x slower a minute later,
`bench/results/2026-11-23-vm-method14/README.md`) a cell's strategies are then compared across
different machine states, and `optimal` can measure "behind" a placement it beats in any one
moment. This script takes the plans a finished bench run wrote (`DIR/raw/*.plan.json`, round 1),
loads every distinct placement of a cell at once (each with its own loopback rpc-server on a fresh
port), and runs one generation of each in turn, for --rounds rounds (the order reversed every
other round). Each placement's e2e is compared with `optimal`'s of the same round: the median of
those paired ratios is what the machine's drift cannot move, and it is set beside the ratio the
planner predicted. Output: DIR/ab/ab.json (every round), DIR/ab/ab.md.

    python bench/scripts/bench_ab.py bench/results/<dir> [--model SUBSTR] [--rounds 15]
    python bench/scripts/bench_ab.py bench/results/<dir> --markdown-only   # ab.md again from ab.json
    python bench/scripts/bench_ab.py bench/results/<dir> --budget 50%,75%  # these cells again, the rest kept

Cells measured again replace their earlier entry in ab.json; the others stay (each cell records its
commit and time). Only CPU + loopback rpc-server runs (the bench's `--rpc-local`) are replayed; the plans are
rewritten to the new servers' ports. A cell whose models would not fit in host memory twice over
is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import git_commit

TOLERANCE = 0.03  # issue 13: optimal within 3% of the best other strategy


def _cells(raw_dir: Path, model: str | None, budgets: set[str] | None = None) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """(model, prompt, gen, budget) -> round-1 raw results of that cell, one per distinct load
    (same placement key and op offload: `layers` and `fit` often share one; labels joined)."""
    cells: dict[tuple[Any, ...], dict[tuple[Any, ...], dict[str, Any]]] = defaultdict(dict)
    for f in sorted(raw_dir.glob("*.json")):
        if not re.fullmatch(r"[0-9a-f]{16}\.json", f.name):
            continue  # plans, specs, later rounds
        doc = json.loads(f.read_text())
        c = doc.get("config") or {}
        if doc.get("status") != "ok" or (model and model not in c.get("model_name", "")):
            continue
        if doc["meta"].get("device_kind") != "rpc":
            continue
        cell = (c["model_name"], c["prompt"], c["gen"], c["budget"])
        if budgets and c["budget"] not in budgets:
            continue
        load = (doc.get("placement_key"), c["op_offload"])
        label = c["series"]
        if load in cells[cell]:
            cells[cell][load]["labels"].append(label)
        else:
            cells[cell][load] = {"labels": [label], "raw": doc}
    return {k: list(v.values()) for k, v in sorted(cells.items(), key=lambda kv: str(kv[0]))}


def _available_bytes() -> int:
    """Memory the loads can take (bytes): MemAvailable, which counts the page cache a previous cell's
    model file left (free pages alone do not: after one 8B cell they read 18 of 23 GiB)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _label(entry: dict[str, Any]) -> str:
    return " = ".join(entry["labels"])


def _run_cell(cell: tuple[Any, ...], entries: list[dict[str, Any]], rounds: int, tmp: Path) -> dict[str, Any] | None:
    from oallama.runtime.generate import prompt_tokens, timed_generate
    from oallama.runtime.llama import Llama
    from oallama.runtime.rpc import start_server

    model_name, prompt_n, gen, budget = cell
    cfg0 = entries[0]["raw"]["config"]
    wbytes = os.path.getsize(cfg0["model"])
    avail = _available_bytes()
    if wbytes * (len(entries) + 1) > avail:
        print(f"ab: {model_name} @{budget}: {len(entries)} loads of {wbytes / 2**30:.1f} GiB would not fit in "
              f"{avail / 2**30:.1f} GiB free: skipped", file=sys.stderr)
        return None
    servers, llms = [], []
    try:
        for k, e in enumerate(entries):
            raw = e["raw"]
            st = raw["config"]["settings"]
            plan_text = Path(raw["plan_file"]).read_text()
            old = json.loads(plan_text)["accelerator"]
            m = re.search(r"threads=(\d+)", str(raw["meta"].get("device_identity") or raw["config"].get("device_identity")))
            srv = start_server(port=None, threads=int(m.group(1)) if m else 1)  # the bench's server threads
            servers.append(srv)
            plan = tmp / f"{raw['id']}.plan.json"
            plan.write_text(plan_text.replace(old, srv.device_name))
            llms.append(Llama(raw["config"]["model"], placement=str(plan), n_ctx=raw["config"]["n_ctx"],
                              n_batch=st["n_batch"], n_ubatch=st["n_ubatch"], n_threads=st["threads"],
                              n_threads_batch=st["threads"], flash_attn=st["flash_attn"], use_mmap=st["mmap"],
                              op_offload=raw["config"]["op_offload"], seed=1234, verbose=False))
            print(f"ab: {model_name} @{budget}: loaded {_label(e)} ({k + 1}/{len(entries)})", file=sys.stderr)
        prompt = prompt_tokens(llms[0], prompt_n)
        for llm in llms:  # warm-up
            timed_generate(llm, prompt, gen, temperature=0.0)
        samples: list[list[dict[str, float]]] = [[] for _ in entries]
        load_start = os.getloadavg()[0]
        for r in range(rounds):
            order = list(range(len(entries))) if r % 2 == 0 else list(reversed(range(len(entries))))
            for i in order:
                g = timed_generate(llms[i], prompt, gen, temperature=0.0)
                samples[i].append({"ttft_ms": g.ttft_s * 1e3, "tpot_ms": g.tpot_s * 1e3, "e2e_ms": g.e2e_s * 1e3})
            print(f"\rab: {model_name} @{budget}: round {r + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        load_end = os.getloadavg()[0]
    finally:
        for llm in llms:
            llm.close()
        for srv in servers:
            srv.stop()
    return {"model": model_name, "prompt": prompt_n, "gen": gen, "budget": budget, "rounds": rounds,
            "commit": git_commit(short=True), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_avg_start": load_start, "load_avg_end": load_end,
            "placements": [{"label": _label(e), "labels": e["labels"], "config_id": e["raw"]["id"],
                            "placement_key": e["raw"].get("placement_key"),
                            "predicted": {m: e["raw"]["plan"]["predicted"][m] for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
                            "samples": s} for e, s in zip(entries, samples, strict=True)]}


def _summary(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Per placement: medians, and the median over rounds of its e2e / optimal's e2e in the same
    round (measured) beside predicted e2e / optimal's predicted e2e."""
    pls = cell["placements"]
    opt = next((p for p in pls if "optimal" in p["labels"]), None)
    rows = []
    for p in pls:
        e2e = [s["e2e_ms"] for s in p["samples"]]
        row = {"label": p["label"], **{f"{m}_median": statistics.median(s[m] for s in p["samples"])
                                       for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
               "predicted_e2e_ms": p["predicted"]["e2e_ms"]}
        if opt is not None:
            ratios = sorted(a / b for a, b in zip(e2e, (s["e2e_ms"] for s in opt["samples"]), strict=True))
            row["vs_optimal"] = statistics.median(ratios)
            row["vs_optimal_iqr"] = (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4])
            row["predicted_vs_optimal"] = p["predicted"]["e2e_ms"] / opt["predicted"]["e2e_ms"]
        rows.append(row)
    return rows


def _markdown(cells: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    commits = ", ".join(sorted({str(c.get("commit", meta["commit"])) for c in cells})) or meta["commit"]
    rounds = "/".join(str(r) for r in sorted({int(c["rounds"]) for c in cells})) or meta["rounds"]
    head = ["# Alternated A/B of bench cells (one process per cell)", "",
             f"From `{meta['source']}` (its round-1 plans); oallama {commits}, {meta['machine']}; "
             f"{rounds} rounds per cell, each placement one generation per round in turn (order reversed "
             "every other round), after one warm-up generation each. `vs optimal`: median over rounds of this "
             "placement's e2e / `optimal`'s e2e in the same round (> 1: slower than `optimal`), interquartile "
             "range in brackets; `pred`: the planner's predicted ratio.", ""]
    lines: list[str] = []
    behind = 0
    compared = 0
    ratio_errs: list[float] = []  # |predicted / measured - 1| of each placement's ratio to optimal
    for c in cells:
        rows = _summary(c)
        lines += [f"## {c['model']}, prompt {c['prompt']} / gen {c['gen']}, budget {c['budget']} "
                  f"(load average {c['load_avg_start']:.2f} -> {c['load_avg_end']:.2f})", "",
                  "| placement | TTFT ms | TPOT ms | e2e ms | pred e2e ms | vs optimal | pred |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            vs = (f"{r['vs_optimal']:.3f} [{r['vs_optimal_iqr'][0]:.3f}..{r['vs_optimal_iqr'][1]:.3f}]"
                  if "vs_optimal" in r else "-")
            pred = f"{r['predicted_vs_optimal']:.3f}" if "predicted_vs_optimal" in r else "-"
            lines.append(f"| {r['label']} | {r['ttft_ms_median']:.1f} | {r['tpot_ms_median']:.2f} | "
                         f"{r['e2e_ms_median']:.1f} | {r['predicted_e2e_ms']:.1f} | {vs} | {pred} |")
        others = [r for r in rows if "vs_optimal" in r and "optimal" not in r["label"].split(" = ")]
        ratio_errs += [abs(r["predicted_vs_optimal"] / r["vs_optimal"] - 1) for r in others]
        if others:
            compared += 1
            best = min(others, key=lambda r: r["vs_optimal"])
            lag = 1 / best["vs_optimal"] - 1  # optimal's e2e over the best other's, paired, less 1
            behind += lag > TOLERANCE
            lines += ["", f"`optimal` is {100 * lag:.1f}% behind {best['label']}." if lag > TOLERANCE
                      else f"`optimal` is ahead or within {100 * TOLERANCE:.0f}%."]
        lines.append("")
    verdict = [f"`optimal` more than {100 * TOLERANCE:.0f}% behind the best other placement (paired median) in "
               f"{behind} of {compared} cell(s)."]
    if ratio_errs:
        errs = sorted(ratio_errs)
        verdict.append(f"The predicted ratio to `optimal` against the measured one, |predicted / measured - 1| over "
                       f"{len(errs)} placement(s): median {100 * statistics.median(errs):.1f}%, largest "
                       f"{100 * errs[-1]:.1f}%.")
    verdict.append("")
    return "\n".join([*head, *verdict, *lines])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, help="a bench results directory with its raw/ (CPU + loopback rpc-server)")
    ap.add_argument("--model", help="only models whose name contains this")
    ap.add_argument("--budget", help="only these budgets (comma-separated, as the bench wrote them: 25%%,50%%)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--markdown-only", action="store_true", help="write ab.md again from ab.json, measure nothing")
    args = ap.parse_args()
    out = args.results / "ab"
    if args.markdown_only:
        if not (out / "ab.json").is_file():
            sys.exit(f"bench_ab: {out / 'ab.json'}: not there (run without --markdown-only first)")
        doc = json.loads((out / "ab.json").read_text())
        (out / "ab.md").write_text(_markdown(doc["cells"], doc["meta"]))
        print(f"bench_ab: wrote {out}/ab.md from ab.json", file=sys.stderr)
        return 0
    raw_dir = args.results / "raw"
    if not raw_dir.is_dir():
        sys.exit(f"bench_ab: {raw_dir}: no raw results (run `oallama bench` there first)")
    budgets = {b.strip() for b in args.budget.split(",")} if args.budget else None
    cells = _cells(raw_dir, args.model, budgets)
    if not cells:
        sys.exit(f"bench_ab: {raw_dir}: no finished CPU + rpc-server configurations"
                 + (f" of a model matching {args.model!r}" if args.model else "")
                 + (f" at budget {args.budget}" if budgets else ""))
    out_cells = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="oallama-ab-") as tmp:
        for cell, entries in cells.items():
            res = _run_cell(cell, entries, args.rounds, Path(tmp))
            if res is not None:
                out_cells.append(res)
    meta = {"source": str(args.results), "commit": git_commit(short=True), "rounds": args.rounds,
            "machine": next(iter(cells.values()))[0]["raw"]["meta"].get("machine"), "seconds": time.time() - t0}
    out.mkdir(exist_ok=True)
    if (out / "ab.json").is_file():  # keep the cells not measured again
        def key(c: dict[str, Any]) -> tuple[Any, ...]:
            return (c["model"], c["prompt"], c["gen"], c["budget"])
        new = {key(c) for c in out_cells}
        kept = [c for c in json.loads((out / "ab.json").read_text())["cells"] if key(c) not in new]
        out_cells = sorted([*kept, *out_cells], key=lambda c: str(key(c)))
    (out / "ab.json").write_text(json.dumps({"meta": meta, "cells": out_cells}, indent=1) + "\n")
    (out / "ab.md").write_text(_markdown(out_cells, meta))
    print(f"bench_ab: wrote {out}/ab.json and ab.md ({len(out_cells)} cells in {meta['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
