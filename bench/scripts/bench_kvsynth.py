"""Can a long KV cache be written instead of computed, for timing what runs after it?

Timing a pass after N cells needs N cells in the KV cache. Filling them by evaluating a prompt costs
the prompt's time (Llama-3-8B cut to 1 layer, 4096 tokens at 1 thread: about 13 s; 8192: about 38 s),
which is why the calibration times attention only up to 1024 cells. A pass's cost does not depend on the
cached values (no op of a dense attention skips work by value), only on how many cells there are, so the
cache could be restored from a sequence state written for N cells: the state of a short real fill
(`llama_state_seq_get_data`), its cells repeated up to N with positions 0..N-1, restored with
`llama_state_seq_set_data` (oallama.runtime.kvstate). This script times the same passes after the cells
three ways, in one load: `computed` (a real prompt of N tokens, timed right after it, each round), `restored` (that round's computed
cells saved and restored) and `written` (the short fill's cells repeated); restored and written alternate
rep by rep, so their ratio is paired against the VM's drift, and restored against computed says whether
restoring alone changes a pass:

    python bench/scripts/bench_kvsynth.py MODEL.gguf --cells 4096 [--seed-cells 1024] [--threads 1]
        [--rounds 3] [--reps 5] [--fa on --cache f16] --out bench/results/SET

Passes timed after the N cells: a decode pass (1 token) and a 512-token prompt pass, each as a whole
(wall time, synchronised; `realpass.timed_eval`). Writes SET/kvsynth-<model>-<N>-fa<on|off>-<cache>.json
(every run, fill times, settings, commit, machine, load averages) and a line of the table to
SET/kvsynth.md. CPU only, models with one KV cache (no sliding window). Nothing else may run on the machine meanwhile."""

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


def measure(model: Path, cells: int, seed: int, threads: int, rounds: int, reps: int, fa: str,
            cache: str) -> dict[str, Any]:
    from oallama.planner.cost.realpass import timed_eval
    from oallama.runtime import kvstate
    from oallama.runtime.generate import prompt_tokens
    from oallama.runtime.kvcache import llama_kwargs
    from oallama.runtime.llama import Llama

    prompt = 512
    n_ctx = -(-(cells + prompt + 1) // 256) * 256
    llm = Llama(str(model), n_gpu_layers=0, op_offload=False, n_ctx=n_ctx, n_batch=prompt, n_ubatch=prompt,
                n_threads=threads, n_threads_batch=threads, verbose=False, **llama_kwargs(fa == "on", cache, cache))
    try:
        toks = prompt_tokens(llm, n_ctx)
        llm.eval(toks[:seed])
        wide = kvstate.widen(kvstate.seq_state(llm), cells)
        if wide is None:
            raise SystemExit(f"{model}: its KV cache's state is not one stream of one cache (kvstate.widen)")
        kinds = ("computed", "restored", "written")
        runs: dict[str, dict[str, list[float]]] = {k: {"1": [], str(prompt): []} for k in kinds}
        fills: dict[str, list[float]] = {k: [] for k in kinds}

        def timed(kind: str) -> None:
            for n in (1, prompt):
                r = timed_eval(llm, None, toks[:cells], toks[cells:cells + n], [])
                runs[kind][str(n)].append(r.wall_us)

        for rnd in range(rounds):
            print(f"round {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            llm.reset()
            llm.eval(toks[:cells])  # the cache computed: a real prompt of `cells` tokens
            fills["computed"].append(time.perf_counter() - t0)
            for _ in range(reps):
                timed("computed")
            real = kvstate.seq_state(llm)
            # then rep by rep, alternated: the computed cells restored, and the written ones
            for rep in range(reps):
                for kind in (("restored", "written") if (rnd + rep) % 2 == 0 else ("written", "restored")):
                    t0 = time.perf_counter()
                    kvstate.restore(llm, real if kind == "restored" else wide, toks[:cells])
                    fills[kind].append(time.perf_counter() - t0)
                    timed(kind)
    finally:
        llm.close()
    return {"runs_us": runs, "fill_s": fills, "state_bytes": len(wide)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--cells", type=int, default=4096, help="KV cells before the timed passes")
    ap.add_argument("--seed-cells", type=int, default=1024, help="cells filled for real and repeated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per pass, fill and round")
    ap.add_argument("--fa", choices=("on", "off"), default="on")
    ap.add_argument("--cache", default="f16", help="K and V cache type")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not a.model.is_file():
        raise SystemExit(f"{a.model}: no such model file")
    load0 = os.getloadavg()
    res = measure(a.model, a.cells, a.seed_cells, a.threads, a.rounds, a.reps, a.fa, a.cache)
    res.update(model=a.model.name, cells=a.cells, seed_cells=a.seed_cells, commit=git_commit(),
               machine=platform.node(), cpu=platform.processor(), date=date.today().isoformat(), threads=a.threads,
               rounds=a.rounds, reps=a.reps, flash_attn=a.fa, cache_type=a.cache, loadavg_before=load0,
               loadavg_after=os.getloadavg())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"kvsynth-{a.model.stem}-{a.cells}-fa{a.fa}-{a.cache}.json").write_text(json.dumps(res, indent=1) + "\n")
    cols = []
    for n in ("1", "512"):
        r = res["runs_us"]
        c, rs, w = (statistics.median(r[k][n]) for k in ("computed", "restored", "written"))
        paired = statistics.median(x / y for x, y in zip(r["written"][n], r["restored"][n], strict=True))
        cols.append(f"{c / 1e3:.2f} / {rs / 1e3:.2f} / {w / 1e3:.2f} ms (written / restored paired "
                    f"{paired:.3f})")
    fill = " / ".join(f"{statistics.median(res['fill_s'][k]):.2f}" for k in ("computed", "restored", "written"))
    line = (f"| {a.model.name} | {a.cells} | {a.fa}, {a.cache}, {a.threads} thr | {cols[0]} | {cols[1]} | {fill} s | "
            f"{load0[0]:.2f}-{res['loadavg_after'][0]:.2f} | {res['commit'][:10]} |\n")
    md = a.out / "kvsynth.md"
    if not md.exists():
        md.write_text("| model | cells | settings | decode pass: computed / restored / written | 512-token pass: "
                      "the same | fill: computed / restored / written | load avg | commit |\n"
                      "|---|---|---|---|---|---|---|---|\n")
    with md.open("a") as f:
        f.write(line)
    print(line, end="")


if __name__ == "__main__":
    main()
