#!/usr/bin/env python3
"""A model's calibration on one accelerator, seen through its scattered pass (calibration method
9): the decode pass with the weights alternating between host and accelerator, as measured and as
the cost model prices it without a per-split term, and the per-split cost the plan derives
(`planner.context.split_cost`; none when the model is within 5%). Profiles afresh (not cached).

    python bench/scripts/split_check.py MODEL.gguf rpc          # a loopback rpc-server (1 thread)
    GGML_VK_VISIBLE_DEVICES=0 python bench/scripts/split_check.py MODEL.gguf Vulkan0
"""

from __future__ import annotations

import argparse
import os

from oallama.planner.cost.measure import profile_model
from oallama.planner.cost.schedmodel import HOST, Placement
from oallama.planner.plan import Workload, build_context
from oallama.planner.workload import Ubatch
from oallama.runtime import rpc


def check(path: str, dev: str) -> None:
    prof = profile_model(path, [HOST, dev], threads=1, n_ctx=256, cache=False, progress=False, repeats=3,
                         server_threads=1)
    ctx = build_context(path, dev, Workload(prompt=32, gen=8, n_ubatch=32), profile=prof, threads=1, progress=False)
    pm = ctx.passes[Ubatch(1)]
    sc = prof.calibration.scatter[dev]
    pm.set_split_cost(0.0)
    c = pm.cost(Placement(frozenset(sc["on_acc"]) & pm.weights, sc["kv_layers"]))
    print(f"{dev}: scattered decode pass measured {sc['wall_us'] / 1e3:.1f} ms (samples "
          f"{', '.join(f'{x / 1e3:.1f}' for x in sc['samples_us'])}), modelled {c.total_us / 1e3:.1f} ms "
          f"(compute {c.compute_us / 1e3:.1f}, other ops {c.other_us / 1e3:.1f}, copies {c.copy_us / 1e3:.1f}, "
          f"{c.n_splits} splits at {pm.issue[0]:.0f} / {pm.issue[1]:.0f} us hand-over); per-split cost: "
          + (f"{ctx.split_us:.0f} us" if ctx.split_us is not None else "none (within 5%)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("device", help="'rpc' (a loopback rpc-server) or a device name such as Vulkan0")
    a = ap.parse_args()
    print(f"# {os.path.basename(a.model)}")
    if a.device == "rpc":
        with rpc.start_server(threads=1) as s:
            check(a.model, s.device_name)
    else:
        check(a.model, a.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
