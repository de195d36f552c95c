"""How llama-server runs N requests that arrive together, against the lockstep oallama plans for.

oallama's workload (`planner.workload.Workload`) runs a sequence's prompt, then the next's, and then
gen - 1 decode passes of one token of every sequence; `runtime.generate.timed_parallel` (which
confirmation and the layout benchmarks measure with) runs exactly that. llama-server with continuous
batching (its default) does not: each loop of `update_slots` (tools/server/server-context.cpp) puts
the last sampled token of every generating slot first and then prompt tokens of the slots still
reading theirs, slot after slot, up to n_batch; llama_decode splits that batch (src/llama-batch.cpp,
`split_equal` in order of sequence ids when each sequence has its own KV stream).

For each workload this script, in one process, alternating round by round:
- `server`: the stock llama-server with the command a plan emits (-c, -b = -ub, -fa, --swa-full, -np,
  --no-kv-unified, --fit off, -t/-tb), N streamed /completion requests sent together (the same
  prompt's token ids, greedy, ignore_eos, cache_prompt off); each request's first-token and last-token
  times on the client, the wall until the last request ends;
- `lockstep`: `timed_parallel` on oallama's load of the same model and settings (what plans predict);
- `replay`: the batches `oallama.runtime.slots.server_batches` says the server forms for requests that
  arrive together, decoded through oallama's load as llama-server submits them (`slots.replay`);
- `replay_first_alone`: the same when the first request's prompt starts a loop before the others arrive.
It also prints the ubatches llama.cpp splits the server's batches into (`slots.split`), and the lockstep
plan's prediction (a CPU-only `oallama plan --strategy layers`: predicted TTFT, TPOT, e2e).

    python slots.py MODEL.gguf --workloads 512:64:4,100:64:4 --rounds 5 -o results.json
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
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import oallama
from oallama.runtime.generate import prompt_tokens, timed_parallel
from oallama.runtime.slots import Part, replay, server_batches, split

THREADS = 2


def _stream(url: str, tokens: list[int], gen: int, t0: float, rec: dict[str, Any]) -> None:
    doc = {"prompt": tokens, "n_predict": gen, "ignore_eos": True, "cache_prompt": False, "stream": True,
           "temperature": 0.0, "top_k": 1, "samplers": ["top_k"]}
    req = urllib.request.Request(url + "/completion", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            if "first_s" not in rec:
                rec["first_s"] = time.perf_counter() - t0
            if ev.get("stop"):
                rec["end_s"] = time.perf_counter() - t0
                rec["predicted_n"] = ev.get("timings", {}).get("predicted_n")
                rec["tokens_predicted"] = ev.get("tokens_predicted")


def server_round(url: str, tokens: list[int], n_seqs: int, gen: int) -> dict[str, Any]:
    recs: list[dict[str, Any]] = [{} for _ in range(n_seqs)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_stream, args=(url, tokens, gen, t0, recs[k])) for k in range(n_seqs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "first_s": sorted(r["first_s"] for r in recs), "end_s": sorted(r["end_s"] for r in recs),
            "tokens_predicted": [r.get("tokens_predicted") for r in recs]}


def lockstep_round(llm: Any, tokens: list[int], n_seqs: int, gen: int) -> dict[str, Any]:
    g = timed_parallel(llm, tokens, n_seqs, gen)
    firsts = [sum(g.prompt_s[:k + 1]) for k in range(n_seqs)]
    wall = sum(g.prompt_s) + sum(g.pass_s)
    return {"wall_s": wall, "first_s": firsts, "end_s": [wall] * n_seqs}


def replay_round(llm: Any, tokens: list[int], batches: list[list[Part]]) -> dict[str, Any]:
    g = replay(llm, tokens, batches)
    return {"wall_s": g.wall_s, "first_s": sorted(g.first_s), "end_s": sorted(g.end_s)}


def n_ctx_for(prompt: int, gen: int, n_seqs: int) -> int:
    from oallama.planner.workload import Workload

    return Workload(prompt=prompt, gen=gen, parallel=n_seqs).n_ctx


def predicted(model: str, prompt: int, gen: int, n_seqs: int, ubatch: int) -> dict[str, Any]:
    """The lockstep plan's prediction: a CPU-only `oallama plan --strategy layers` (llama.cpp's own
    placement and layouts), unconfirmed."""
    with contextlib.suppress(FileNotFoundError):
        os.remove("/tmp/slots-plan.json")
    cmd = [sys.executable, "-m", "oallama", "plan", model, "--strategy", "layers", "--prompt", str(prompt), "--gen", str(gen),
           "--ubatch", str(ubatch), "-np", str(n_seqs), "--threads", str(THREADS), "--quiet", "--no-confirm",
           "-o", "/tmp/slots-plan.json"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    plan = json.loads(Path("/tmp/slots-plan.json").read_text())
    return {"strategy": plan.get("strategy"), "predicted": {k: plan["predicted"][k] for k in ("ttft_ms", "tpot_ms",
                                                                                              "e2e_ms")},
            "passes": {k: v["total_ms"] for k, v in plan["predicted"]["passes"].items()}}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        return statistics.median(xs)
    walls = [r["wall_s"] for r in rows]
    return {"wall_s": med(walls), "wall_min_max": [min(walls), max(walls)],
            "ttft_mean_s": med([statistics.mean(r["first_s"]) for r in rows]),
            "ttft_first_s": med([r["first_s"][0] for r in rows])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--workloads", default="512:64:4,100:64:4", help="PROMPT:GEN:N,...")
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-o", "--output", default="results.json")
    a = ap.parse_args()
    out: dict[str, Any] = {"machine": platform.node(), "cpus": os.cpu_count(), "model": a.model,
                           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip(), "ubatch": a.ubatch,
                           "threads": THREADS, "workloads": []}
    for w in a.workloads.split(","):
        prompt, gen, n_seqs = map(int, w.split(":"))
        n_ctx = n_ctx_for(prompt, gen, n_seqs)
        batches = server_batches(n_seqs, prompt, gen, a.ubatch)
        later = server_batches(n_seqs, prompt, gen, a.ubatch, later=1)
        shapes = Counter(tuple(u) for bt in batches for u in split(bt, a.ubatch, unified=False))
        shapes_later = Counter(tuple(u) for bt in later for u in split(bt, a.ubatch, unified=False))
        rec: dict[str, Any] = {"prompt": prompt, "gen": gen, "parallel": n_seqs, "n_ctx": n_ctx,
                               "server_batches": len(batches),
                               "server_ubatches": {f"{n}/{s}/{o}": c for (n, s, o), c in sorted(shapes.items())},
                               "server_batches_first_alone": len(later),
                               "server_ubatches_first_alone": {f"{n}/{s}/{o}": c for (n, s, o), c
                                                               in sorted(shapes_later.items())},
                               "lockstep_ubatches": n_seqs * -(-prompt // a.ubatch) + gen - 1,
                               "plan": predicted(a.model, prompt, gen, n_seqs, a.ubatch),
                               "rounds": {"server": [], "lockstep": [], "replay": [], "replay_first_alone": []}}
        print(f"workload {w}: n_ctx {n_ctx}; server: {len(batches)} batches, "
              f"{sum(shapes.values())} ubatches {dict(shapes)}; the first request alone: {len(later)} batches, "
              f"{sum(shapes_later.values())} ubatches {dict(shapes_later)}", flush=True)
        args = ["-m", a.model, "-c", str(n_ctx), "-b", str(a.ubatch), "-ub", str(a.ubatch), "-fa", "off", "--swa-full",
                "-np", str(n_seqs), "--no-kv-unified", "--fit", "off", "-t", str(THREADS), "-tb", str(THREADS),
                "-ngl", "0"]
        llm = oallama.Llama(a.model, n_ctx=n_ctx, n_batch=a.ubatch, n_ubatch=a.ubatch, n_threads=THREADS,
                            n_threads_batch=THREADS, n_seq_max=n_seqs, kv_unified=False, flash_attn=False,
                            verbose=False)
        tokens = prompt_tokens(llm, prompt)
        log = Path(a.output).with_suffix(f".server-{prompt}-{gen}-{n_seqs}.log")
        sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
        from helpers import stock_server

        with contextlib.closing(llm), stock_server(args, log) as url:
            server_round(url, tokens, n_seqs, gen)  # warm-up
            lockstep_round(llm, tokens, n_seqs, gen)
            replay_round(llm, tokens, batches)
            replay_round(llm, tokens, later)
            kinds = ("server", "lockstep", "replay", "replay_first_alone")
            for r in range(a.rounds):
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    la = os.getloadavg()[0]
                    if kind == "server":
                        row = server_round(url, tokens, n_seqs, gen)
                    elif kind == "lockstep":
                        row = lockstep_round(llm, tokens, n_seqs, gen)
                    else:
                        row = replay_round(llm, tokens, batches if kind == "replay" else later)
                    row["load1"] = la
                    rec["rounds"][kind].append(row)
                    print(f"  round {r + 1} {kind:<18} wall {row['wall_s'] * 1e3:8.1f} ms  mean TTFT "
                          f"{statistics.mean(row['first_s']) * 1e3:8.1f} ms  load {la:.2f}", flush=True)
        rec["summary"] = {k: summary(v) for k, v in rec["rounds"].items()}
        out["workloads"].append(rec)
        print(json.dumps({"plan": rec["plan"]["predicted"], **rec["summary"]}, indent=1), flush=True)
    Path(a.output).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
