#!/usr/bin/env python3
"""Benchmark: a CPU matmul with the weight in ggml's repacked layout (CPU_REPACK, what llama.cpp
uses by default) against the plain layout, at the column counts of decode and prefill. Why
profiles record the `repack` setting: on some CPUs the repacked kernels are the slower ones.

    python scripts/bench_repack.py [--threads 1] [--reps 5] [-o bench/results/<date>-<machine>]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import date
from pathlib import Path

import oallama  # noqa: F401
from oallama import _core
from oallama.planner.profile import _cpu_name, build_info

SHAPES = [("q4_K", 4096, 14336), ("q4_K", 5120, 27648), ("q4_0", 4096, 14336), ("q8_0", 4096, 14336)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cols", default="1,64,512")
    ap.add_argument("-o", "--out", default=f"bench/results/{date.today()}-{platform.node()}")
    args = ap.parse_args()
    cols = [int(c) for c in args.cols.split(",")]
    rows = []
    for wtype, k, m in SHAPES:
        res = {}
        for repack in (True, False):
            r = _core.profile_mul_mat("CPU", wtype, k, m, cols, args.threads, 2, args.reps, repack)
            res[repack] = [(x.buffer_type, statistics.median(x.samples_us),
                            statistics.stdev(x.samples_us)) for x in r]
        for i, n in enumerate(cols):
            (bt_r, t_r, s_r), (bt_p, t_p, s_p) = res[True][i], res[False][i]
            rows.append({"type": wtype, "k": k, "m": m, "cols": n, "repack_buffer": bt_r, "repack_us": t_r,
                         "repack_stdev_us": s_r, "plain_buffer": bt_p, "plain_us": t_p, "plain_stdev_us": s_p})
            print(f"{wtype} {k}x{m} @{n}: {bt_r} {t_r / 1e3:.2f} ms, {bt_p} {t_p / 1e3:.2f} ms", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "cpu_repack", "cpu": _cpu_name(), "machine": platform.node(), "threads": args.threads,
           "reps": args.reps, "build": build_info(), "results": rows}
    (out / "repack.json").write_text(json.dumps(doc, indent=1))
    md = [f"# CPU matmul: repacked vs plain weight layout ({_cpu_name()}, {args.threads} thread(s))", "",
          f"Median of {args.reps} after 2 warm-ups, one-op ggml graphs (csrc/profile.cpp); llama.cpp "
          f"{build_info()['llama_cpp_commit'][:9]}.", "",
          "| weight | columns | repacked (buffer) ms | plain ms | repacked / plain |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['type']} {r['k']}x{r['m']} | {r['cols']} | {r['repack_us'] / 1e3:.2f} ({r['repack_buffer']}) | "
                  f"{r['plain_us'] / 1e3:.2f} | {r['repack_us'] / r['plain_us']:.2f} |")
    (out / "repack.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
