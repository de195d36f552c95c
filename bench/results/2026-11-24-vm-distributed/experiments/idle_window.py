#!/usr/bin/env python3
"""TTFT and TCP congestion windows against the idle time before a request (issue 13).

Runs inside a scenario's client namespace:
    bench/scripts/netem_scenario.py run bench/scripts/scenarios/wan-far-big.json -- \
        .venv/bin/python bench/results/2026-11-24-vm-distributed/experiments/idle_window.py PLAN OUT.json
The congestion control is the kernel's default when the namespaces are made (run with
`sysctl -w net.ipv4.tcp_congestion_control=cubic` before, and set it back after, for CUBIC).
Loads PLAN (a plan file of bench_distributed.py), warms up, then for each idle time (alternated,
ROUNDS rounds) sleeps, reads every rpc connection's window on both ends (the client's socket by
TCP_INFO, the server's with `ss -tin` in its namespace) and times one request (32-token prompt,
16 generated, as the bench). Prints one JSON record per request.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import oallama  # noqa: F401
from oallama import cluster as D
from oallama.runtime.generate import timed_generate

IDLES = (0.05, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # s
ROUNDS = 3


def client_windows() -> dict[str, dict[str, int]]:
    """peer -> this process's send state of its TCP connection (struct tcp_info offsets)."""
    out: dict[str, dict[str, int]] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM:
                continue
            host, port = s.getpeername()[:2]
            peer = f"{host}:{port}"
            raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            rto, rtt, rttvar, ssthresh, cwnd = (
                struct.unpack_from("I", raw, o)[0] for o in (8, 68, 72, 76, 80)
            )
            cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
            out[peer] = {
                "cwnd": cwnd,
                "ssthresh": ssthresh,
                "rto_us": rto,
                "rtt_us": rtt,
                "rttvar_us": rttvar,
                "cc": cc,
            }
        except OSError:
            pass
        finally:
            s.close()
    return out


def server_windows(namespaces: list[str]) -> dict[str, dict[str, int]]:
    """namespace -> the rpc-server's send window toward the client (ss -tin)."""
    out = {}
    for ns in namespaces:
        txt = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-tin", "state", "established"], capture_output=True, text=True
        ).stdout
        m = re.search(r"cwnd:(\d+)", txt)
        t = re.search(r"ssthresh:(\d+)", txt)
        r = re.search(r"rto:([\d.]+)", txt)
        c = re.search(r"\s(bbr|cubic|reno)\s", txt)
        out[ns] = {
            "cwnd": int(m.group(1)) if m else -1,
            "ssthresh": int(t.group(1)) if t else -1,
            "rto_ms": float(r.group(1)) if r else -1.0,
            "cc": c.group(1) if c else "?",
        }
    return out


def main() -> int:
    plan, out = sys.argv[1], Path(sys.argv[2])
    doc = json.loads(Path(os.environ["OALLAMA_SCENARIO"]).read_text())
    ns = [doc["client_ns"][:-1] + f"d{k}" for k in range(len(doc["devices"]))]
    rng = np.random.default_rng(0)
    tokens = [1, *(int(t) for t in rng.integers(300, 3000, 31))]
    llm = D.load(plan, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
    recs = []
    try:
        timed_generate(llm, tokens, 4)
        for r in range(ROUNDS):
            order = IDLES if r % 2 == 0 else tuple(reversed(IDLES))
            for idle in order:
                before = {"client": client_windows(), "server": server_windows(ns)}
                time.sleep(idle)
                g = timed_generate(llm, tokens, 16)
                after = {"client": client_windows(), "server": server_windows(ns)}
                rec = {
                    "round": r,
                    "idle_s": idle,
                    "ttft_ms": g.ttft_s * 1e3,
                    "tpot_ms": g.tpot_s * 1e3,
                    "before": before,
                    "after": after,
                    "load": os.getloadavg()[0],
                }
                recs.append(rec)
                print(json.dumps({k: rec[k] for k in ("round", "idle_s", "ttft_ms", "tpot_ms")}), flush=True)
    finally:
        llm.close()
    out.write_text(json.dumps({"plan": plan, "scenario": doc, "records": recs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
