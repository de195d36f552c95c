"""Host-only decode of one model under three host layouts: walls and each weight matmul's time in the
real graph (node by node), against what the pass model costs for the same placements.

  default  every weight as a default load lays it out (CPU_REPACK where ggml repacks it)
  plan     the layouts a committed plan chose (PLAN: its .plan.json)
  plain    every weight the plan lays out, in plain CPU memory

Each load: a 32-token prompt, decode passes (the first dropped; their mean wall), then NODE_REPS decode
passes timed node by node (each node's median). Loads alternate across rounds. Predicted: PROFILE as
committed, costed by this checkout's pass model at 1 token (per weight matmul: its host term in that layout).

usage: python layout_nodes.py MODEL PLAN PROFILE ROUNDS > out.jsonl
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from oallama import _core
from oallama.planner import plan as planmod
from oallama.planner.context import plain_ratios
from oallama.planner.cost.profile import Profile
from oallama.planner.cost.realpass import MATMUL_OPS, decode_walls, timed_eval
from oallama.planner.cost.schedmodel import Placement
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

NODE_REPS = 3


def role(name: str) -> str:
    """A matmul node's output name without its layer ("Qcur-5" -> "Qcur")."""
    return re.sub(r"-\d+$", "", name)


def measure(model: str, layouts: dict[str, str]) -> dict[str, object]:
    llm = Llama(
        model,
        devices=["CPU"],
        layouts=layouts or None,
        n_ctx=256,
        n_batch=64,
        n_ubatch=64,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
    )
    try:
        bt: dict[str, int] = defaultdict(int)
        for t in llm.tensor_placements():
            bt[t.buffer_type] += t.nbytes
        tokens = prompt_tokens(llm, 256)
        walls = decode_walls(llm, tokens, 32, 4)
        per: dict[int, list[float]] = defaultdict(list)
        names: dict[int, str] = {}
        with _core.NodeTimer(llm.native_context) as timer:
            timed_eval(llm, timer, tokens[:32], tokens[32:33], [])  # warm-up
            node_walls = []
            for _ in range(NODE_REPS):
                run = timed_eval(llm, timer, tokens[:32], tokens[32:33], [])
                node_walls.append(run.wall_us)
                for r in run.nodes:
                    if r.op in MATMUL_OPS and r.weight_type:
                        per[r.index].append(r.range_us)
                        names[r.index] = r.name
    finally:
        llm.close()
    roles: dict[str, float] = defaultdict(float)
    for i, v in per.items():
        roles[role(names[i])] += statistics.median(v)
    return {
        "tpot_ms": statistics.fmean(walls) / 1e3,
        "samples_ms": [w / 1e3 for w in walls],
        "buffer_types": dict(bt),
        "node_pass_ms": statistics.median(node_walls) / 1e3,
        "matmul_ms_by_role": {k: v / 1e3 for k, v in sorted(roles.items())},
    }


def predict(model: str, profile: Path, variants: dict[str, dict[str, str]]) -> dict[str, object]:
    prof = Profile.from_json(json.loads(profile.read_text()), profile)
    with rpc.start_server(threads=1) as srv:
        prof = prof.renamed([n if n == "CPU" else srv.device_name for n in prof.devices])
        ctx = planmod.build_context(
            model,
            srv.device_name,
            planmod.Workload(32, 8, "e2e", 64),
            profile=prof,
            threads=1,
            progress=False,
        )
        pm = ctx.passes[1]
        # method <= 23: one factor over the plain one-op times; method 24: each shape's plain / repacked ratio
        out: dict[str, object] = {"plain_ratios": plain_ratios(pm)}
        for name, lay in variants.items():
            c = pm.cost(Placement(frozenset(), 0, {}, lay))
            roles: dict[str, float] = defaultdict(float)
            for i in pm.targets:
                node = pm.graph.nodes[i]
                w = node.weight
                layout = lay.get(w, pm.default_layout.get(i)) if w else None
                t = pm.t_layout[i].get(layout, pm.t_host[i]) if i in pm.t_layout and layout else pm.t_host[i]
                roles[role(node.name)] += t
            out[name] = {
                "tpot_ms": c.total_us / 1e3,
                "compute_ms": c.compute_us / 1e3,
                "matmul_ms_by_role": {k: v / 1e3 for k, v in sorted(roles.items())},
            }
        return out


if __name__ == "__main__":
    model, plan_path, profile, rounds = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    chosen = dict(json.loads(Path(plan_path).read_text())["layouts"])
    variants = {"default": {}, "plan": chosen, "plain": {w: "CPU" for w in chosen}}
    pred = predict(model, profile, variants)
    print(
        json.dumps(
            {
                "predicted": pred,
                "plan_layouts": {v: sum(1 for x in chosen.values() if x == v) for v in set(chosen.values())},
            }
        ),
        flush=True,
    )
    rows = []
    for r in range(rounds):
        for name, lay in variants.items():
            rec = {"round": r, "variant": name, "load_avg": os.getloadavg()[0], **measure(model, lay)}
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    for name in variants:
        m = statistics.median(x["tpot_ms"] for x in rows if x["variant"] == name)
        p = pred[name]["tpot_ms"]
        print(f"# {name:8} measured {m:8.2f} ms  predicted {p:8.2f} ms  error {100 * (p - m) / m:+6.1f}%")
    for name in variants:
        got = [x["matmul_ms_by_role"] for x in rows if x["variant"] == name]
        for k in got[0]:
            m = statistics.median(g[k] for g in got)
            p = pred[name]["matmul_ms_by_role"].get(k, float("nan"))
            print(f"# {name:8} {k:16} real graph {m:8.2f} ms  model {p:8.2f} ms  model/real {p / m:5.2f}")
