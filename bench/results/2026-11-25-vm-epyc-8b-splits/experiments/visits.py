"""Does the rpc-server run the same nodes slower in short visits than in one long one?

One plan (STRATEGY at BUDGET, made with PROFILE as splits.py makes it) on CPU + a loopback rpc-server
(1 thread on CPU 1, this process on CPU 0). Its decode pass timed with the scheduler stopping (a) only at
its changes of device, then (b) also every CHUNK nodes inside the server's runs, so that the server computes
the same nodes in visits of CHUNK nodes with nothing in between; alternated REPS times. Per variant: the
server's summed split times and their count, against what the pass model costs those nodes.

usage: python visits.py MODEL PROFILE STRATEGY BUDGET CHUNK[,CHUNK...] REPS > out.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from oallama import _core
from oallama.planner import plan as planmod
from oallama.planner.profile import Profile
from oallama.planner.realpass import timed_eval
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

PROMPT = 32


def main() -> None:
    model, profile, strategy, budget = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    chunks, reps = [int(c) for c in sys.argv[5].split(",")], int(sys.argv[6])
    with rpc.start_server(threads=1, cpus=[1]) as srv, rpc.beside([1]):
        prof = Profile.load(profile).renamed([n if n == "CPU" else srv.device_name for n in Profile.load(profile).devices])
        ctx = planmod.build_context(model, srv.device_name, planmod.Workload(PROMPT, 8, "e2e", 64), profile=prof,
                                    threads=1, progress=False)
        plan = planmod.make_plan(ctx, strategy, budget)
        pm = ctx.passes[1]
        cost = pm.cost(plan.placement)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "plan.json"
            path.write_text(json.dumps(plan.to_json()))
            llm = Llama(model, devices=[srv.device_name], placement=str(path), n_ctx=ctx.workload.n_ctx, n_batch=64,
                        n_ubatch=64, n_threads=1, n_threads_batch=1, flash_attn=False, verbose=False)
        try:
            tokens = prompt_tokens(llm, ctx.workload.n_ctx)
            prefix, batch = tokens[:PROMPT], tokens[PROMPT:PROMPT + 1]
            with _core.NodeTimer(llm.native_context) as timer:
                nodes = timed_eval(llm, timer, prefix, batch, []).nodes
                dev_stops = [r.index for k, r in enumerate(nodes)
                             if k == len(nodes) - 1 or nodes[k + 1].device != r.device]
                server = {r.index for r in nodes if r.device == srv.device_name}
                variants = {"device changes": dev_stops}
                for c in chunks:
                    extra, run = [], 0
                    for r in nodes:
                        run = run + 1 if r.index in server else 0
                        if run and run % c == 0:
                            extra.append(r.index)
                    variants[f"every {c} server nodes"] = sorted(set(dev_stops) | set(extra))
                got: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
                for _ in range(reps):
                    for name, stops in variants.items():
                        res = timed_eval(llm, timer, prefix, batch, stops)
                        by = {r.index: r for r in res.nodes}
                        srv_us = sum(by[s].range_us for s in stops if s in by and by[s].device == srv.device_name)
                        got[name].append({"wall_us": res.wall_us, "server_us": srv_us})
        finally:
            llm.close()
    t_node = {i: (pm.t_acc[i] if cost.on_acc[i] else pm.host_us(i, plan.placement)) for i in pm.t_host}
    out = {"model": model, "strategy": strategy, "budget": budget, "load_avg": os.getloadavg()[0],
           "server_nodes": len(server), "server_predicted_ms": sum(t_node.get(i, 0.0) for i in server) / 1e3,
           "variants": {}}
    for name, stops in variants.items():
        rows = got[name]
        out["variants"][name] = {
            "server_visits": sum(1 for s in stops if s in server),
            "server_ms": statistics.median(r["server_us"] for r in rows) / 1e3,
            "wall_ms": statistics.median(r["wall_us"] for r in rows) / 1e3,
            "server_samples_ms": [r["server_us"] / 1e3 for r in rows]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
