"""A committed bench cell re-planned from its own profile's measurements with this checkout's
calibration fit (bench/scripts/repredict.py's refit): layers, fit, affinity, then optimal from them, as the
bench plans a cell; each plan saved and its prediction printed beside the bench's.

    python replan.py RESULTS_DIR CONFIG_ID OUT_PREFIX    (CONFIG_ID: any configuration of the cell)
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, "bench/scripts")
import repredict
from oallama.planner import plan as planmod
from oallama.runtime import rpc

d, cid, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = json.loads((d / "raw" / f"{cid}.spec.json").read_text())
budget = spec["config"]["budget"]
with rpc.start_server(threads=1) as srv:
    ctx = repredict._context(spec, d, srv.device_name)
    made = []
    for s in ("layers", "fit", "affinity", "optimal"):
        p = planmod.make_plan(ctx, s, budget, candidates=made if s == "optimal" else ())
        made.append(p)
        p.save(f"{out}_{s}.plan.json")
        pr = p.predicted
        print(
            f"{s} @{budget}: predicted TTFT {pr['ttft_ms']:.1f} TPOT {pr['tpot_ms']:.2f} e2e {pr['e2e_ms']:.1f} ms; "
            f"on acc {len(p.placement.on_acc)} weights, kv {p.placement.kv_layers}; {p.extra.get('winner', '')}"
        )
