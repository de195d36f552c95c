"""The rpc-server's nodes of one plan's decode pass, one visit each: every server node's time against what
the pass model costs it, summed by role (the node's name without its layer), so that a miss on the server
can be put on a kind of op.

The scheduler stops after every server node (each its own visit: the time includes a hand-over, estimated
as the median time of the server's cheapest nodes, the element-wise ones, and reported beside). Plan, server
and pinning as splits.py (1 thread on CPU 1, this process on CPU 0).

usage: python server_nodes.py MODEL PROFILE STRATEGY BUDGET REPS > out.json
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from oallama import _core
from oallama.planner import plan as planmod
from oallama.planner.profile import Profile
from oallama.planner.realpass import timed_eval
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

PROMPT = 32


def role(name: str, op: str) -> str:
    return op + " " + re.sub(r"-\d+$", "", name)


def main() -> None:
    model, profile, strategy, budget, reps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    with rpc.start_server(threads=1, cpus=[1]) as srv, rpc.beside([1]):
        base = Profile.load(profile)
        prof = base.renamed([n if n == "CPU" else srv.device_name for n in base.devices])
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
                stops = [r.index for k, r in enumerate(nodes)
                         if r.device == srv.device_name or k == len(nodes) - 1 or nodes[k + 1].device != r.device]
                per: dict[int, list[float]] = defaultdict(list)
                for _ in range(reps):
                    for r in timed_eval(llm, timer, prefix, batch, stops).nodes:
                        if r.device == srv.device_name and r.index in stops:
                            per[r.index].append(r.range_us)
        finally:
            llm.close()
    info = {r.index: r for r in nodes}
    med = {i: statistics.median(v) for i, v in per.items()}
    cheap = [med[i] for i in med if info[i].op in ("ADD", "MUL", "GLU", "CPY", "VIEW", "RESHAPE", "PERMUTE")]
    hand_us = statistics.median(cheap) if cheap else 0.0
    roles: dict[str, dict[str, float]] = defaultdict(lambda: {"nodes": 0, "measured_us": 0.0, "predicted_us": 0.0})
    for i, t in med.items():
        r = roles[role(info[i].name, info[i].op)]
        r["nodes"] += 1
        r["measured_us"] += t - hand_us
        r["predicted_us"] += pm.t_acc.get(i, 0.0) if cost.on_acc.get(i, False) else 0.0
    out = {"model": model, "strategy": strategy, "budget": budget, "load_avg": os.getloadavg()[0],
           "hand_over_us": hand_us, "server_nodes": len(med),
           "roles": {k: {**v, "measured_over_predicted": v["measured_us"] / v["predicted_us"] if v["predicted_us"] else None}
                     for k, v in sorted(roles.items(), key=lambda kv: -kv[1]["measured_us"])}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
