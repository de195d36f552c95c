"""oallama.collective.launch: the processes of a collective job (seed 001). ``launch`` starts one
process per rank (optionally inside the network namespaces of emulated hosts, see
bench/scripts/netns_hosts.py); a worker self-tests and times the all-reduce algorithms and, on request,
observes what they sent over TCP (``selftest``; ``python -m oallama.collective.launch worker``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CollectiveError
from . import wire
from .allreduce import (
    ENV_HOSTS,
    ENV_JOB,
    ENV_RANK,
    Collective,
    CollectiveOptions,
    init_from_env,
    require_torch,
    shutdown,
)
from .topology import ALGORITHMS, Counters, Topology

__all__ = ["LaunchResult", "free_port", "launch", "selftest"]


@dataclass
class LaunchResult:
    returncodes: list[int]
    stderr: list[str]  # last 4000 characters per rank
    seconds: float
    job: str
    extra: dict[str, Any] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch(argv_for_rank: Callable[[int], list[str]], topo: Topology, *, timeout_s: float = 120.0,
           master_addr: str = "127.0.0.1", master_port: int | None = None,
           netns: Sequence[str] | None = None, ifnames: Sequence[str] | None = None,
           env: dict[str, str] | None = None, job: str | None = None) -> LaunchResult:
    """Run one process per rank and wait for all of them (at most timeout_s seconds).

    argv_for_rank(rank) is the command of that rank. With netns, rank r runs inside network
    namespace netns[host_of[r]] (`ip netns exec`), and gloo binds to ifnames[host]. On a failure
    or the timeout every rank still running is killed (only the processes started here), and
    CollectiveError carries each failing rank's stderr tail.
    """
    job = job or uuid.uuid4().hex[:12]
    port = master_port or (free_port() if netns is None else 29500 + int(uuid.uuid4().int % 20000))
    procs: list[subprocess.Popen[bytes]] = []
    errs: list[Any] = []
    t0 = time.perf_counter()
    try:
        for r in range(topo.world_size):
            h = topo.host_of[r]
            e = dict(os.environ)
            e.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "WORLD_SIZE": str(topo.world_size),
                      ENV_RANK: str(r), ENV_HOSTS: str(topo), ENV_JOB: job, "OMP_NUM_THREADS": "1",
                      "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
            if ifnames is not None:
                e["GLOO_SOCKET_IFNAME"] = ifnames[h]
            elif netns is None:
                e.setdefault("GLOO_SOCKET_IFNAME", "lo")
            if env:
                e.update(env)
            cmd = list(argv_for_rank(r))
            if netns is not None:
                cmd = ["ip", "netns", "exec", netns[h], *cmd]
            err = _tempfile()
            errs.append(err)
            procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise CollectiveError(f"job {job}: ranks still running after {timeout_s:.0f} s" +
                                      _tails(procs, errs))
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(0.5)  # let the others fail on their own (their stderr says more)
                if any(p.poll() is None for p in procs):
                    raise CollectiveError(f"job {job}: a rank failed" + _tails(procs, errs))
            time.sleep(0.02)
        codes = [int(p.returncode) for p in procs]
        if any(codes):
            raise CollectiveError(f"job {job}: exit codes {codes}" + _tails(procs, errs))
        return LaunchResult(codes, [_read_tail(e) for e in errs], time.perf_counter() - t0, job)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # the rank's own session: it and its children
                p.wait()
        for e in errs:
            e.close()


def _tempfile() -> Any:
    import tempfile

    return tempfile.TemporaryFile()


def _read_tail(f: Any, n: int = 4000) -> str:
    f.flush()
    f.seek(0)
    return f.read().decode(errors="replace")[-n:]


def _tails(procs: Sequence[subprocess.Popen[bytes]], errs: Sequence[Any]) -> str:
    out = []
    for r, (p, e) in enumerate(zip(procs, errs, strict=True)):
        code = p.poll()
        tail = _read_tail(e, 1500).strip()
        if code not in (0,) and tail:
            out.append(f"\n--- rank {r} (exit {code}) ---\n{tail}")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# worker: self-test and micro-benchmark of the algorithms (run by launch)
# --------------------------------------------------------------------------------------------


def _rank_input(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, rank]).standard_normal(n).astype(np.float32)


def _worker(args: argparse.Namespace) -> int:
    out = Path(args.out)
    results: dict[str, Any] = {"rank": int(os.environ[ENV_RANK]), "algorithms": {}}
    colls: dict[str, Collective] = {}
    for alg in args.algorithms.split(","):
        coll = init_from_env(CollectiveOptions(algorithm=alg, intra=args.intra, shm_slot_bytes=args.slot_bytes,
                                               timeout_s=args.timeout, pipeline_bytes=args.pipeline_bytes))
        colls[alg] = coll
        topo, rank = coll.topo, coll.rank
        res: dict[str, Any] = {"intra": coll.intra if alg == "tree" else "transport"}
        # correctness: all_reduce, reduce + broadcast, all_gather
        for n in [int(s) for s in args.check_sizes.split(",")]:
            want = sum(_rank_input(r, n, args.seed).astype(np.float64) for r in range(topo.world_size))
            x = _rank_input(rank, n, args.seed)
            coll.all_reduce(x)
            res.setdefault("max_err", 0.0)
            res["max_err"] = max(res["max_err"], float(np.max(np.abs(x - want), initial=0.0)))
            y = _rank_input(rank, n, args.seed)
            coll.reduce(y, root=0)
            coll.broadcast(y, root=0)
            res["max_err_reduce_bcast"] = max(res.get("max_err_reduce_bcast", 0.0),
                                              float(np.max(np.abs(y - want), initial=0.0)))
            g = coll.all_gather(np.full(3, rank, np.float32))
            res["gather_ok"] = bool(np.array_equal(g[:, 0], np.arange(topo.world_size)))
        # counters of exactly one all-reduce of n elements
        coll.counters = Counters()
        coll.all_reduce(np.ones(args.count_n, np.float32))
        res["one_call"] = coll.counters.to_dict()
        if args.wire_sizes:
            res["wire"] = _observe_wire(coll, [int(s) for s in args.wire_sizes.split(",")], args.wire_calls,
                                        f"{os.environ.get(ENV_JOB, 'job')}/{alg}")
        results["algorithms"][alg] = res
    # timing: the algorithms alternate call by call (rotated order), each call started together on
    # every rank (a barrier, not timed) and timed alone; seconds_per_call is the median call. Timing
    # one algorithm after another favoured whichever came last (warm connections, a quieter machine),
    # and a mean of a few calls was one scheduling hiccup away from doubling at small sizes.
    algs = list(colls)
    for n in [int(s) for s in args.sizes.split(",") if s]:
        x = np.ones(n, np.float32)
        calls: dict[str, list[float]] = {a: [] for a in algs}
        # warm-up, the same count on every rank: a fresh job's first small calls run slow for a while
        for a in algs:
            for _ in range(10 if x.nbytes <= 1 << 20 else 2):
                colls[a].all_reduce(x)
        before = {a: colls[a].counters.to_dict() for a in algs}
        for i in range(args.iters):
            for a in algs[i % len(algs):] + algs[:i % len(algs)]:
                colls[a].barrier()
                t0 = time.perf_counter()
                colls[a].all_reduce(x)
                calls[a].append(time.perf_counter() - t0)
        for a in algs:
            res = results["algorithms"][a]
            after = colls[a].counters.to_dict()
            res.setdefault("stage_seconds_per_call", {})[str(n)] = {
                k.removeprefix("stage_").removesuffix("_seconds"): (after[k] - before[a][k]) / max(args.iters, 1)
                for k in after if k.startswith("stage_")}
            res.setdefault("seconds_per_call", {})[str(n)] = float(np.median(calls[a]))
            res.setdefault("seconds_per_call_mean", {})[str(n)] = float(np.mean(calls[a]))
            res.setdefault("seconds_calls", {})[str(n)] = calls[a]
    for a in algs:
        results["algorithms"][a].setdefault("seconds_per_call", {})
        colls[a].barrier()
    for a in algs:
        colls[a].close()
    shutdown()  # every process group destroyed: gloo's threads are gone before the interpreter ends
    results["threads_after_shutdown"] = _thread_names()
    (out / f"rank{results['rank']}.json").write_text(json.dumps(results, indent=1))
    return 0


def _thread_names() -> list[str]:
    """Names of this process's threads (Linux: /proc/self/task/*/comm; [] elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for t in tasks:
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/self/task/{t}/comm").read_text().strip())
    return sorted(names)


def _observe_wire(coll: Collective, sizes: Sequence[int], calls: int, tag: str) -> dict[str, Any] | None:
    """Rank 0's report of the TCP payload the ranks sent each other during `calls` all-reduces of
    each size, read by `ss` between two snapshots (oallama.collective.wire); None on other ranks.

    The ranks meet before and after the measured calls through the rendezvous store, whose
    connections (to MASTER_PORT) are left out: a barrier over gloo would add its own messages.
    Every rank has finished its calls (so every message has been received) when rank 0 looks.
    """
    dist = coll._dist
    world = coll.topo.world_size
    pids: list[Any] = [None] * world
    dist.all_gather_object(pids, os.getpid())
    rank_of_pid = {int(pid): r for r, pid in enumerate(pids)}
    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], port, is_master=False,
                          timeout=timedelta(seconds=coll.options.timeout_s))

    def meet(key: str) -> list[wire.TcpSocket] | None:
        store.set(f"{key}/{coll.rank}", "1")
        if coll.rank != 0:
            store.wait([f"{key}/go"])
            return None
        store.wait([f"{key}/{r}" for r in range(world)])
        snap = wire.snapshot(rank_of_pid)
        store.set(f"{key}/go", "1")
        return snap

    report: dict[str, Any] = {}
    for n in sizes:
        x = np.ones(n, np.float32)
        coll.all_reduce(x)  # warm-up: every connection and buffer of this size exists before the window
        before = meet(f"oallama-wire/{tag}/{n}/before")
        for _ in range(calls):
            coll.all_reduce(x)
        after = meet(f"oallama-wire/{tag}/{n}/after")
        if before is not None and after is not None:
            flows = wire.traffic(before, after, rank_of_pid, exclude_ports=[port])
            report[str(n)] = {"calls": calls, **wire.inter_host(flows, coll.topo),
                              "flows": {f"{a}->{b}": [f.bytes, f.segments] for (a, b), f in sorted(flows.items())}}
    return report if coll.rank == 0 else None


def selftest(topo: Topology, out: Path, *, algorithms: Sequence[str] = ALGORITHMS, check_sizes: str = "1,1000",
             count_n: int = 1024, sizes: str = "", iters: int = 5, intra: str = "auto", timeout_s: float = 120.0,
             slot_bytes: int = 16 << 20, pipeline_bytes: int = 0, wire_sizes: str = "", wire_calls: int = 4,
             **launch_kw: Any) -> list[dict[str, Any]]:
    """Run the worker on every rank (see launch for launch_kw); returns each rank's report.

    wire_sizes ("4096,8192"): rank 0's report gets, per algorithm and size, the TCP payload the
    ranks sent each other during wire_calls all-reduces (``_observe_wire``; ranks on one network
    namespace, e.g. loopback, and `ss` installed)."""
    require_torch()
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "oallama.collective.launch", "worker", "--out", str(out),
            "--algorithms", ",".join(algorithms), "--check-sizes", check_sizes, "--count-n", str(count_n),
            "--sizes", sizes, "--iters", str(iters), "--intra", intra, "--timeout", str(timeout_s),
            "--slot-bytes", str(slot_bytes), "--pipeline-bytes", str(pipeline_bytes),
            "--wire-sizes", wire_sizes, "--wire-calls", str(wire_calls)]
    launch(lambda r: argv, topo, timeout_s=timeout_s + 60, **launch_kw)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(topo.world_size)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oallama.collective.launch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="one rank of a self-test (started by collective.launch)")
    w.add_argument("--out", required=True)
    w.add_argument("--algorithms", default=",".join(ALGORITHMS))
    w.add_argument("--check-sizes", default="1,1000")
    w.add_argument("--count-n", type=int, default=1024)
    w.add_argument("--sizes", default="")
    w.add_argument("--iters", type=int, default=5)
    w.add_argument("--intra", default="auto")
    w.add_argument("--slot-bytes", type=int, default=16 << 20)
    w.add_argument("--pipeline-bytes", type=int, default=CollectiveOptions.pipeline_bytes)
    w.add_argument("--wire-sizes", default="", help="observe the TCP traffic of all-reduces of these sizes")
    w.add_argument("--wire-calls", type=int, default=4, help="all-reduces per observed size")
    w.add_argument("--timeout", type=float, default=120.0)
    w.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    return _worker(args)


if __name__ == "__main__":
    sys.exit(main())
