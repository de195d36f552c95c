#!/usr/bin/env python3
"""How much of the CPU's `matmul_scale` spread between characterisations is the one-op profile's moment:
N times in turn, each in a fresh process and profile cache, the device model's reference is profiled and
calibrated on the CPU alone (as a characterisation does), then its weight matmuls are timed one op at a
time again, at once (`after`) and again after the same ops' real-graph times' fit (`after2`). Per run:
the ratio of sums real-graph / one-op (the weight matmul nodes the calibration timed, each at its
median round, less the node overhead) with the profile's one-op times, as `calfit.fit` takes it, and with
the re-timed ones. A one-op timing paired with the real graph would move with it; the spread of each
ratio over the runs says how much of `matmul_scale`'s is the window between the two.

    python pairing.py -n 4 -o DIR      # then --report
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
from oallama.planner.cost.devicemodel import reference_model
from oallama.planner.cost.measure import profile_model, time_op
from oallama.planner.cost.calfit import _Op, MATMUL_OPS, VIEW_OPS
from oallama.planner.cost.profile import Profile
ref = reference_model(progress=False)
t0 = time.perf_counter()
prof = profile_model(ref, ["CPU"], threads=2, progress=False)
t1 = time.perf_counter()
cal = prof.calibration
dc = cal.devices["CPU"]
h = dc.node_overhead_us
pts = [p for p in cal.points if p["device"] == "CPU" and p["weight_type"] and p["op"] in MATMUL_OPS]
want = {}
for p in pts:
    op = _Op(p)
    want.setdefault((op.op, op.weight_type, tuple(op.weight_shape)), set()).add(int(op.n_tokens))
def retime():
    out = {}
    for (op, wt, shape), cols in sorted(want.items()):
        cols = sorted(cols)
        res, _ = time_op("CPU", op, wt, shape, cols, None, 2, 2, 5, True, "")
        for n, r in zip(cols, res):
            out[Profile.op_key(op, wt, shape, n)] = statistics.median(r.samples_us)
    return out
after = retime()
after2 = retime()
def ratio(times):
    real = one = 0.0
    for p in pts:
        op = _Op(p)
        k = Profile.op_key(op.op, op.weight_type, tuple(op.weight_shape), int(op.n_tokens))
        t = times(k, op)
        if t > 0:
            real += max(p["us"] - h, 0.0); one += t
    return real / one
print(json.dumps({"profile_s": t1 - t0, "matmul_scale": dc.matmul_scale, "n_points": len(pts),
                  "ratio_profile": ratio(lambda k, op: float(prof.compute_us("CPU", op))),
                  "ratio_after": ratio(lambda k, op: after.get(k, 0.0)),
                  "ratio_after2": ratio(lambda k, op: after2.get(k, 0.0)),
                  "host_speed": prof.host_speed}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_f = out / "pairing.json"
    runs = json.loads(runs_f.read_text()) if runs_f.exists() else []
    if not a.report:
        models = out / "models"
        models.mkdir(exist_ok=True)
        for i in range(len(runs), a.n):
            cache = out / f"cache{i}"
            cache.mkdir(exist_ok=True)
            if not (cache / "models").exists():
                (cache / "models").symlink_to(models.resolve())
            load0, t0 = os.getloadavg()[0], time.time()
            r = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, "OALLAMA_CACHE": str(cache)},
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.stderr.write(r.stderr[-3000:])
                return 1
            doc = json.loads(r.stdout.strip().splitlines()[-1])
            doc.update(run=i, started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0)), wall_s=time.time() - t0,
                       load_avg_start=load0, load_avg_end=os.getloadavg()[0])
            runs.append(doc)
            runs_f.write_text(json.dumps(runs, indent=1))
            print(f"run {i}: matmul_scale {doc['matmul_scale']:.3f}, real/one-op with the profile's times "
                  f"{doc['ratio_profile']:.3f}, re-timed {doc['ratio_after']:.3f} / {doc['ratio_after2']:.3f}", flush=True)
    lines = ["| run | matmul_scale | real / profile's one-op | real / one-op re-timed | again | load avg |",
             "|---|---|---|---|---|---|"]
    for d in runs:
        lines.append(f"| {d['run']} | {d['matmul_scale']:.3f} | {d['ratio_profile']:.3f} | {d['ratio_after']:.3f} | "
                     f"{d['ratio_after2']:.3f} | {d['load_avg_start']:.2f}-{d['load_avg_end']:.2f} |")
    for k in ("matmul_scale", "ratio_profile", "ratio_after", "ratio_after2"):
        v = [d[k] for d in runs]
        lines.append(f"\n{k}: {min(v):.3f}-{max(v):.3f}, max/min {max(v) / min(v):.3f}")
    (out / "pairing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
