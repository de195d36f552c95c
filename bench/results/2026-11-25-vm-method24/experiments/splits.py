"""One strategy's decode pass on CPU + a loopback rpc-server, split by split: each split's measured time
(the scheduler's eval callback, stops at the changes of device) against what the pass model costs its
nodes, so a TPOT miss can be put on a device's compute or on the hand-overs between them.

The server (1 thread) on CPU 1, this process on CPU 0, as `oallama bench --rpc-cpus 1` runs; the plan
made here with PROFILE (a committed profile, renamed to this run's server).

usage: python splits.py MODEL PROFILE STRATEGY BUDGET PROMPT GEN REPS > out.json
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
from oallama.planner.realpass import decode_walls, timed_eval
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama


def main() -> None:
    model, profile, strategy, budget = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    prompt, gen, reps = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    with rpc.start_server(threads=1, cpus=[1]) as srv, rpc.beside([1]):
        prof = Profile.load(profile)
        prof = prof.renamed([n if n == "CPU" else srv.device_name for n in prof.devices])
        ctx = planmod.build_context(model, srv.device_name, planmod.Workload(prompt, gen, "e2e", 64), profile=prof,
                                    threads=1, progress=False)
        plan = planmod.make_plan(ctx, strategy, budget)
        pm = ctx.passes[1]
        cost = pm.cost(plan.placement)
        t_node = {i: (pm.t_acc[i] if cost.on_acc[i] else pm.host_us(i, plan.placement)) for i in pm.t_host}
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "plan.json"
            path.write_text(json.dumps(plan.to_json()))
            llm = Llama(model, devices=[srv.device_name], placement=str(path), n_ctx=ctx.workload.n_ctx, n_batch=64,
                        n_ubatch=64, n_threads=1, n_threads_batch=1, flash_attn=False, verbose=False)
        try:
            tokens = prompt_tokens(llm, ctx.workload.n_ctx)
            walls = decode_walls(llm, tokens, prompt, reps)
            prefix, batch = tokens[:prompt], tokens[prompt:prompt + 1]
            with _core.NodeTimer(llm.native_context) as timer:
                nodes = timed_eval(llm, timer, prefix, batch, []).nodes
                stops = [r.index for k, r in enumerate(nodes) if k == len(nodes) - 1 or nodes[k + 1].device != r.device]
                runs = [timed_eval(llm, timer, prefix, batch, stops) for _ in range(reps)]
        finally:
            llm.close()
    splits = []
    start = 0
    for k, stop in enumerate(stops):
        members = [r for r in nodes if start <= r.index <= stop]
        pred = sum(t_node.get(r.index, 0.0) for r in members)
        model_dev = {bool(cost.on_acc.get(r.index, False)) for r in members if r.index in cost.on_acc}
        times = [next(x.range_us for x in run.nodes if x.index == stop) for run in runs]
        splits.append({"split": k, "device": members[0].device if members else "", "nodes": len(members),
                       "model_on_acc": sorted(model_dev), "predicted_us": pred,
                       "measured_us": statistics.median(times), "samples_us": times})
        start = stop + 1
    out = {"model": model, "strategy": strategy, "budget": budget, "load_avg": os.getloadavg()[0],
           "tpot_measured_ms": statistics.fmean(walls) / 1e3, "tpot_predicted_ms": cost.total_us / 1e3,
           "predicted": {"compute_ms": cost.compute_us / 1e3, "other_ms": cost.other_us / 1e3,
                         "acc_ms": cost.acc_us / 1e3, "copy_ms": cost.copy_us / 1e3, "launch_ms": cost.launch_us / 1e3,
                         "overhead_ms": cost.overhead_us / 1e3, "splits": cost.n_splits},
           "graph_ms": statistics.median(r.wall_us for r in runs) / 1e3, "splits": splits}
    for dev in sorted({s["device"] for s in splits}):
        out[f"{dev} measured_ms"] = sum(s["measured_us"] for s in splits if s["device"] == dev) / 1e3
        out[f"{dev} predicted_ms"] = sum(s["predicted_us"] for s in splits if s["device"] == dev) / 1e3
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
