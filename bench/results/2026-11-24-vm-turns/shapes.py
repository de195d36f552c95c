"""Per weight-matmul shape: its time in the real graph (the calibration's node-by-node times, less the
node overhead method 18 fits) over its one-op profile time, per device and pass size, from a committed
calibrated profile; and the shares method 18 keeps (1.00: pooled or no share). No model runs.

    python shapes.py PROFILE_JSON
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from oallama.planner.cost.calfit import MATMUL_OPS, VIEW_OPS, _profile_us, fit
from oallama.planner.cost.mmshares import class_key, share
from oallama.planner.cost.profile import Profile


def main() -> int:
    pf = Path(sys.argv[1])
    prof = Profile.from_json(json.loads(pf.read_text()), pf)
    old = prof.calibration
    assert old is not None
    cal = fit(old.points, [], prof, old.splits, old.routing)
    print(
        f"profile {pf.name}: per device and pass size, shape: nodes, median node time alone - overhead (us), "
        "median one-op time (us), their ratio, the fitted share (method 18)"
    )
    for dev, dc in cal.devices.items():
        pts = [p for p in cal.points if p["device"] == dev]
        views = [p["us"] for p in pts if p["op"] in VIEW_OPS]
        ops = sorted(p["us"] for p in pts if p["op"] not in VIEW_OPS)
        print(
            f"\n{dev}: node overhead {dc.node_overhead_us:.0f} us (method 17's rule, the 10th percentile of all "
            f"ops alone: {ops[len(ops) // 10]:.0f} us); a view alone p10 / p50 / p90 "
            + " / ".join(f"{v:.0f}" for v in np.percentile(views, [10, 50, 90]))
            + " us; matmul scale "
            f"{dc.matmul_scale:.3f}, anchors "
            + ", ".join(f"{n} tok x{a:.3f}" for n, a in sorted(dc.anchors.items()))
            + f"; decode matmuls x{dc.scale_for(1):.3f} their one-op time before shares"
        )
        by: dict[tuple[int, str, str], list[tuple[float, float]]] = defaultdict(list)
        for p in cal.points:
            if p["device"] != dev or not p["weight_type"] or p["op"] not in MATMUL_OPS:
                continue
            kind = re.sub(r"-\d+$", "", p.get("name", ""))
            key = class_key(p["op"], p["weight_type"], p["src0_ne"])
            by[(int(p["n_tokens"]), key, kind)].append(
                (p["us"] - dc.node_overhead_us, _profile_us(prof, dev, p))
            )
        for (n, key, kind), v in sorted(by.items()):
            real, one = statistics.median(a for a, _ in v), statistics.median(b for _, b in v)
            print(
                f"  {n:>3} tok {key:28s} {kind:14s} {len(v):>3} {real:9.0f} {one:9.0f} "
                f"{real / one if one else float('nan'):6.2f} {share(dc.mm_shares, key, n):6.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
