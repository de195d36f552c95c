#!/usr/bin/env python3
"""Each non-weight op kind's predicted time in a CPU cell's prompt and decode pass (every weight on the
host), from the model's own calibration and from the device model: which op kinds the two "other" terms
of terms.md differ by. Reads the cached profile and device model (OALLAMA_CACHE of the runs); runs no model.

    OALLAMA_CACHE=... python other_ops.py MODEL.gguf
"""

import sys
from collections import defaultdict

from oallama.planner import plan as planmod
from oallama.planner.cost.calfit import kind

path = sys.argv[1]
wl = planmod.Workload(512, 64, "e2e", 512, 4096)
for cal in ("model", "device"):
    ctx = planmod.build_context(path, None, wl, threads=2, progress=False, calibration=cal)
    for u, pm in ctx.passes.items():
        by: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for i, us in pm.t_host.items():
            if i in pm.targets:  # a weight matmul: the "compute" term
                continue
            n = pm.graph.nodes[i]
            k = kind(n.op, n.ne)
            by[k] += us
            count[k] += 1
        total = sum(by.values())
        print(f"{cal} calibration, pass {u}: other ops {total / 1e3:.1f} ms")
        for k, us in sorted(by.items(), key=lambda kv: -kv[1]):
            print(f"  {k:18s} {count[k]:5d} nodes {us / 1e3:9.1f} ms")
