"""Host-only decode of one model under three host layouts, measured and predicted.

  default  every weight as a default load lays it out (CPU_REPACK where ggml repacks it)
  plan     the layouts a committed plan chose (PLAN: its .plan.json)
  plain    every weight the plan lays out, in plain CPU memory

Each load: a 32-token prompt, then decode passes (the first dropped), their mean wall time; loads
alternate across rounds. Predicted: the committed profile (PROFILE) refitted by this checkout
(bench/scripts/repredict.py's way), the same placements costed by the pass model at 1 token.

usage: python layouts_ab.py MODEL PLAN PROFILE ROUNDS
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from oallama.planner import plan as planmod
from oallama.planner.cost.calfit import fit
from oallama.planner.cost.profile import Profile
from oallama.planner.cost.realpass import decode_walls
from oallama.planner.cost.schedmodel import Placement
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama


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
        bt: dict[str, int] = {}
        for t in llm.tensor_placements():
            bt[t.buffer_type] = bt.get(t.buffer_type, 0) + t.nbytes
        walls = decode_walls(llm, prompt_tokens(llm, 256), 32, 4)
    finally:
        llm.close()
    return {
        "tpot_ms": statistics.fmean(walls) / 1e3,
        "samples_ms": [w / 1e3 for w in walls],
        "buffer_types": bt,
    }


def predict(model: str, profile: Path, variants: dict[str, dict[str, str]]) -> dict[str, dict[str, float]]:
    prof = Profile.from_json(json.loads(profile.read_text()), profile)
    old = prof.calibration
    new = fit(old.points, [], prof, old.splits)
    new.pass_a_us, new.pass_b_us = old.pass_a_us, old.pass_b_us
    new.stream, new.scatter, new.detached, new.decode_us = (
        old.stream,
        old.scatter,
        old.detached,
        old.decode_us,
    )
    prof.calibration = new
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
        out = {}
        for name, lay in variants.items():
            c = ctx.passes[1].cost(Placement(frozenset(), 0, {}, lay))
            out[name] = {"tpot_ms": c.total_us / 1e3, "compute_ms": c.compute_us / 1e3}
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
