"""ab.json cells re-predicted with this checkout's model: predicted e2e ratio to optimal vs the measured paired ratio."""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "bench/scripts")
import bench_ab
import repredict
from oallama.runtime import rpc

errs, rows = [], []
with rpc.start_server(threads=1) as srv:
    for d in map(Path, sys.argv[1:]):
        ab = json.loads((d / "ab" / "ab.json").read_text())
        for cell in ab["cells"]:
            preds = {}
            for p in cell["placements"]:
                spec = json.loads((d / "raw" / f"{p['config_id']}.spec.json").read_text())
                ctx = repredict._context(spec, d, srv.device_name)
                preds[p["label"]] = ctx.predict(
                    repredict._placement(json.loads(Path(spec["plan_file"]).read_text()))
                )["e2e_ms"]
            summ = {r["label"]: r for r in bench_ab._summary(cell)}
            opt = next(lbl for lbl in preds if "optimal" in lbl.split(" = "))
            best_pred = min(preds, key=preds.get)
            for lbl, r in summ.items():
                if lbl == opt:
                    continue
                pr = preds[lbl] / preds[opt]
                errs.append(abs(pr / r["vs_optimal"] - 1))
                rows.append(
                    f"{cell['model']} @{cell['budget']} {lbl}: measured {r['vs_optimal']:.3f} recorded pred {r['predicted_vs_optimal']:.3f} now {pr:.3f}"
                )
            rows.append(
                f"  -> predicted best now: {best_pred}; measured best: {min(summ, key=lambda lbl: summ[lbl].get('vs_optimal', 9))}"
            )
print("\n".join(rows))
print(
    f"|pred/meas ratio - 1| over {len(errs)}: median {100 * statistics.median(errs):.1f}% max {100 * max(errs):.1f}%"
)
