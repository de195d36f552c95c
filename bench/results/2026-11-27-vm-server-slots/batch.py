"""The server's batch size (-b) with several slots: the plan's pinned -b = -ub against llama-server's
default 2048, on the stock server and in `slots.replay` of the batches `slots.server_batches` says each
forms (the first request's loop alone: requests sent together reach the server ms apart).

At -b = -ub = 512, once a slot generates, the next 512-token prompt no longer fits a loop's batch:
its last token waits a whole loop (slots.py's results). With -b 2048 a loop holds the prompts whole.
Per workload: two stock servers (-b 512, -b 2048; every other setting the plan's) and one oallama
load, alternated round by round (4 kinds, forwards then backwards).

    python batch.py MODEL.gguf --workload 512:64:4 --rounds 6 -o batch.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import oallama
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.slots import server_batches, split

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from slots import THREADS, n_ctx_for, replay_round, server_round

from helpers import stock_server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--workload", default="512:64:4", help="PROMPT:GEN:N")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--batches", default="512,2048", help="the -b values")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("-o", "--output", default="batch.json")
    a = ap.parse_args()
    prompt, gen, n_seqs = map(int, a.workload.split(":"))
    n_ctx = n_ctx_for(prompt, gen, n_seqs)
    sizes = [int(b) for b in a.batches.split(",")]
    plans = {b: server_batches(n_seqs, prompt, gen, b, later=1) for b in sizes}
    out: dict[str, Any] = {"machine": platform.node(), "cpus": os.cpu_count(), "model": a.model,
                           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip(), "ubatch": a.ubatch, "threads": THREADS,
                           "prompt": prompt, "gen": gen, "parallel": n_seqs, "n_ctx": n_ctx,
                           "census": {str(b): {f"{n}/{s}/{o}": c for (n, s, o), c in sorted(Counter(
                               tuple(u) for bt in bs for u in split(bt, a.ubatch, unified=False)).items())}
                               for b, bs in plans.items()},
                           "rounds": {f"{k}-b{b}": [] for b in sizes for k in ("server", "replay")}}
    for b, bs in plans.items():
        print(f"-b {b}: {len(bs)} batches, ubatches {out['census'][str(b)]}", flush=True)

    def args(b: int) -> list[str]:
        return ["-m", a.model, "-c", str(n_ctx), "-b", str(b), "-ub", str(a.ubatch), "-fa", "off", "--swa-full",
                "-np", str(n_seqs), "--no-kv-unified", "--fit", "off", "-t", str(THREADS), "-tb", str(THREADS),
                "-ngl", "0"]

    llm = oallama.Llama(a.model, n_ctx=n_ctx, n_batch=max(sizes), n_ubatch=a.ubatch, n_threads=THREADS,
                        n_threads_batch=THREADS, n_seq_max=n_seqs, kv_unified=False, flash_attn=False, verbose=False)
    out_path = Path(a.output)
    with contextlib.closing(llm), contextlib.ExitStack() as stack:
        urls = {b: stack.enter_context(stock_server(args(b), out_path.with_suffix(f".server-b{b}.log"))) for b in sizes}
        tokens = prompt_tokens(llm, prompt)
        for b in sizes:  # warm-up
            server_round(urls[b], tokens, n_seqs, gen)
            replay_round(llm, tokens, plans[b])
        kinds = [(k, b) for b in sizes for k in ("server", "replay")]
        for r in range(a.rounds):
            for k, b in kinds if r % 2 == 0 else kinds[::-1]:
                la = os.getloadavg()[0]
                row = server_round(urls[b], tokens, n_seqs, gen) if k == "server" else replay_round(llm, tokens,
                                                                                                  plans[b])
                row["load1"] = la
                out["rounds"][f"{k}-b{b}"].append(row)
                print(f"  round {r + 1} {k:<7} -b {b:<5} wall {row['wall_s'] * 1e3:8.1f} ms  mean TTFT "
                      f"{statistics.mean(row['first_s']) * 1e3:8.1f} ms  load {la:.2f}", flush=True)
    base = out["rounds"][f"server-b{sizes[0]}"]
    for key, rows in out["rounds"].items():
        walls = [r["wall_s"] * 1e3 for r in rows]
        ttft = [statistics.mean(r["first_s"]) * 1e3 for r in rows]
        rw = [r["wall_s"] / q["wall_s"] for r, q in zip(rows, base, strict=True)]
        rt = [statistics.mean(r["first_s"]) / statistics.mean(q["first_s"]) for r, q in zip(rows, base, strict=True)]
        slots = [round(statistics.median(r["first_s"][i] for r in rows) * 1e3) for i in range(n_seqs)]
        print(f"{key:<14} e2e {statistics.median(walls):8.0f} ms ({min(walls):.0f}-{max(walls):.0f}), "
              f"/server-b{sizes[0]} {statistics.median(rw):.3f} ({min(rw):.3f}-{max(rw):.3f}); mean TTFT "
              f"{statistics.median(ttft):7.0f} ms, /server-b{sizes[0]} {statistics.median(rt):.3f}; "
              f"first tokens {slots} ms", flush=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
