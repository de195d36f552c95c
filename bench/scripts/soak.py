#!/usr/bin/env python3
"""Soak: does a long-running oallama process keep its memory and file descriptors?

Three phases on a synthetic model split between the CPU and a loopback rpc-server (blocks 1-2 on
the server, so every pass crosses the connection twice), sampling this process's resident memory
(VmRSS), open file descriptors and threads, and the server's RSS and descriptors:

  generations  one load, --generations greedy completions of --tokens tokens
  loads        --loads times: load, one short completion, close
  faults       --faults times: a new rpc-server, load, complete, SIGKILL the server, the next
               completion must raise RpcServerError (patch 0007), close
  cpu-loads    --loads times: load on the CPU alone, one short completion, close (oallama.Llama)
  stock-loads  the same with a stock llama_cpp.Llama: the baseline growth of llama-cpp-python and
               the allocator, to tell oallama's from theirs

Growth per phase = median of the last 20% of its samples minus the median of the samples at
10-30% (the first 10% are warm-up: allocator arenas, graph caches, lazily loaded libraries). The
run passes if no phase grows RSS by more than --rss-tolerance MiB, and descriptors and threads
not at all. Writes soak.json, soak.csv, soak.png and a Markdown table to --out.

    python bench/scripts/soak.py [--generations 1000] [--loads 100] [--faults 20] [-o DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import oallama  # noqa: F401  (oallama's libraries before llama_cpp's)
from oallama import Llama, RpcServerError
from oallama.model import synthetic
from oallama.planner.cost.profile import _cpu_name, build_info
from oallama.runtime import devices, rpc
from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)

PROMPTS = ["The quick brown fox", "Once upon a time", "In the beginning", "A long time ago in a galaxy"]


def _proc_stats(pid: int | str = "self") -> dict[str, int]:
    """RSS (bytes), open descriptors and threads of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {k: v.split() for k, _, v in (line.partition(":") for line in status)}
    return {"rss": int(fields["VmRSS"][0]) * 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"][0])}


class Sampler:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def take(self, phase: str, step: int, server: rpc.RpcServer | None) -> None:
        row: dict[str, Any] = {"phase": phase, "step": step, "t_s": round(time.monotonic() - self.t0, 2)}
        row.update(_proc_stats())
        if server is not None and server.alive():
            s = _proc_stats(server.pid)
            row.update({"server_rss": s["rss"], "server_fds": s["fds"]})
        self.rows.append(row)


def _placement(server: rpc.RpcServer) -> dict[str, str]:
    return {f"blk.{i}.{w}.weight": server.device_name
            for i in (1, 2) for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}


def _load(model: Path, server: rpc.RpcServer) -> Llama:
    return Llama(str(model), devices=["CPU", server.device_name], placement=_placement(server), n_ctx=512,
                 n_threads=1, verbose=False, seed=1)


def _complete(llm: Llama, i: int, tokens: int) -> str:
    out = llm.create_completion(PROMPTS[i % len(PROMPTS)], max_tokens=tokens, temperature=0.0)
    return out["choices"][0]["text"]


def _every(n: int, k: int) -> int:
    return max(1, n // k)


def phase_generations(model: Path, n: int, tokens: int, s: Sampler, progress: Callable[[str], None]) -> None:
    with rpc.start_server(threads=1) as server:
        llm = _load(model, server)
        try:
            first = [_complete(llm, i, tokens) for i in range(len(PROMPTS))]
            for i in range(n):
                text = _complete(llm, i, tokens)
                if text != first[i % len(PROMPTS)]:
                    raise SystemExit(f"generation {i}: greedy output changed: {text!r} != {first[i % len(PROMPTS)]!r}")
                if i % _every(n, 50) == 0 or i == n - 1:
                    s.take("generations", i, server)
                    progress(f"generations {i + 1}/{n}")
        finally:
            llm.close()


def phase_loads(model: Path, n: int, s: Sampler, progress: Callable[[str], None]) -> None:
    with rpc.start_server(threads=1) as server:
        for i in range(n):
            llm = _load(model, server)
            try:
                _complete(llm, i, 4)
            finally:
                llm.close()
            if i % _every(n, 50) == 0 or i == n - 1:
                s.take("loads", i, server)
                progress(f"loads {i + 1}/{n}")


def phase_cpu_loads(model: Path, n: int, s: Sampler, progress: Callable[[str], None], stock: bool) -> None:
    import llama_cpp

    phase = "stock-loads" if stock else "cpu-loads"
    for i in range(n):
        cls = llama_cpp.Llama if stock else Llama
        llm = cls(str(model), n_ctx=512, n_threads=1, verbose=False, seed=1)
        try:
            _complete(llm, i, 4)
        finally:
            llm.close()
        if i % _every(n, 50) == 0 or i == n - 1:
            s.take(phase, i, None)
            progress(f"{phase} {i + 1}/{n}")


def phase_faults(model: Path, n: int, s: Sampler, progress: Callable[[str], None]) -> list[float]:
    """Seconds from the kill to RpcServerError, per cycle."""
    waits = []
    for i in range(n):
        with rpc.start_server(threads=1) as server:
            llm = _load(model, server)
            try:
                _complete(llm, i, 4)
                os.kill(server.pid, signal.SIGKILL)
                while server.alive():
                    time.sleep(0.005)
                t = time.monotonic()
                try:
                    _complete(llm, i, 4)
                except RpcServerError:
                    waits.append(time.monotonic() - t)
                else:
                    raise SystemExit(f"fault cycle {i}: no RpcServerError after the server was killed")
            finally:
                llm.close()
        s.take("faults", i, None)
        progress(f"faults {i + 1}/{n}")
    return waits


def growth(rows: list[dict[str, Any]], key: str) -> float | None:
    xs = [r[key] for r in rows if key in r]
    if len(xs) < 5:
        return None
    n = len(xs)
    base = xs[max(1, n // 10): max(2, (3 * n) // 10)]
    tail = xs[(4 * n) // 5:]
    return statistics.median(tail) - statistics.median(base)


def _plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(dict.fromkeys(r["phase"] for r in rows))
    fig, axes = plt.subplots(2, len(phases), figsize=(4.5 * len(phases), 6), squeeze=False)
    for j, ph in enumerate(phases):
        rs = [r for r in rows if r["phase"] == ph]
        steps = [r["step"] for r in rs]
        axes[0][j].plot(steps, [r["rss"] / 2**20 for r in rs], label="client")
        if any("server_rss" in r for r in rs):
            axes[0][j].plot([r["step"] for r in rs if "server_rss" in r],
                            [r["server_rss"] / 2**20 for r in rs if "server_rss" in r], label="rpc-server")
        axes[0][j].set_title(ph)
        axes[0][j].set_ylabel("RSS (MiB)")
        axes[0][j].legend()
        axes[1][j].plot(steps, [r["fds"] for r in rs], label="client fds")
        axes[1][j].plot(steps, [r["threads"] for r in rs], label="client threads")
        axes[1][j].set_xlabel("step")
        axes[1][j].legend()
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="GGUF to soak (default: a synthetic tiny q8_0 model)")
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=16, help="tokens per generation")
    ap.add_argument("--loads", type=int, default=100)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--rss-tolerance", type=float, default=16.0, help="MiB a phase's RSS may grow")
    ap.add_argument("-o", "--out", type=Path, default=Path(f"bench/results/{date.today()}-{platform.node()}-soak"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    devices.set_rpc_timeout(10.0)
    with tempfile.TemporaryDirectory(prefix="oallama-soak-") as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "tiny-q8_0.gguf"
            synthetic.write_model(model, preset="tiny", qtype="q8_0", progress=False)
        load_before = os.getloadavg()[0]
        s = Sampler()

        def progress(msg: str) -> None:
            print(f"\r[{time.monotonic() - s.t0:7.1f} s] {msg:<40}", end="", file=sys.stderr, flush=True)

        phase_generations(model, args.generations, args.tokens, s, progress)
        phase_loads(model, args.loads, s, progress)
        waits = phase_faults(model, args.faults, s, progress)
        phase_cpu_loads(model, args.loads, s, progress, stock=False)
        phase_cpu_loads(model, args.loads, s, progress, stock=True)
        print(file=sys.stderr)
    summary = []
    ok = True
    for ph in dict.fromkeys(r["phase"] for r in s.rows):
        rs = [r for r in s.rows if r["phase"] == ph]
        g = {k: growth(rs, k) for k in ("rss", "fds", "threads", "server_rss", "server_fds")}
        passed = ((g["rss"] or 0) <= args.rss_tolerance * 2**20 and (g["fds"] or 0) <= 0 and (g["threads"] or 0) <= 0)
        ok &= passed or ph == "stock-loads"  # the baseline is reported, not judged
        summary.append({"phase": ph, "samples": len(rs), "first_rss": rs[0]["rss"], "last_rss": rs[-1]["rss"],
                        "first_fds": rs[0]["fds"], "last_fds": rs[-1]["fds"], "growth": g, "passed": passed})
    doc = {"schema": "oallama.soak/1", "commit": git_commit(), "build": build_info(), "date": str(date.today()),
           "device": {"machine": platform.node(), "cpu": _cpu_name(), "cpu_count": os.cpu_count()},
           "settings": {"generations": args.generations, "tokens": args.tokens, "loads": args.loads,
                        "faults": args.faults, "rss_tolerance_mib": args.rss_tolerance, "rpc_timeout_s": 10.0,
                        "model": "synthetic tiny q8_0" if args.model is None else str(args.model),
                        "placement": "blocks 1-2 on a loopback rpc-server (1 thread), the rest on the CPU"},
           "load_avg": {"before": load_before, "after": os.getloadavg()[0]}, "wall_s": round(time.monotonic() - s.t0, 1),
           "fault_error_s": {"median": statistics.median(waits) if waits else None,
                             "max": max(waits) if waits else None},
           "summary": summary, "passed": ok, "samples": s.rows}
    (args.out / "soak.json").write_text(json.dumps(doc, indent=1))
    keys = list(dict.fromkeys(k for r in s.rows for k in r))
    with (args.out / "soak.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(s.rows)
    _plot(s.rows, args.out)
    mib = 2**20
    lines = ["| phase | samples | RSS first → last (MiB) | RSS growth (MiB) | fds first → last | fd growth | "
             "thread growth | server RSS growth (MiB) | server fd growth | passed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        g = r["growth"]

        def fmt(x: float | None, scale: float = 1.0) -> str:
            return "—" if x is None else f"{x / scale:+.1f}" if scale != 1.0 else f"{x:+.0f}"

        lines.append(f"| {r['phase']} | {r['samples']} | {r['first_rss'] / mib:.1f} → {r['last_rss'] / mib:.1f} | "
                     f"{fmt(g['rss'], mib)} | {r['first_fds']} → {r['last_fds']} | {fmt(g['fds'])} | "
                     f"{fmt(g['threads'])} | {fmt(g['server_rss'], mib)} | {fmt(g['server_fds'])} | "
                     f"{'yes' if r['passed'] else 'NO'} |")
    (args.out / "soak.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"commit {doc['commit'][:9]}; {doc['wall_s']} s; load average {load_before:.2f} -> "
          f"{doc['load_avg']['after']:.2f}; kill -> RpcServerError median "
          f"{doc['fault_error_s']['median'] or 0:.3f} s; {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
