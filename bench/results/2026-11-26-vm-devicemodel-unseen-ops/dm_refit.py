#!/usr/bin/env python3
"""The device model on the held-out set, with three ways of costing an op kind the reference model
did not have ("*"), by re-prediction: each held-out cell's stored one-op profile (its own weight
matmul times), costed with the calibration a device model gives; the device model's terms from the
reference's stored calibration, fitted again by this checkout; nothing run, nothing measured.

    python dm_refit.py VARIANT OUT       VARIANT: all-ops | byte-ops | median-kinds

  all-ops       one line through every timed node that is not a weight matmul (before)
  byte-ops      one line through the nodes whose work is bytes (not the attention matmuls)
  median-kinds  the median kind's intercept and slope over the byte-work kinds (calfit.unseen_op_fit)

The reference's calibrations and the device models (links, time outside the graph) are the ones the
held-out device-model run characterised (`REF`: profile and device-model keys in $OALLAMA_CACHE, copied
into `reference/`).
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "heldout"))
import heldout  # noqa: E402
import refit  # noqa: E402
from oallama.model import gguf_file  # noqa: E402
from oallama.planner.cost import calfit, devicemodel  # noqa: E402
from oallama.planner.cost.profile import Profile  # noqa: E402

SRC = HERE.parent / "2026-11-25-vm-heldout"
# setup -> (the reference's calibrated profile, the device model): CPU + rpc-server (1 thread each), CPU (2)
REF = {"rpc": ("81e8973f624a4ecc", "0a2a8c3badeb"), "cpu": ("022679f5ece1f9ff", "62d512b2a47d")}


def unseen(variant: str, dc: calfit.DeviceCalibration, dev: str, points: list) -> calfit.OpFit | None:
    if variant == "median-kinds":
        return calfit.unseen_op_fit({k: f for k, f in dc.ops.items() if k != "*"})
    pick = calfit.byte_work if variant == "byte-ops" else (lambda op: True)
    pts = [(p["work"], max(p["us"] - dc.node_overhead_us, 0.0)) for p in points if p["device"] == dev
           and p["op"] not in calfit.VIEW_OPS and not (p["weight_type"] and p["op"] in calfit.MATMUL_OPS)
           and pick(p["op"])]
    return calfit.OpFit.fit(pts) if pts else None


def device_model(setup: str, variant: str) -> devicemodel.DeviceModel:
    pkey, dkey = REF[setup]
    ref = Profile.from_json(json.loads((HERE / "reference" / f"{pkey}.json").read_text()))
    cal = calfit.refitted(ref.calibration, ref)
    dm = devicemodel.DeviceModel.from_json(json.loads((HERE / "reference" / f"{dkey}.json").read_text()))
    for d, dc in cal.devices.items():
        ops = {k: f for k, f in dc.ops.items() if k != "*"}
        if star := unseen(variant, dc, d, cal.points):
            ops["*"] = star
        dm.terms[d].update({"node_overhead_us": dc.node_overhead_us, "matmul_scale": dc.matmul_scale,
                            "ops": {k: vars(f) for k, f in ops.items()}})
    return dm


def main() -> int:
    variant, out = sys.argv[1], Path(sys.argv[2])
    dms = {s: device_model(s, variant) for s in REF}
    from oallama._files import cache_base

    for f in sorted((SRC / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] not in REF:
            continue
        path, _ = heldout.model_path(cell["model"], cache_base() / "models")
        vocab = devicemodel.n_vocab(gguf_file.check_model(path))
        dm = dms[cell["setup"]]

        def costed(cal, profile, dm=dm, vocab=vocab):
            new = dm.calibration(list(profile.devices), vocab)
            new.routing = cal.routing  # a mixture of experts' own (none here)
            return new

        refit.repredict_cell(SRC, out, cell, "current", costed)
    print(heldout.report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
