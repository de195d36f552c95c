#!/usr/bin/env python3
"""Benchmark: a CPU matmul with the weight in ggml's repacked layout (CPU_REPACK, what llama.cpp
uses by default) against the plain layout, and in both (CPU_REPACK_DUAL, patch 0006: the repacked
copy below --dual-max-batch columns), at the column counts of decode and prefill, per weight type.
Why host layouts are a per-weight choice: on some CPUs the repacked kernels are the slower ones.

    python bench/scripts/bench_repack.py [--threads 1] [--reps 5] [-o bench/results/<date>-<machine>]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path

import oallama  # noqa: F401
from oallama import _core
from oallama.planner.cost.profile import _cpu_name, build_info, cpu_detail

SHAPES = [("q4_K", 4096, 14336), ("q4_K", 5120, 27648), ("q4_0", 4096, 14336), ("q8_0", 4096, 14336),
          ("q5_K", 4096, 14336), ("q6_K", 4096, 14336)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cols", default="1,64,512")
    ap.add_argument("--dual-max-batch", type=int, default=32, help="CPU_REPACK_DUAL: repacked copy below this")
    ap.add_argument("-o", "--out", default=f"bench/results/{date.today()}-{platform.node()}")
    args = ap.parse_args()
    cols = [int(c) for c in args.cols.split(",")]
    rows = []
    dual = "CPU_REPACK_DUAL" in _core.cpu_layouts()
    if dual:
        _core.cpu_set_dual_max_batch(args.dual_max_batch)
    for wtype, k, m in SHAPES:
        res = {}
        for lay in ("repack", "plain", "dual"):  # alternated per shape
            if lay == "dual" and not (dual and res["repack"][0][0] == "CPU_REPACK"):
                res[lay] = [("-", float("nan"), 0.0)] * len(cols)
                continue
            kw = {"layout": "CPU_REPACK_DUAL"} if lay == "dual" else {}
            r = _core.profile_mul_mat("CPU", wtype, k, m, cols, args.threads, 2, args.reps, lay == "repack", **kw)
            res[lay] = [(x.buffer_type, statistics.median(x.samples_us),
                         statistics.stdev(x.samples_us)) for x in r]
        for i, n in enumerate(cols):
            (bt_r, t_r, s_r), (bt_p, t_p, s_p), (_, t_d, s_d) = res["repack"][i], res["plain"][i], res["dual"][i]
            rows.append({"type": wtype, "k": k, "m": m, "cols": n, "repack_buffer": bt_r, "repack_us": t_r,
                         "repack_stdev_us": s_r, "plain_buffer": bt_p, "plain_us": t_p, "plain_stdev_us": s_p,
                         "dual_us": t_d, "dual_stdev_us": s_d})
            print(f"{wtype} {k}x{m} @{n}: {bt_r} {t_r / 1e3:.2f} ms, {bt_p} {t_p / 1e3:.2f} ms, dual {t_d / 1e3:.2f} ms",
                  file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    doc = {"benchmark": "cpu_repack", "cpu": _cpu_name(), "cpu_detail": cpu_detail(), "machine": platform.node(), "threads": args.threads,
           "reps": args.reps, "dual_max_batch": args.dual_max_batch, "build": build_info(), "load_avg": load,
           "results": rows}
    (out / "repack.json").write_text(json.dumps(doc, indent=1))
    md = [f"# CPU matmul: repacked vs plain vs dual weight layout ({_cpu_name()}, {args.threads} thread(s))", "",
          f"Median of {args.reps} after 2 warm-ups, one-op ggml graphs (csrc/profile.cpp); llama.cpp "
          f"{build_info()['llama_cpp_commit'][:9]}; load average {load:.2f}. Dual: CPU_REPACK_DUAL (patch 0006), "
          f"the repacked copy below {args.dual_max_batch} columns, the plain one from there.", "",
          "| weight | columns | repacked (buffer) ms | plain ms | dual ms | repacked / plain |", "|---|---|---|---|---|---|"]
    for r in rows:
        d = f"{r['dual_us'] / 1e3:.2f}" if r["dual_us"] == r["dual_us"] else "-"
        md.append(f"| {r['type']} {r['k']}x{r['m']} | {r['cols']} | {r['repack_us'] / 1e3:.2f} ({r['repack_buffer']}) | "
                  f"{r['plain_us'] / 1e3:.2f} | {d} | {r['repack_us'] / r['plain_us']:.2f} |")
    (out / "repack.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
