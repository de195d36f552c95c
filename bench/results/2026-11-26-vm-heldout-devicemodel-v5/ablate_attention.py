#!/usr/bin/env python3
"""The device model version 5 on the held-out set with and without its attention term, by
re-prediction from one characterisation: each held-out cell's stored one-op profile (its own weight
matmul times, `SRC`), costed with the calibration the device model in `reference/` gives; nothing
run, nothing measured.

    python ablate_attention.py VARIANT OUT       (on commit 64ae001: version 5's attention factors; from
                                                  method 30 on the calibration fits them, calfit.span_lines)

  none     no attention term: version 4's lines
  slopes   the spans' factors on the attention kinds' slopes only, as this characterisation ran
  lines    the factors fitted again by this checkout from the spans kept in the device model
           (attnspan.factors: slopes and intercepts)
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "heldout"))
import heldout  # noqa: E402
import refit  # noqa: E402
from oallama.model import gguf_file  # noqa: E402
from oallama.planner.cost import attnspan, devicemodel  # noqa: E402

SRC = HERE.parent / "2026-11-25-vm-heldout"
REF = {"rpc": "cpu-rpc-1thread-v5.json", "cpu": "cpu-2threads-v5.json"}  # setup -> device model (reference/)


def device_model(name: str, variant: str) -> devicemodel.DeviceModel:
    dm = devicemodel.DeviceModel.from_json(json.loads((HERE / "reference" / name).read_text()))
    spans, dm.attention = dm.attention.get("spans", []), {}
    if variant == "slopes":
        bare = dm.calibration(dm.names, dm.reference["n_vocab"])
        dm.attention = {"factors": {d: {k: {**a, "intercept": 1.0} for k, a in f.items()}
                                    for d, f in attnspan.factors(bare, spans).items()}}
    elif variant == "lines":
        dm.attention = {"factors": attnspan.factors(dm.calibration(dm.names, dm.reference["n_vocab"]), spans)}
    elif variant != "none":
        raise SystemExit(f"VARIANT: none, slopes or lines, not {variant!r}")
    return dm


def main() -> int:
    variant, out = sys.argv[1], Path(sys.argv[2])
    dms = {s: device_model(f, variant) for s, f in REF.items()}
    for s, dm in dms.items():
        print(s, {d: {k: (round(a["factor"], 2), round(a.get("intercept", 1.0), 2)) for k, a in f.items()}
                  for d, f in dm.attention.get("factors", {}).items()}, file=sys.stderr)
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
