#!/usr/bin/env python3
"""Re-predict committed bench configurations with this checkout's cost model: each committed
profile's calibration is refitted from the measurements it carries (points, splits), each
configuration's plan is costed again, and the errors against the committed measurements are
printed beside the ones the bench recorded. No model runs; a loopback rpc-server is started only
to stand in for the accelerator (the plans' own rpc-servers are gone).

    python bench/scripts/repredict.py bench/results/<dir> [--cells] [--device NAME]
        configurations on an rpc-server (a loopback one stands in), or on NAME (e.g. Vulkan0: the graphs
        then have that device's supported ops); --cells: each cell's measured and predicted
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oallama.planner import plan as planmod
from oallama.planner.cost.calfit import refitted
from oallama.planner.cost.profile import Profile
from oallama.runtime import rpc

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _context(spec: dict[str, Any], d: Path, device: str) -> planmod.PlanContext:
    c = spec["config"]
    pf = d / "profiles" / f"{spec['profile_key']}.json"
    if not pf.exists():
        pf = next(d.glob(f"profiles/{spec['profile_key'][:12]}*.json"))
    prof = Profile.from_json(json.loads(pf.read_text()), pf)
    if prof.calibration is not None:  # the committed measurements, fitted by this checkout's method
        prof.calibration = refitted(prof.calibration, prof)
    prof = prof.renamed([n if n == "CPU" else device for n in prof.devices])
    wl = planmod.Workload(c["prompt"], c["gen"], "e2e", c["settings"]["n_ubatch"])
    return planmod.build_context(c["model"], device, wl, profile=prof, threads=c["settings"]["threads"],
                                 op_offload=bool(c.get("op_offload", True)), progress=False)


@dataclass
class _Named:
    device_name: str  # an accelerator named on the command line, standing where an rpc-server would


def _err(pred: dict[str, float], meas: dict[str, float], k: str) -> float:
    return abs(pred[k] - meas[k]) / meas[k]


def _p90(v: list[float]) -> float:
    return float(np.percentile(v, 90))  # linear between ranks, as `oallama bench-report`


def main() -> int:
    args = sys.argv[1:]
    cells = "--cells" in args
    args = [a for a in args if a != "--cells"]
    device = None
    if "--device" in args:
        i = args.index("--device")
        if i + 1 >= len(args):
            sys.exit(__doc__)
        device = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit(__doc__)
    d = Path(args[0])
    rows: list[tuple[str, str, str, dict[str, float], dict[str, float], dict[str, float]]] = []
    with contextlib.nullcontext(_Named(device)) if device else rpc.start_server(threads=1) as srv:
        ctxs: dict[tuple[Any, ...], planmod.PlanContext] = {}
        for spec_f in sorted(d.glob("raw/*.spec.json")):
            res_f = spec_f.with_name(spec_f.name.replace(".spec.json", ".json"))
            if not res_f.exists():
                continue
            spec, res = json.loads(spec_f.read_text()), json.loads(res_f.read_text())
            c = spec["config"]
            key = (c["model"], c["prompt"], c["gen"], spec["profile_key"], c.get("op_offload", True))
            if key not in ctxs:
                ctxs[key] = _context(spec, d, srv.device_name)
            pred = ctxs[key].predict(planmod.placement_of(json.loads(Path(spec["plan_file"]).read_text())))
            meas = {k: statistics.median(v) for k, v in res["samples"].items()}
            rows.append((Path(c["model"]).stem, c["strategy"], c["budget"], meas, spec["plan"]["predicted"], pred))
    print(f"# {d}: {len(rows)} configurations re-predicted\n")
    print("| metric | median error recorded | median error now | p90 recorded | p90 now |\n|---|---|---|---|---|")
    for k in METRICS:
        old = sorted(_err(r[4], r[3], k) for r in rows)
        new = sorted(_err(r[5], r[3], k) for r in rows)
        print(f"| {k} | {statistics.median(old):.1%} | {statistics.median(new):.1%} | {_p90(old):.1%} | {_p90(new):.1%} |")
    print("\nPer model, median error recorded -> now (TTFT, TPOT, e2e):\n")
    for model in sorted({r[0] for r in rows}):
        rs = [r for r in rows if r[0] == model]
        print(f"- {model} ({len(rs)}): " + ", ".join(
            f"{statistics.median(_err(r[4], r[3], k) for r in rs):.1%} -> {statistics.median(_err(r[5], r[3], k) for r in rs):.1%}"
            for k in METRICS))
    print("\nLargest changes of the end-to-end error (measured / recorded prediction / now, ms):\n")
    ch = sorted(rows, key=lambda r: _err(r[5], r[3], "e2e_ms") - _err(r[4], r[3], "e2e_ms"))
    for model, strategy, budget, meas, old, new in ch[:5] + ch[-5:]:
        print(f"- {model} {strategy} @{budget}: e2e {meas['e2e_ms']:.0f} / {old['e2e_ms']:.0f} / {new['e2e_ms']:.0f}; "
              f"TTFT {meas['ttft_ms']:.0f} / {old['ttft_ms']:.0f} / {new['ttft_ms']:.0f}; "
              f"TPOT {meas['tpot_ms']:.1f} / {old['tpot_ms']:.1f} / {new['tpot_ms']:.1f}")
    if cells:
        _print_cells(rows)
    return 0


def _print_cells(rows: list[tuple[str, str, str, dict[str, float], dict[str, float], dict[str, float]]]) -> None:
    """Per model, strategy and budget: the median over its measurements of TTFT / TPOT (ms), the
    recorded prediction and this checkout's."""
    print("\n| model | strategy | budget | n | TTFT measured / recorded / now | TPOT measured / recorded / now |\n"
          "|---|---|---|---|---|---|")
    for key in sorted({r[:3] for r in rows}):
        rs = [r for r in rows if r[:3] == key]
        med = [{k: statistics.median(r[i][k] for r in rs) for k in METRICS} for i in (3, 4, 5)]
        print(f"| {' | '.join(key)} | {len(rs)} | " + " | ".join(
            " / ".join(f"{m[k]:.{1 if k == 'tpot_ms' else 0}f}" for m in med) for k in ("ttft_ms", "tpot_ms")) + " |")


if __name__ == "__main__":
    sys.exit(main())
