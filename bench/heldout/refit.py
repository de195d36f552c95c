#!/usr/bin/env python3
"""A measured held-out set predicted again by today's cost model, with each profile's calibration
re-fitted by today's fit from the measurements it stores: no model is run, nothing is measured.

A change of the fit (calfit.py) is scored here in minutes on the very passes and measurements the
set was made of: the set's cells, plans and measurements stay as they were; each placement's
earlier prediction is kept beside the new one (`predicted_before`). The one-op times, the link
curves and the time outside the graph are the stored profile's; only the devices' fitted terms
are re-fitted (`--fit current`), or kept as stored (`--fit stored`: today's graphs and pass model
with the fit the set was planned with).

    python bench/heldout/refit.py SRC -o OUT [--fit current|stored] [--setups cpu,rpc] [--stand-in]

SRC: a held-out results directory (cells/, plans/, profiles/); OUT gets cells/ and summary.md in
heldout.py's format. The Vulkan setup is left out unless named (it needs a Vulkan build).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import heldout
from provenance import git_commit


def repredict_cell(src: Path, out: Path, cell: dict[str, Any], fit: str, refit: Callable[..., Any] | None = None,
                   stand_in: bool = False) -> None:
    """One cell of `src` predicted again into `out`; refit(calibration, profile): the fit (default
    calfit.refitted, this checkout's); stand_in: a loopback rpc-server's name for an accelerator this
    machine lacks (the gpu setup's CUDA0): the graphs are built for it, every time is the profile's."""
    from oallama.planner import plan as planmod
    from oallama.planner.cost.profile import Profile
    from oallama.planner.cost.schedmodel import HOST
    from oallama.planner.plan import placement_of, read_plan
    from oallama.runtime import rpc

    setup, wl = cell["setup"], cell["workload"]
    st = heldout.PROTOCOL["setups"][setup]
    from oallama._files import cache_base

    path, _ = heldout.model_path(cell["model"], cache_base() / "models")
    profile = Profile.from_json(json.loads((src / "profiles" / f"{cell['profile']}.json").read_text()))
    if fit == "current" and profile.calibration is not None:
        if refit is None:
            from oallama.planner.cost.calfit import refitted as refit
        profile.calibration = refit(profile.calibration, profile)
    server = (rpc.start_server(threads=st["server_threads"], cpus=st["server_cpus"]) if setup == "rpc"
              else rpc.start_server(threads=1) if stand_in and cell.get("accelerator") else None)
    try:
        acc = server.device_name if server else cell["accelerator"]
        profile = profile.renamed([HOST, acc] if acc else [HOST])
        workload = planmod.Workload(wl["prompt"], wl["gen"], "e2e", heldout.PROTOCOL["n_ubatch"],
                                    heldout.PROTOCOL["n_ctx"])
        ctx = planmod.build_context(path, acc, workload, profile=profile, threads=cell["threads"], progress=False)
        for p in cell["placements"]:
            plan = read_plan(src / "plans" / cell["cell"] / Path(p["file"]).name)
            pred = ctx.predict(placement_of(plan))
            p["predicted_before"] = p["predicted"]
            p["predicted"] = {m: float(pred[m]) for m in heldout.METRICS}
            p["passes"] = pred["passes"]
    finally:
        if server is not None:
            server.stop()
    cell.update({"repredicted_from": str(src), "repredict_commit": git_commit(), "fit": fit,
                 **({"stand_in": "a loopback rpc-server for " + cell["accelerator"]} if stand_in and setup != "rpc"
                    and cell.get("accelerator") else {})})
    (out / "cells").mkdir(parents=True, exist_ok=True)
    (out / "cells" / f"{cell['cell']}.json").write_text(json.dumps(cell, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a measured held-out results directory")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--fit", choices=("current", "stored"), default="current")
    ap.add_argument("--setups", default="cpu,rpc")
    ap.add_argument("--stand-in", action="store_true", help="cells of an accelerator this machine lacks (gpu): "
                    "their graphs built for a loopback rpc-server, costed with the stored profile's times")
    a = ap.parse_args()
    setups = set(a.setups.split(","))
    t0 = time.perf_counter()
    for f in sorted((a.src / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] not in setups:
            continue
        repredict_cell(a.src, a.output, cell, a.fit, stand_in=a.stand_in)
        heldout.log(f"{cell['cell']}: predicted again ({a.fit} fit, {time.perf_counter() - t0:.0f} s)")
    print(heldout.report(a.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
