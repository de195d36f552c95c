#!/usr/bin/env python3
"""The test_prediction case (tests/test_prediction.py::test_rpc_plan_runs_as_predicted): the mid synthetic
model (n_embd 1024, 4 blocks, q8_0) on the CPU + a loopback rpc-server (1 thread each), workload prompt 32,
gen 16. N fresh calibrations, each placement's predicted TPOT by the fit of calibration method 32 (every
pass anchored with the kinds' prompt lines, `calfit.SYNC_SHARE` = inf) and method 33 (as this checkout
fits it), the same measurements re-fitted; then the placements run in alternated rounds (bench/scripts/bench_prediction.py
real_runs, then tests/helpers.py) and their measured TPOT. Also, per calibration: the decode split on the rpc-server as timed.

    python variance.py N REPS > variance.txt
"""
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "scripts"))
from bench_prediction import real_runs  # noqa: E402
from oallama.model import synthetic  # noqa: E402
from oallama.planner.cost import calfit  # noqa: E402
from oallama.planner.plan import Workload, build_context, make_plan  # noqa: E402
from oallama.runtime import rpc  # noqa: E402

WL = Workload(prompt=32, gen=16, n_ubatch=32)


def main() -> int:
    n, reps = int(sys.argv[1]), int(sys.argv[2])
    tmp = Path(tempfile.mkdtemp(prefix="variance-"))
    path = tmp / "mid-q8_0-n_layer4.gguf"
    synthetic.write_model(path, preset="mid", qtype="q8_0", progress=False, n_layer=4)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"# commit {commit.strip()} (+ the change), load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with rpc.start_server(threads=1) as server:
        for i in range(n):
            os.environ["OALLAMA_CACHE"] = str(tmp / f"cache-{i}")
            ctx = build_context(path, server.device_name, WL, threads=1, progress=False)
            prof = ctx.profile
            plans = {"layers @100%": make_plan(ctx, "layers", "100%"), "layers @50%": make_plan(ctx, "layers", "50%"),
                     "host only": make_plan(ctx, "layers", 1)}
            share, calfit.SYNC_SHARE = calfit.SYNC_SHARE, math.inf
            try:
                old = build_context(path, server.device_name, WL, threads=1, progress=False,
                                    profile=dataclasses.replace(prof, calibration=calfit.refitted(prof.calibration, prof)))
            finally:
                calfit.SYNC_SHARE = share
            acc = ctx.acc
            row = {"calibration": i,
                   "method32": {k: round(old.predict(p.placement)["tpot_ms"], 3) for k, p in plans.items()},
                   "method33": {k: round(p.predicted["tpot_ms"], 3) for k, p in plans.items()},
                   "rpc_decode_split_us": {str(s["n_past"]): round(s["split_us"]) for s in prof.calibration.splits
                                           if s["device"] == acc and s["n_tokens"] == 1},
                   "sync_bound": {d: sorted(calfit.sync_bound([s for s in prof.calibration.splits if s["device"] == d]))
                                  for d in ("CPU", acc)}}
            rows.append(row)
            print(json.dumps(row), flush=True)
        runs = real_runs(path, plans, reps=reps, n_threads=1, n_threads_batch=1)
    print(json.dumps({"measured_tpot_ms": {r.label: round(r.measured["tpot_ms"], 3) for r in runs},
                      "samples": {r.label: [round(x, 3) for x in r.samples["tpot_ms"]] for r in runs},
                      "load": round(os.getloadavg()[0], 2)}))
    for m in ("method32", "method33"):
        for k in plans:
            v = [r[m][k] for r in rows]
            print(f"# {m} {k}: predicted TPOT {min(v):.2f}-{max(v):.2f} ms, median {statistics.median(v):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
