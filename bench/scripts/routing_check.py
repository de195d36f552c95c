#!/usr/bin/env python3
"""What a streamed expert tensor really copies, against the cost model (calibration method 10).

For each mixture-of-experts model: its routing recorded in one 512-token pass of the fixed prompt
(`planner.cost.routing`: distinct experts per layer over every window of n consecutive tokens), then
prompt passes of n tokens through a loopback rpc-server with every expert tensor on the host and
streamed to the server at any batch (patch 0001; plain layout: a repacked weight cannot stream),
each window of the prompt once; the bytes that crossed (TCP bytes acknowledged, `rpc.bytes_acked`:
the routed experts, plus a few KB of activations and graph) against the bytes the model predicts
with the recorded routing and with uniform routing (`schedmodel.expert_fraction`).

    python bench/scripts/routing_check.py MODEL.gguf [MODEL.gguf ...] --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import oallama
from oallama import _core
from oallama.model import gguf_file
from oallama.planner.cost.profile import PLAIN
from oallama.planner.cost.routing import measure
from oallama.planner.cost.schedmodel import expert_fraction, expert_shares
from oallama.planner.graph import inventory
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from provenance import git_commit

SIZES = (1, 4, 16, 64)
N_CTX = 512


def check(path: str, server: rpc.RpcServer) -> dict:
    info = gguf_file.check_model(path)
    n_expert = int(info.hparam("expert_count", 0))
    routing = measure(path, n_expert, n_tokens=N_CTX, threads=2, progress=False)
    exps = {t.name: t.nbytes for t in info.tensors if "_exps." in t.name}  # bytes
    whole = sum(exps.values())
    inv = inventory(path, SIZES, n_ctx=N_CTX)
    rows = []
    for n in SIZES:
        llm = oallama.Llama(path, devices=[server.device_name], n_gpu_layers=0, n_ctx=N_CTX, n_batch=n, n_ubatch=n,
                            n_threads=2, verbose=False, layouts={t.name: PLAIN for t in info.tensors})
        try:
            _core.set_offload_policy(llm.native_context, dict.fromkeys(exps, 1))  # stream them at any batch
            tokens = prompt_tokens(llm, N_CTX)
            sent = []
            starts = range(0, N_CTX - n, max(n, N_CTX // 8))  # up to 8 windows over the prompt
            for start in starts:
                llm.reset()
                if start:
                    llm.eval(tokens[:start])
                before = rpc.bytes_acked(server.port)
                llm.eval(tokens[start:start + n])
                llm.sample(temp=0.0)  # reads the logits back: the pass is done, its bytes acknowledged
                sent.append(rpc.bytes_acked(server.port) - before)
        finally:
            llm.close()
        # the pass model's shares (`schedmodel.expert_shares`) on llama.cpp's graph of this pass: a
        # prompt's last layer runs its experts on the output token only; a streamed expert bias
        # (ADD_ID) is copied whole
        graph = inv.graphs[n]
        streamed = {nd.weight for nd in graph.nodes if nd.weight in exps}
        recorded = sum(expert_shares(graph, routing).get(w, 1.0) * exps[w] for w in streamed)
        uniform = sum(expert_shares(graph, None).get(w, 1.0) * exps[w] for w in streamed)
        med = statistics.median(sent)
        rows.append({"n_tokens": n, "windows": len(sent), "sent_bytes": sent, "sent_median": med,
                     "predicted_recorded": recorded, "predicted_uniform": uniform, "whole": whole,
                     "err_recorded": (recorded - med) / med, "err_uniform": (uniform - med) / med})
        print(f"{os.path.basename(path)} n={n}: sent {med / 1e6:.2f} MB, recorded routing {recorded / 1e6:.2f} "
              f"({rows[-1]['err_recorded']:+.1%}), uniform {uniform / 1e6:.2f} ({rows[-1]['err_uniform']:+.1%})",
              file=sys.stderr)
    return {"model": os.path.basename(path), "n_expert": n_expert, "n_used": routing.n_used,
            "routing": routing.to_json(), "passes": rows}


def markdown(results: list[dict], meta: dict) -> str:
    out = [f"# Streamed expert tensors: bytes copied vs predicted (commit {meta['commit']})", "",
           f"Machine: {meta['machine']}; load average before / after: {meta['load_before']} / {meta['load_after']}. "
           "A loopback rpc-server (1 thread); every expert tensor on the host, streamed at any batch; "
           "median over the prompt's windows of n tokens. Bytes are the TCP bytes the server acknowledged: "
           "the experts copied plus each pass's activations and graph (a few hundred KB).", "",
           "| model | n tokens | windows | sent MB | recorded routing MB (err) | uniform routing MB (err) | whole MB |",
           "|---|---|---|---|---|---|---|"]
    for r in results:
        for p in r["passes"]:
            out.append(f"| {r['model']} | {p['n_tokens']} | {p['windows']} | {p['sent_median'] / 1e6:.2f} | "
                       f"{p['predicted_recorded'] / 1e6:.2f} ({p['err_recorded']:+.1%}) | "
                       f"{p['predicted_uniform'] / 1e6:.2f} ({p['err_uniform']:+.1%}) | {p['whole'] / 1e6:.2f} |")
    out += ["", "Distinct experts per pass of n tokens (mean over layers; recorded in one 512-token pass):", "",
            "| model | n | recorded | uniform |", "|---|---|---|---|"]
    for r in results:
        curves = [c for c in r["routing"]["distinct"].values()]
        for n in curves[0]:
            rec = statistics.fmean(c[n] for c in curves)
            uni = r["n_expert"] * expert_fraction(r["n_expert"], r["n_used"], int(n))
            out.append(f"| {r['model']} | {n} | {rec:.1f} | {uni:.1f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    with rpc.start_server(threads=1) as server:
        results = [check(m, server) for m in a.models]
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), os.uname().machine)
    meta = {"commit": git_commit(short=True), "machine": f"{cpu}, {os.cpu_count()} cores",
            "load_before": f"{load_before:.2f}", "load_after": f"{os.getloadavg()[0]:.2f}"}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "routing-check.json").write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    (a.out / "routing-check.md").write_text(markdown(results, meta))
    print(markdown(results, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
