#!/usr/bin/env python3
"""Benchmark: the all-reduces alone (tree, ring, star) on emulated hosts, message sizes 4 KiB-16 MiB.

Hosts are network namespaces on a private bridge with shaped links (bench/scripts/netns_hosts.py); the
ranks are `oallama.collective.launch` workers (`collective.selftest`). Per link rate and topology
(2 hosts x 2 ranks: the seed's setting; 2 hosts x 1 rank: no intra-host stage, and no more ranks
than this 2-core machine has cores), the whole self-test runs --reps times; the table gives the
median over repetitions of each run's median call (the algorithms alternate call by call, each call
started together after a barrier). Needs root (namespaces, tc).

    sudo .venv/bin/python bench/scripts/bench_allreduce.py [--rates 1gbit,100mbit] [--reps 2] [-o DIR]

Writes DIR/allreduce.json (every run, machine, commit, load averages), allreduce.csv, README.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns_hosts
from oallama import collective as C
from provenance import git_commit

SIZES = [1024, 3072, 32768, 262144, 1048576, 4194304]  # float32 elements: 4 KiB, 12 KiB (n_embd 3072) ... 16 MiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--topologies", default="2x2,2x1", help="HOSTSxRANKS, comma-separated")
    ap.add_argument("--delay-ms", type=float, default=0.2, help="one-way delay (applied only with netem)")
    ap.add_argument("--iters", type=int, default=10, help="calls per size and algorithm in one run (alternated)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="float32 elements per all-reduce, comma-separated")
    ap.add_argument("--reps", type=int, default=2, help="runs per rate and topology")
    ap.add_argument("--raw-dir", default="build/bench-allreduce-raw")
    ap.add_argument("-o", "--out", type=Path, default=Path(f"bench/results/{date.today()}-{platform.node()}-allreduce"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    chk = netns_hosts.check()
    if not all(chk.get(k) is True for k in ("ip_netns", "veth", "tc_tbf")):
        sys.exit(f"bench_allreduce: needs network namespaces, veth and tc tbf (root): {chk}")
    runs: list[dict[str, Any]] = []
    for rate in args.rates.split(","):
        for tspec in args.topologies.split(","):
            n_hosts, per = (int(x) for x in tspec.split("x"))
            topo = C.Topology.uniform(n_hosts, per)
            for rep in range(args.reps):
                hosts = netns_hosts.Hosts(n_hosts, netns_hosts.LinkOptions(rate=rate, delay_ms=args.delay_ms))
                hosts.up()
                load0 = os.getloadavg()[0]
                try:
                    out = Path(args.raw_dir) / f"{rate}-{tspec}-{rep}"
                    reports = C.selftest(topo, out, sizes=args.sizes, iters=args.iters, count_n=3072,
                                      check_sizes="1000", timeout_s=1200, netns=hosts.namespaces,
                                      ifnames=hosts.ifnames, master_addr=hosts.addrs[0])
                    rank = reports[0]
                    shaping = hosts.shaping
                finally:
                    hosts.down()
                row = {"rate": rate, "topology": tspec, "rep": rep, "shaping": shaping, "load_avg_start": load0,
                       "load_avg_end": os.getloadavg()[0],
                       "intra": {a: rank["algorithms"][a]["intra"] for a in C.ALGORITHMS},
                       "seconds_per_call": {a: {int(k): v for k, v in rank["algorithms"][a]["seconds_per_call"].items()}
                                            for a in C.ALGORITHMS},
                       # the tree's stages per call (means), on rank 0 (a local master, the GM) and rank 1
                       "tree_stages_ms": {r["rank"]: {int(k): {st: v * 1e3 for st, v in d.items()}
                                                      for k, d in r["algorithms"]["tree"]["stage_seconds_per_call"].items()}
                                          for r in reports[:2]}}
                runs.append(row)
                print(json.dumps({k: row[k] for k in ("rate", "topology", "rep", "load_avg_start")}), file=sys.stderr)
    doc = {"schema": "oallama.bench-allreduce/1", "commit": git_commit(), "date": str(date.today()),
           "device": {"machine": platform.node(), "cpu_count": os.cpu_count()}, "netns_check": chk,
           "settings": {"sizes_elements": sizes, "iters": args.iters, "timing": "algorithms alternated call by call, "
                        "each call after a barrier, median call", "reps": args.reps, "delay_ms": args.delay_ms},
           "runs": runs}
    (args.out / "allreduce.json").write_text(json.dumps(doc, indent=1))
    rows = []
    for rate in args.rates.split(","):
        for tspec in args.topologies.split(","):
            rs = [r for r in runs if r["rate"] == rate and r["topology"] == tspec]
            for n in sizes:
                med = {a: statistics.median(r["seconds_per_call"][a][n] for r in rs) * 1e3 for a in C.ALGORITHMS}
                rows.append({"rate": rate, "topology": tspec, "elements": n, "bytes": 4 * n,
                             **{f"{a}_ms": round(v, 3) for a, v in med.items()},
                             "tree_vs_star": round(med["tree"] / med["star"], 3),
                             "tree_vs_ring": round(med["tree"] / med["ring"], 3),
                             "load_avg_max": round(max(max(r["load_avg_start"], r["load_avg_end"]) for r in rs), 2)})
    with (args.out / "allreduce.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| rate | hosts x ranks | message | tree ms | ring ms | star ms | tree / star | tree / ring |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = f"{r['bytes'] // 1024} KiB" if r["bytes"] < 2**20 else f"{r['bytes'] // 2**20} MiB"
        lines.append(f"| {r['rate']} | {r['topology']} | {size} | {r['tree_ms']:.2f} | {r['ring_ms']:.2f} | "
                     f"{r['star_ms']:.2f} | {r['tree_vs_star']:.2f} | {r['tree_vs_ring']:.2f} |")
    lines += ["", "The tree's stages, mean ms per call (median over runs) on rank 0 (a local master) and rank 1 "
              "(2x2: rank 0's host peer; 2x1: the other host's local master): (1) the host's sum in shared memory, "
              "(2)-(3) the inter-host exchange, (4) the barrier and the copy out.", "",
              "| rate | hosts x ranks | message | tree ms (median call) | rank 0: (1) / (2)-(3) / (4) | rank 1: (1) / (2)-(3) / (4) |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        rs = [x for x in runs if x["rate"] == r["rate"] and x["topology"] == r["topology"]]
        cells = []
        for rk in (0, 1):
            st = {k: statistics.median(x["tree_stages_ms"][rk][r["elements"]][k] for x in rs)
                  for k in ("intra_up", "inter", "intra_down")}
            cells.append(f"{st['intra_up']:.2f} / {st['inter']:.2f} / {st['intra_down']:.2f}")
        size = f"{r['bytes'] // 1024} KiB" if r["bytes"] < 2**20 else f"{r['bytes'] // 2**20} MiB"
        lines.append(f"| {r['rate']} | {r['topology']} | {size} | {r['tree_ms']:.2f} | {cells[0]} | {cells[1]} |")
    (args.out / "allreduce.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"commit {doc['commit'][:9]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
