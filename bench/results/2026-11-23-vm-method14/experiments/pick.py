"""Same calibration rounds, each pass from its fastest or its median round: predictions of the
method-14 grid's plans against its median-round measurements."""

import collections
import glob
import json
import statistics as S
import sys
from pathlib import Path

from oallama.planner import plan as planmod
from oallama.planner.cost import calibrate as C
from oallama.planner.cost.profile import Profile
from oallama.runtime import rpc

sys.path.insert(0, "bench/scripts")
from repredict import _placement

D = Path(
    "bench/results/2026-11-23-vm-method14"
)  # run from the repository root, with this directory's raw/ (not in git)
specs = collections.defaultdict(list)
for f in glob.glob(str(D / "raw/*.spec.json")):
    s = json.loads(Path(f).read_text())
    if s.get("round", 1) == 1:
        specs[(s["config"]["model"], s["profile_key"])].append(s)
meas = {
    r["config_id"]: r for r in json.loads(Path(D / "results.json").read_text()) if r["metric"] == "e2e_ms"
}
meas_t = {
    (r["config_id"], r["metric"]): r["median"] for r in json.loads(Path(D / "results.json").read_text())
}
want = sys.argv[1:]
srv = rpc.start_server(threads=1)
out = collections.defaultdict(list)
for (model, pkey), ss in specs.items():
    if not any(w in model for w in want):
        continue
    prof = Profile.load(D / "profiles" / f"{pkey}.json")
    old_dev = next(d for d in prof.devices if d != "CPU")
    prof = prof.renamed(["CPU", srv.device_name])
    c0 = ss[0]["config"]
    rounds = [
        C._measure_round(
            model,
            ["CPU", srv.device_name],
            threads=1,
            n_prefill=32,
            n_ctx=c0["n_ctx"] if c0["n_ctx"] >= 512 else 512,
            op_offload=c0["op_offload"],
            mmap=True,
            reps=3,
            max_fill_s=10.0,
            progress=False,
            routing=k == 0,
        )
        for k in range(5)
    ]
    for pick in ("fastest", "median"):
        m = C.merge_rounds(rounds, pick)
        cal = C.fit(m.points, [(n, us) for (n, _), us in m.outside.items()], prof, m.splits, m.routing)
        cal.detached, cal.stream, cal.scatter = m.detached, m.stream, m.scatter
        prof.calibration = cal
        for s in ss:
            c = s["config"]
            wl = planmod.Workload(c["prompt"], c["gen"], "e2e", c["settings"]["n_ubatch"])
            ctx = planmod.build_context(
                model,
                srv.device_name,
                wl,
                profile=prof,
                threads=1,
                op_offload=c["op_offload"],
                progress=False,
            )
            plan = json.loads((D / "raw" / f"{s['id']}.plan.json").read_text())
            plan["placement"] = {
                w: (srv.device_name if d == old_dev else d) for w, d in plan["placement"].items()
            }
            plan["accelerator"] = srv.device_name
            pr = ctx.predict(_placement(plan))
            for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
                mv = meas_t.get((s["id"], metric))
                if mv:
                    out[(Path(model).stem[:10], pick, metric)].append(pr[metric] / mv - 1)
for k in sorted(out):
    v = out[k]
    print(
        k,
        len(v),
        f"median |err| {100 * S.median(map(abs, v)):.1f}% p90 {100 * sorted(map(abs, v))[int(0.9 * (len(v) - 1))]:.1f}% bias {100 * S.median(v):+.1f}%",
    )
srv.stop()
