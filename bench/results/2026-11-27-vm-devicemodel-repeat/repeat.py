#!/usr/bin/env python3
"""How much a device model's terms, and the predictions made from them, move between fresh
characterisations of the same machine: N times in turn, each in a process and a profile cache of its
own (the models shared), the CPU characterised on the reference and qwen3-8b-2l (held-out protocol
v2's model) profiled and planned from it, as `heldout.py`'s cpu setup does (2 threads; prompt 512 /
gen 64, ubatch 512, n_ctx 4096). Nothing is run but the characterisation and the one-op profile.

    python bench/results/2026-11-27-vm-devicemodel-repeat/repeat.py -n 4 -o DIR   # then --report
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "bench" / "heldout"))
sys.path.insert(0, str(HERE.parents[2] / "bench" / "scripts"))

CHILD = """
import json, os, sys, time
sys.path.insert(0, {heldout!r})
import heldout
from oallama._files import cache_base
from oallama.planner import plan as planmod
path, _ = heldout.model_path("qwen3-8b-2l", cache_base() / "models")
wl = planmod.Workload(512, 64, "e2e", 512, 4096)
t0 = time.perf_counter()
ctx = planmod.build_context(path, None, wl, threads=2, progress=True, calibration="device")
t1 = time.perf_counter()
plans = {{s: planmod.make_plan(ctx, s, None) for s in ("layers", "optimal")}}
print(json.dumps({{"context_s": t1 - t0, "profile_host_speed": ctx.profile.host_speed,
                  "profile_launch_us": ctx.profile.launch_us("CPU"),
                  "predicted": {{s: {{m: p.predicted[m] for m in ("ttft_ms", "tpot_ms", "e2e_ms")}}
                                for s, p in plans.items()}}}}))
"""


def run(out: Path, n: int) -> None:
    from provenance import git_commit

    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    runs = json.loads((out / "runs.json").read_text()) if (out / "runs.json").exists() else []
    for i in range(len(runs), n):
        cache = out / f"cache{i}"
        cache.mkdir(exist_ok=True)
        if not (cache / "models").exists():
            (cache / "models").symlink_to(models.resolve())
        t0 = time.time()
        load0 = os.getloadavg()[0]
        r = subprocess.run([sys.executable, "-c", CHILD.format(heldout=str(HERE.parents[2] / "bench" / "heldout"))],
                           env={**os.environ, "OALLAMA_CACHE": str(cache)}, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"run {i} failed:\n{r.stderr[-3000:]}")
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        dm = json.loads(next((cache / "devices").glob("*.json")).read_text())
        ref = next(p for p in (cache / "profiles").glob("*.json") if json.loads(p.read_text()).get("calibration"))
        doc.update({"run": i, "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)),
                    "wall_s": time.time() - t0, "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
                    "device_model": {"terms": {d: {k: v for k, v in t.items() if k != "ops"}
                                               for d, t in dm["terms"].items()},
                                     "ops": {d: t["ops"] for d, t in dm["terms"].items()},
                                     "outside": dm["outside"], "reference": dm["reference"]},
                    "reference_host_speed": json.loads(ref.read_text())["host_speed"]})
        runs.append(doc)
        (out / "runs.json").write_text(json.dumps(runs, indent=1))
        print(f"run {i}: {doc['wall_s']:.0f} s, CPU matmul_scale {doc['device_model']['terms']['CPU']['matmul_scale']:.3f}, "
              f"predicted {doc['predicted']}", file=sys.stderr, flush=True)


def spread(values: list[float]) -> str:
    lo, hi, med = min(values), max(values), statistics.median(values)
    return f"{med:.4g} ({lo:.4g}-{hi:.4g}, max/min {hi / lo:.3f})"


def report(out: Path) -> str:
    runs = json.loads((out / "runs.json").read_text())
    t = [r["device_model"]["terms"]["CPU"] for r in runs]
    o = [r["device_model"]["outside"] for r in runs]
    lines = [f"# {len(runs)} fresh characterisations in turn (commit(s) {', '.join(sorted({r['commit'][:10] for r in runs}))}; "
             f"load average {min(r['load_avg_start'] for r in runs):.2f}-"
             f"{max(max(r['load_avg_start'], r['load_avg_end']) for r in runs):.2f})", "",
             "median (min-max, max/min) over the runs", "",
             f"- wall per run (s): {spread([r['wall_s'] for r in runs])}",
             f"- CPU matmul_scale: {spread([x['matmul_scale'] for x in t])}",
             f"- CPU node_overhead_us: {spread([x['node_overhead_us'] for x in t])}",
             f"- outside decode_us: {spread([x['decode_us'] for x in o])}",
             f"- outside pass_a_us: {spread([x['pass_a_us'] for x in o])}",
             f"- outside pass_b_us: {spread([x['pass_b_us'] for x in o])}"]
    for role, key in (("reference_host_speed", "before"), ("profile_host_speed", "before")):
        for probe in ("n1_us", "n32_us", "big_n1_us"):
            lines.append(f"- {role} {key} {probe}: {spread([r[role][key]['host'][probe] for r in runs])}")
    for s in ("layers", "optimal"):
        for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
            lines.append(f"- qwen3-8b-2l {s} predicted {m}: {spread([r['predicted'][s][m] for r in runs])}")
    for m in ("ttft_ms", "tpot_ms", "e2e_ms"):
        lines.append(f"- qwen3-8b-2l optimal / layers predicted {m}: "
                     f"{spread([r['predicted']['optimal'][m] / r['predicted']['layers'][m] for r in runs])}")
    lines.append(f"- CPU matmul_scale per run: {', '.join(f'{x:.3f}' for x in (y['matmul_scale'] for y in t))}")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=HERE)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    if not a.report:
        run(a.output, a.n)
    print(report(a.output))


if __name__ == "__main__":
    main()
