#!/usr/bin/env python3
"""Benchmark: tensor-parallel inference, tree vs ring vs star all-reduce, with and without the
layer-streaming memory manager, on 2 emulated hosts x 2 ranks (seed 001's setting).

Hosts are network namespaces on a private bridge whose links are shaped (bench/scripts/netns_hosts.py:
tc netem where the kernel has it, else tc tbf = rate only). The model is a synthetic GGUF with
Llama-3.2-3B's shapes (the seed's "LLaMA-3B"; output matrix untied). Per configuration: TTFT
(prompt -> first token), decode tokens/s, peak memory per rank (exact bytes held: weights + KV;
and the sampled RssAnon), inter-host messages/bytes (counted, and the veth byte counters).

    sudo .venv/bin/python bench/scripts/bench_tp.py [--layers 28] [--rates 1gbit,100mbit] [-o DIR]

Writes DIR/results.json (everything), DIR/results.csv (one row per run), DIR/README.md.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns_hosts
from oallama import collective as C
from oallama.collective.tp.decoder import TPOptions, run_distributed
from oallama.model import synthetic
from oallama.model.synthetic import PRESETS  # the table write_model reads (dense + MoE)
from provenance import git_commit

# the seed's claims for its system (tree + memory manager) against a parameter-server baseline
SEED = {"ttft_change": (-0.61, -0.34), "tps_change": (0.52, 1.50), "memory_change": -0.61}
CONFIGS = [("star", False), ("ring", False), ("tree", False), ("star", True), ("ring", True), ("tree", True)]


def bench_preset() -> str:
    """Register Llama-3.2-3B's shape (no preset of oallama's has it) for this process only."""
    name = "llama3.2-3b"
    if name not in PRESETS:
        PRESETS[name] = dataclasses.replace(
            PRESETS["llama3-8b"], name=name, description="Llama-3.2-3B shape (output untied)",
            n_embd=3072, n_layer=28, n_head=24, n_head_kv=8, n_ff=8192)
    return name


def make_model(args: argparse.Namespace) -> Path:
    preset = bench_preset()
    path = Path(args.model_dir) / f"{preset}-{args.type}-l{args.layers}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr)
        synthetic.write_model(path, preset, args.type, n_layer=args.layers, progress=False)
    return path


def summarize(run: Any, wire: int | None) -> dict[str, Any]:
    tot = run.totals()
    mem = [r["memory"] for r in run.reports]
    return {
        "ttft_s": run.ttft_s, "tokens_per_s": run.tokens_per_s, "decode_s": run.reports[0]["decode_s"],
        "held_peak_bytes": max(m["held_peak"] for m in mem),  # exact, max over ranks
        "rss_anon_peak_bytes": max(m["rss_anon_peak"] for m in mem),
        "model_peak_sampled_bytes": max(m["model_peak_sampled"] for m in mem),
        "inter_msgs": tot.inter_msgs, "inter_bytes": tot.inter_bytes, "wire_tx_bytes": wire,
        "allreduce_calls_per_rank": tot.allreduce_calls // len(run.reports),
        "allreduce_s_rank0": run.reports[0]["counters"]["allreduce_seconds"],
        "stream_load_s_rank0": run.reports[0]["stream"]["load_s"],
        "stream_wait_s_rank0": run.reports[0]["stream"]["wait_s"],
        "load_s_rank0": run.reports[0]["load_s"], "wall_s": run.wall_s, "tokens": run.tokens,
    }


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def run_all(args: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
    n_hosts, per_host = (int(x) for x in args.topology.split("x"))
    topo = C.Topology.uniform(n_hosts, per_host)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(1000, 100000, args.prompt)]
    chk = netns_hosts.check()
    use_netns = not args.no_netns and all(chk.get(k) is True for k in ("ip_netns", "veth", "tc_tbf"))
    doc: dict[str, Any] = {
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                    "loadavg_start": loadavg()},
        "netns_check": chk, "model": {"path": model.name, "preset": "llama3.2-3b", "type": args.type,
                                       "layers": args.layers, "bytes": model.stat().st_size},
        "prompt_tokens": args.prompt, "gen_tokens": args.gen, "world_size": topo.world_size, "topology": f"{n_hosts} hosts x {per_host} rank{'s' if per_host > 1 else ''}",
        "links": [], "runs": [],
    }
    for rate in args.rates.split(","):
        link = netns_hosts.LinkOptions(rate=rate, delay_ms=args.delay_ms)
        hosts = netns_hosts.Hosts(2, link) if use_netns else None
        try:
            launch_kw: dict[str, Any] = {}
            if hosts is not None:
                hosts.up()
                launch_kw = {"netns": hosts.namespaces, "ifnames": hosts.ifnames, "master_addr": hosts.addrs[0]}
            link_doc = {"rate": rate, "delay_ms": args.delay_ms,
                        "shaping": hosts.shaping if hosts else "none (loopback, namespaces not permitted)"}
            # the collectives alone: one decode step's message (n_embd floats) and one prefill's
            sizes = f"3072,{3072 * args.prompt}"
            before = hosts.counters() if hosts else None
            rep = C.selftest(topo, Path(args.raw_dir) / f"collective-{rate}", sizes=sizes, iters=args.coll_iters,
                             count_n=3072, check_sizes="1000", timeout_s=300, **launch_kw)
            link_doc["collective_s_per_call"] = {alg: rep[0]["algorithms"][alg]["seconds_per_call"]
                                                 for alg in C.ALGORITHMS}
            if hosts and before:
                link_doc["collective_wire_tx_bytes"] = sum(a["tx_bytes"] - b["tx_bytes"]
                                                           for a, b in zip(hosts.counters(), before, strict=True))
            doc["links"].append(link_doc)
            print(json.dumps(link_doc), file=sys.stderr)
            for rep_i in range(args.reps):
                for alg, stream in CONFIGS:
                    if args.only and f"{alg}{'+stream' if stream else ''}" not in args.only.split(","):
                        continue
                    before = hosts.counters() if hosts else None
                    run = run_distributed(model, prompt, args.gen, topo,
                                          TPOptions(algorithm=alg, stream=stream, n_ctx=args.prompt + args.gen + 8),
                                          out_dir=Path(args.raw_dir) / f"{rate}-{alg}-{stream}-{rep_i}", timeout_s=1800,
                                          **launch_kw)
                    wire = (sum(a["tx_bytes"] - b["tx_bytes"] for a, b in zip(hosts.counters(), before, strict=True))
                            if hosts and before else None)
                    row = {"rate": rate, "algorithm": alg, "stream": stream, "rep": rep_i, "loadavg": loadavg(),
                           **summarize(run, wire)}
                    doc["runs"].append(row)
                    print(json.dumps({k: v for k, v in row.items() if k not in ("decode_s", "tokens")}),
                          file=sys.stderr)
        finally:
            if hosts is not None:
                hosts.down()
    doc["machine"]["loadavg_end"] = loadavg()
    return doc


def _med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(doc: dict[str, Any]) -> str:
    runs = doc["runs"]
    m, L = doc["machine"], doc["model"]
    lines = [
        "# Tensor-parallel inference: tree vs ring vs star all-reduce (seed 001)",
        "",
        f"Machine: `{m['node']}`, {m['cpus']} cores, {m['mem_total_gib']} GiB, CPU only; load average "
        f"{m['loadavg_start']} at the start, {m['loadavg_end']} at the end.",
        f"Model: synthetic `{L['preset']}` {L['type']} ({L['layers']} layers, {L['bytes'] / 2**30:.2f} GiB file; "
        "Llama-3.2-3B shapes: n_embd 3072, 24 heads / 8 KV heads, n_ff 8192, vocab 128256).",
        f"Workload: {doc['prompt_tokens']}-token prompt, {doc['gen_tokens']} generated tokens, greedy; "
        f"{doc['topology']} (gloo over the emulated links; the tree's intra-host stage in shared memory).",
        "Namespaces/tc on this machine: " + "; ".join(f"{k}: {v}" for k, v in doc["netns_check"].items()),
        "",
    ]
    for link in doc["links"]:
        rate = link["rate"]
        rows = [r for r in runs if r["rate"] == rate]
        if not rows:
            continue
        lines += [f"## Links: {rate}, shaping: {link['shaping']}", ""]
        cs = link["collective_s_per_call"]
        sizes = list(next(iter(cs.values())).keys())
        lines += [f"All-reduce alone (ms per call, {doc['topology']}):", "",
                  "| elements | " + " | ".join(C.ALGORITHMS) + " |", "|---|" + "---|" * len(C.ALGORITHMS)]
        for n in sizes:
            lines.append(f"| {n} ({int(n) * 4 / 1024:.0f} KiB) | " +
                         " | ".join(f"{cs[a][n] * 1e3:.2f}" for a in C.ALGORITHMS) + " |")
        lines += ["", "| config | TTFT s | tokens/s | peak held MiB/rank | peak RssAnon MiB/rank | "
                  "inter-host msgs | inter-host MiB (counted) | MiB on the veths |",
                  "|---|---|---|---|---|---|---|---|"]
        base = [r for r in rows if r["algorithm"] == "star" and not r["stream"]]
        for alg, stream in CONFIGS:
            rs = [r for r in rows if r["algorithm"] == alg and r["stream"] == stream]
            if not rs:
                continue
            wire = _med(rs, "wire_tx_bytes") / 2**20 if rs[0]["wire_tx_bytes"] is not None else float("nan")
            lines.append(f"| {alg}{' + streaming' if stream else ''} | {_med(rs, 'ttft_s'):.2f} | "
                         f"{_med(rs, 'tokens_per_s'):.3f} | {_med(rs, 'held_peak_bytes') / 2**20:.0f} | "
                         f"{_med(rs, 'rss_anon_peak_bytes') / 2**20:.0f} | {rs[0]['inter_msgs']} | "
                         f"{rs[0]['inter_bytes'] / 2**20:.1f} | {wire:.1f} |")
        if base:
            lines += ["", "Change against the star (parameter-server) baseline, all layers resident; "
                      "the seed's claims for its system (tree + memory manager):", "",
                      "| config | TTFT | tokens/s | peak held memory |", "|---|---|---|---|"]
            b_ttft, b_tps, b_mem = _med(base, "ttft_s"), _med(base, "tokens_per_s"), _med(base, "held_peak_bytes")
            for alg, stream in CONFIGS[1:]:
                rs = [r for r in rows if r["algorithm"] == alg and r["stream"] == stream]
                if rs:
                    lines.append(f"| {alg}{' + streaming' if stream else ''} | "
                                 f"{_med(rs, 'ttft_s') / b_ttft - 1:+.0%} | {_med(rs, 'tokens_per_s') / b_tps - 1:+.0%} | "
                                 f"{_med(rs, 'held_peak_bytes') / b_mem - 1:+.0%} |")
            lines.append(f"| seed 001 claim (tree + manager) | {SEED['ttft_change'][0]:+.0%}..{SEED['ttft_change'][1]:+.0%} | "
                         f"{SEED['tps_change'][0]:+.0%}..{SEED['tps_change'][1]:+.0%} | {SEED['memory_change']:+.0%} |")
        lines.append("")
    # what a one-way link delay would add, from each algorithm's critical path (netem absent here)
    n_ar = 2 * L["layers"]  # all-reduces per forward pass
    p = doc.get("world_size", 4)
    hops = {"tree": 2, "star": 2, "ring": 2 * (p - 1)}
    d = doc["links"][0]["delay_ms"] if doc["links"] else 0.2
    lines += [f"Delay not emulated (no netem): a one-way delay of {d} ms would add, per forward pass "
              f"({n_ar} all-reduces), critical-path inter-host hops x delay: " +
              ", ".join(f"{a} {hops[a]} hops = +{hops[a] * n_ar * d:.0f} ms" for a in ("tree", "star", "ring")) +
              " (per generated token and to the TTFT alike).", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=8, help="generated tokens")
    ap.add_argument("--rates", default="1gbit,100mbit", help="link rates (tc syntax), comma-separated")
    ap.add_argument("--delay-ms", type=float, default=0.2, help="one-way link delay (applied only with netem)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--topology", default="2x2", help="HOSTSxRANKS per host (2x1: one rank per core here)")
    ap.add_argument("--coll-iters", type=int, default=20)
    ap.add_argument("--only", default="", help="configs to run, e.g. tree,star+stream (default all)")
    ap.add_argument("--no-netns", action="store_true", help="loopback only, no emulated hosts")
    ap.add_argument("--model-dir", default="build/bench-models")
    ap.add_argument("--raw-dir", default="build/bench-tp-raw", help="per-rank reports (not committed)")
    ap.add_argument("-o", "--out", default=None, help="default bench/results/<date>-<machine>/tp")
    ap.add_argument("--report-only", action="store_true", help="rewrite README.md from results.json")
    args = ap.parse_args()
    out = Path(args.out or f"bench/results/{date.today()}-{platform.node()}/tp")
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        (out / "README.md").write_text(report(json.loads((out / "results.json").read_text())))
        return 0
    model = make_model(args)
    doc = run_all(args, model, out)
    doc["command"] = " ".join(sys.argv)
    doc["git"] = git_commit(short=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    keys = ["rate", "algorithm", "stream", "rep", "ttft_s", "tokens_per_s", "held_peak_bytes", "rss_anon_peak_bytes",
            "model_peak_sampled_bytes", "inter_msgs", "inter_bytes", "wire_tx_bytes", "allreduce_s_rank0",
            "stream_load_s_rank0", "stream_wait_s_rank0", "load_s_rank0", "wall_s"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(doc["runs"])
    (out / "README.md").write_text(report(doc))
    print((out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
