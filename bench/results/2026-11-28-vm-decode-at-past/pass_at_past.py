#!/usr/bin/env python3
"""Where a long prompt's time goes against its prediction: one 512-token pass after 0 to 7680 cells,
measured whole and predicted, per past (an experiment beside method 41's held-out set).

A prompt of P tokens runs P / 512 passes, the k-th after 512 k cells. The planner's TTFT is their sum;
the difference of two workloads' predicted TTFTs, prompts P + 512 and P, is its cost of the pass after P
cells. Each pass is measured in one load (flash attention on, f16 cache, 1 thread, ubatch 512), after a
cache written from a 32-token one (runtime.kvstate: a pass after N cells costs what N cells cost), the
pasts alternated round by round (ascending, then descending), each pass run `--reps` times. Prediction
from the profile the held-out run saved for the model's 8192-token row (no model is calibrated here).

    python pass_at_past.py MODEL.gguf:PROFILE.json [...] --pasts 0,1024,3584,7680 --rounds 3 --reps 2 --out DIR

Writes DIR/pass_at_past.json (every run) and prints the table. Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

N = 512  # tokens of a pass: the workloads' ubatch


def predicted_ms(model: Path, prof: Any, pasts: list[int]) -> dict[int, float]:
    """past -> the planner's cost of the 512-token pass after it (ms): TTFT(past + N) - TTFT(past)."""
    from oallama.planner.context import Workload, build_context
    from oallama.planner.cost.schedmodel import NEVER, Placement

    def ttft(prompt: int) -> float:
        wl = Workload(prompt=prompt, gen=17, n_ubatch=N, flash_attn="on", context=max(pasts) + N + 256)
        ctx = build_context(model, None, wl, profile=prof, threads=1, progress=False)
        return float(ctx.predict(Placement(frozenset(), 0, {w: NEVER for w in ctx.weight_bytes}))["ttft_ms"])

    return {p: ttft(p + N) - (ttft(p) if p else 0.0) for p in pasts}


def measured(model: Path, pasts: list[int], rounds: int, reps: int) -> list[dict[str, Any]]:
    from oallama.planner.cost.realpass import timed_eval
    from oallama.runtime import kvcache, kvstate
    from oallama.runtime.generate import prompt_tokens
    from oallama.runtime.llama import Llama

    n_ctx = -(-(max(pasts) + N + 2) // 256) * 256
    llm = Llama(str(model), n_ctx=n_ctx, n_batch=N, n_ubatch=N, n_threads=1, n_threads_batch=1, n_gpu_layers=0,
                verbose=False, **kvcache.llama_kwargs(True, "f16", "f16"))
    runs = []
    try:
        tokens = prompt_tokens(llm, n_ctx)
        llm.eval(tokens[:32])
        wide = kvstate.widen(kvstate.seq_state(llm), max(pasts))
        if wide is None:
            raise SystemExit(f"{model}: kvstate cannot write this model's cache")
        timed_eval(llm, None, [], tokens[:N], [])  # warm-up
        for r in range(rounds):
            for past in (pasts if r % 2 == 0 else pasts[::-1]):
                for k in range(reps):
                    if past:
                        kvstate.restore(llm, wide, tokens[:max(pasts)])
                    load = os.getloadavg()[0]
                    run = timed_eval(llm, None, tokens[:past], tokens[past:past + N], [])
                    runs.append({"round": r, "past": past, "rep": k, "ms": run.wall_us / 1e3, "load": load})
                    print(f"{model.name} round {r + 1} past {past}: {run.wall_us / 1e3:.1f} ms", file=sys.stderr,
                          flush=True)
    finally:
        llm.close()
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="MODEL.gguf:PROFILE.json")
    ap.add_argument("--pasts", default="0,1024,3584,7680")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from oallama.planner.cost.calfit import refitted
    from oallama.planner.cost.profile import Profile, cpu_detail

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from provenance import git_commit

    pasts = [int(x) for x in args.pasts.split(",")]
    doc: dict[str, Any] = {"commit": git_commit(), "cpu_detail": cpu_detail(), "started": time.strftime("%H:%M:%S"),
                           "pasts": pasts, "rounds": args.rounds, "reps": args.reps, "models": {}}
    for spec in args.models:
        model_s, prof_s = spec.rsplit(":", 1)
        model = Path(model_s)
        prof = Profile.from_json(json.loads(Path(prof_s).read_text()), prof_s)
        if prof.calibration is not None:
            prof.calibration = refitted(prof.calibration, prof)
        pred = predicted_ms(model, prof, pasts)
        runs = measured(model, pasts, args.rounds, args.reps)
        doc["models"][model.name] = {"profile": prof_s, "predicted_ms": pred, "runs": runs}
    doc["finished"] = time.strftime("%H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pass_at_past.json").write_text(json.dumps(doc, indent=1) + "\n")
    print("| model | past | measured ms (median, range) | predicted ms | error | measured growth from 0 | predicted growth |")
    print("|---|---|---|---|---|---|---|")
    for name, m in doc["models"].items():
        med = {p: statistics.median(r["ms"] for r in m["runs"] if r["past"] == p) for p in pasts}
        for p in pasts:
            xs = [r["ms"] for r in m["runs"] if r["past"] == p]
            pr = m["predicted_ms"][p]
            print(f"| {name} | {p} | {med[p]:.0f} ({min(xs):.0f}-{max(xs):.0f}) | {pr:.0f} | {pr / med[p] - 1:+.1%} | "
                  f"{med[p] - med[pasts[0]]:.0f} | {pr - m['predicted_ms'][pasts[0]]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
