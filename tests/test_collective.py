"""oallama.collective: tree / ring / star all-reduce across processes (gloo on loopback), the
shared-memory intra-host stage, message counters checked against the TCP traffic the kernel
counted on the ranks' sockets, process-group teardown, and the same over emulated hosts (network
namespaces) where this machine allows them. Tests that make process groups need torch and skip
without it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from oallama import collective as C
from oallama.collective import wire
from oallama.errors import CollectiveError

ROOT = Path(__file__).resolve().parents[1]
TOPO_2X2 = C.Topology.uniform(2, 2)
OVERHEAD = wire.GLOO_MESSAGE_OVERHEAD  # TCP payload bytes gloo adds per message (3 preambles of 48 B)


@pytest.fixture
def needs_torch() -> None:
    pytest.importorskip("torch", reason="process groups need torch.distributed: pip install 'oallama[tp]'")


@pytest.fixture
def needs_ss(needs_torch: None) -> None:
    if not wire.ss_available():
        pytest.skip("`ss` (iproute2) is not installed: the sockets' counters cannot be read")


def netns_hosts():
    spec = importlib.util.spec_from_file_location("netns_hosts", ROOT / "bench" / "scripts" / "netns_hosts.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["netns_hosts"] = mod
    spec.loader.exec_module(mod)
    return mod


def netns_skip_reason() -> str | None:
    """Why namespace tests cannot run here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    chk = netns_hosts().check()
    for key in ("ip_netns", "veth", "tc_tbf"):
        if chk.get(key) is not True:
            return f"{key} not permitted here: {chk.get(key)}"
    return None


# --------------------------------------------------------------------------------------------
# topology and the counting model
# --------------------------------------------------------------------------------------------


def test_topology() -> None:
    t = C.Topology.uniform(3, 2)
    assert t.host_of == (0, 0, 1, 1, 2, 2)
    assert t.world_size == 6 and t.n_hosts == 3
    assert t.local_masters == [0, 2, 4] and t.global_master == 0
    assert [t.local_rank(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert t.crosses(1, 2) and not t.crosses(2, 3)
    assert C.Topology.parse(str(t)) == t
    u = C.Topology((1, 0, 1, 0))  # ranks of a host need not be contiguous
    assert u.local_masters == [1, 0] and u.global_master == 0
    with pytest.raises(ValueError, match="host ids"):
        C.Topology((0, 2))
    with pytest.raises(ValueError):
        C.CollectiveOptions(algorithm="butterfly")


def test_expected_counts_2x2() -> None:
    n = 1000
    assert C.expected_counts("tree", TOPO_2X2, n) == {"inter_msgs": 2, "inter_bytes": 2 * n * 4}
    # gloo's ring, r -> r-1: edges 0->3 and 2->1 cross; 2p = 8 segments of n/8, each rank sends
    # 2 (p-1) S = 12 of them (S = 2 segments per rank)
    assert C.ring_sends(n, 4, 0) == [n // 8 * 4] * 12
    assert C.expected_counts("ring", TOPO_2X2, n) == {"inter_msgs": 24, "inter_bytes": 3 * n * 4}
    # one element: 8 segments of 4 bytes, only segment 0 holds data: ranks send 1 or 2 messages
    assert [C.ring_sends(1, 4, r) for r in range(4)] == [[4], [4], [4, 4], [4, 4]]
    # star: ranks 2 and 3 send n to rank 0 and get n back
    assert C.expected_counts("star", TOPO_2X2, n) == {"inter_msgs": 4, "inter_bytes": 4 * n * 4}
    # the tree sends hosts-1 messages each way whatever the ranks per host
    t = C.Topology.uniform(4, 8)
    assert C.expected_counts("tree", t, n)["inter_msgs"] == 6
    assert C.expected_counts("star", t, n)["inter_msgs"] == 2 * 24


# --------------------------------------------------------------------------------------------
# the shared-memory stage (threads of one process map the segment like ranks do)
# --------------------------------------------------------------------------------------------

native = pytest.mark.skipif(not C.native_available(), reason="oallama._collective not built (bash scripts/setup.sh)")


@native
def test_shm_group_reduce_threads() -> None:
    from oallama import _collective

    L, n = 3, 5000
    name = f"/oallama-test-{os.getpid()}"
    results: list[np.ndarray | None] = [None] * L
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            g = _collective.ShmGroup(name, r, L, n * 4, 10.0)
            for it in range(3):
                x = np.full(n, r + 1 + it, np.float32)
                g.reduce(x)
                g.barrier()
                out = np.empty(n, np.float32)
                g.read(out)
                results[r] = out
                assert np.all(out == sum(q + 1 + it for q in range(L))), (r, it, out[:3])
            g.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(L)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert not Path("/dev/shm" + name).exists()  # unlinked once everyone attached


@native
def test_shm_group_peer_missing_times_out() -> None:
    from oallama import _collective

    name = f"/oallama-test-lonely-{os.getpid()}"
    with pytest.raises(RuntimeError, match="timed out"):
        _collective.ShmGroup(name, 0, 2, 4096, 0.3)
    assert not Path("/dev/shm" + name).exists()  # the creator removed its segment
    with pytest.raises(ValueError, match="shm name"):
        _collective.ShmGroup("no-slash", 0, 1, 4096, 1.0)


# --------------------------------------------------------------------------------------------
# across processes: gloo on loopback
# --------------------------------------------------------------------------------------------


def _job_totals(reports: list[dict], alg: str) -> C.Counters:
    tot = C.Counters()
    for r in reports:
        tot.add(C.Counters(**r["algorithms"][alg]["one_call"]))
    return tot


def _wire(reports: list[dict], alg: str) -> dict[int, dict]:
    """Rank 0's observation: {n: totals per call} (bytes are TCP payload, gloo headers included)."""
    out = {}
    for n, o in reports[0]["algorithms"][alg]["wire"].items():
        assert o["inter_bytes"] % o["calls"] == 0 and o["intra_bytes"] % o["calls"] == 0, o  # every call alike
        out[int(n)] = {k: o[k] // o["calls"] for k in ("inter_bytes", "intra_bytes")}
    return out


WIRE_SIZES = (1, 1024, 4096)  # 1: most ring segments empty; 1024, 4096: every segment full


@pytest.mark.usefixtures("needs_ss")
@pytest.mark.parametrize("topo", [TOPO_2X2, C.Topology((0, 0, 1, 2))], ids=["2x2", "hosts-2-1-1"])
def test_all_reduce_counts_match_the_wire(topo: C.Topology, tmp_path: Path) -> None:
    """Correctness of every algorithm, and its message and byte counts against the TCP payload the
    kernel counted on the ranks' sockets (`ss`) during 3 all-reduces of each size.

    Tolerance: none beyond gloo's own protocol, 144 bytes per message (wire.GLOO_MESSAGE_OVERHEAD:
    three 48-byte preambles); TCP/IP headers, ACKs and handshakes are not payload, and the ranks
    meet through the store, not over the measured connections."""
    n = WIRE_SIZES[-1]
    reports = C.selftest(topo, tmp_path, check_sizes="1,1000,70000", count_n=n, timeout_s=60,
                         wire_sizes=",".join(map(str, WIRE_SIZES)), wire_calls=3)
    assert {k for r in reports for k in r["algorithms"]} == set(C.ALGORITHMS)
    for alg in C.ALGORITHMS:
        for r in reports:
            res = r["algorithms"][alg]
            assert res["max_err"] < 1e-4, (alg, r["rank"], res)
            assert res["max_err_reduce_bcast"] < 1e-4, (alg, r["rank"], res)
            assert res["gather_ok"]
        seen = _wire(reports, alg)
        # observed: wire(n) = payload/element * n + OVERHEAD * messages; two sizes give both
        a, b = WIRE_SIZES[1:]
        per_elem = Fraction(seen[b]["inter_bytes"] - seen[a]["inter_bytes"], b - a)
        msgs = (seen[a]["inter_bytes"] - per_elem * a) / OVERHEAD
        want = {m: C.expected_counts(alg, topo, m) for m in WIRE_SIZES}
        assert (msgs, per_elem * b) == (want[b]["inter_msgs"], want[b]["inter_bytes"]), (alg, seen)
        assert want[a]["inter_msgs"] == want[b]["inter_msgs"]
        for m in WIRE_SIZES:  # each size on its own, n = 1 included (gloo's empty ring segments)
            assert seen[m]["inter_bytes"] == want[m]["inter_bytes"] + OVERHEAD * want[m]["inter_msgs"], (alg, m)
        # each rank's own counters (sends made here; the ring's from gloo's schedule), job totals
        tot = _job_totals(reports, alg)
        assert tot.allreduce_calls == topo.world_size
        assert (tot.inter_msgs, tot.inter_bytes) == (msgs, per_elem * n), alg
        assert seen[n]["intra_bytes"] == tot.intra_bytes + OVERHEAD * tot.intra_msgs, alg
    tree = _job_totals(reports, "tree")
    if C.native_available():
        assert reports[0]["algorithms"]["tree"]["intra"] == "shm"
        assert _wire(reports, "tree")[n]["intra_bytes"] == 0  # the host stage never touched a socket
        # every rank that shares its host goes through the segment; a rank alone on its host skips it
        sharing = sum(1 for r in range(topo.world_size) if len(topo.ranks_on(topo.host_of[r])) > 1)
        assert tree.intra_msgs == 0 and tree.shm_bytes == sharing * n * 4
    if topo == TOPO_2X2:  # fewest inter-host bytes on the wire: tree < ring < star
        on_wire = [_wire(reports, alg)[n]["inter_bytes"] for alg in ("tree", "ring", "star")]
        assert on_wire == sorted(on_wire) and len(set(on_wire)) == 3


@pytest.mark.usefixtures("needs_torch")
def test_ranks_leave_no_gloo_thread_behind(tmp_path: Path) -> None:
    """After the worker's shutdown() no gloo or store thread is left in any rank: nothing of gloo
    can run (and free a tensor, which takes the GIL) while the interpreter finalizes, the cause of
    rank processes aborting with 'terminate called without an active exception'."""
    reports = C.selftest(TOPO_2X2, tmp_path, algorithms=["tree", "ring"], check_sizes="1000", count_n=64,
                         timeout_s=60)
    for r in reports:
        names = r["threads_after_shutdown"]
        assert names, "no /proc/self/task"
        left = [t for t in names if t.startswith(("pt_gloo", "gloo", "pt_tcpstore"))]
        assert not left, (r["rank"], names)


@native
@pytest.mark.usefixtures("needs_torch")
def test_tree_three_uneven_hosts_chunked_shm(tmp_path: Path) -> None:
    """3 hosts of 2, 1 and 1 ranks; a 1 KiB segment slot makes every call go in chunks."""
    topo = C.Topology((0, 0, 1, 2))
    n = 3000
    reports = C.selftest(topo, tmp_path, algorithms=["tree"], check_sizes="1,999,5000", count_n=n,
                         slot_bytes=1024, timeout_s=60)
    for r in reports:
        assert r["algorithms"]["tree"]["max_err"] < 1e-4
        assert r["algorithms"]["tree"]["max_err_reduce_bcast"] < 1e-4
    tot = _job_totals(reports, "tree")
    chunks = -(-n // 256)
    assert tot.inter_msgs == 2 * (3 - 1) * chunks  # hosts-1 each way, per chunk
    assert tot.inter_bytes == C.expected_counts("tree", topo, n)["inter_bytes"]


@pytest.mark.usefixtures("needs_ss")
def test_tree_pipelined_inter_host(tmp_path: Path) -> None:
    """pipeline_bytes: the inter-host stage in chunks (GM sends chunk k down while k+1 comes up);
    the chunks are separate messages on the wire."""
    n = 10000  # 40 000 bytes: 5 chunks of 8 KiB
    reports = C.selftest(TOPO_2X2, tmp_path, algorithms=["tree"], check_sizes="1,5000,20001", count_n=n,
                         pipeline_bytes=8192, timeout_s=60, wire_sizes=str(n), wire_calls=2)
    assert all(r["algorithms"]["tree"]["max_err"] < 1e-4 for r in reports)
    tot = _job_totals(reports, "tree")
    want = C.expected_counts("tree", TOPO_2X2, n, pipeline_bytes=8192)
    assert want["inter_msgs"] == 2 * 5
    assert (tot.inter_msgs, tot.inter_bytes) == (want["inter_msgs"], want["inter_bytes"])
    assert _wire(reports, "tree")[n]["inter_bytes"] == want["inter_bytes"] + OVERHEAD * want["inter_msgs"]


@pytest.mark.usefixtures("needs_ss")
def test_tree_intra_over_transport(tmp_path: Path) -> None:
    """Without the shared-memory module the host stage goes over gloo point-to-point."""
    reports = C.selftest(TOPO_2X2, tmp_path, algorithms=["tree"], intra="transport", count_n=100, timeout_s=60,
                         wire_sizes="100", wire_calls=2)
    tot = _job_totals(reports, "tree")
    assert reports[0]["algorithms"]["tree"]["intra"] == "transport"
    assert all(r["algorithms"]["tree"]["max_err"] < 1e-4 for r in reports)
    assert tot.inter_msgs == 2 and tot.intra_msgs == 4  # 1 up + 1 down per host
    assert tot.shm_bytes == 0
    seen = _wire(reports, "tree")[100]
    assert seen["intra_bytes"] == 4 * (100 * 4 + OVERHEAD)  # the 4 host-stage messages, on the wire
    assert seen["inter_bytes"] == 2 * (100 * 4 + OVERHEAD)


def test_launch_reports_failing_rank(tmp_path: Path) -> None:
    code = "import os, sys; r = int(os.environ['OALLAMA_RANK']); sys.stderr.write(f'rank {r} says no\\n'); sys.exit(r)"
    with pytest.raises(CollectiveError, match="rank 1 says no"):
        C.launch(lambda r: [sys.executable, "-c", code], C.Topology.uniform(1, 2), timeout_s=30)


def test_launch_times_out_and_kills(tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    code = f"import os, time; open({str(marker)!r} + os.environ['OALLAMA_RANK'], 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(CollectiveError, match="still running"):
        C.launch(lambda r: [sys.executable, "-c", code], C.Topology.uniform(1, 2), timeout_s=3)
    for r in range(2):
        pid = int((tmp_path / f"pids{r}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# --------------------------------------------------------------------------------------------
# emulated hosts: network namespaces with shaped links
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("needs_torch")
def test_netns_hosts_all_reduce(tmp_path: Path) -> None:
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    N = netns_hosts()
    n = 1 << 16  # 256 KiB per all-reduce
    with N.Hosts(2, N.LinkOptions(rate="1gbit", delay_ms=0.2)) as hosts:
        assert hosts.shaping
        before = hosts.counters()
        reports = C.selftest(TOPO_2X2, tmp_path, count_n=n, check_sizes="1000", timeout_s=90,
                             netns=hosts.namespaces, ifnames=hosts.ifnames, master_addr=hosts.addrs[0])
        after = hosts.counters()
        names = list(hosts.namespaces)
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listing for ns in names)  # torn down
    for alg in C.ALGORITHMS:
        assert all(r["algorithms"][alg]["max_err"] < 1e-4 for r in reports)
    # every inter-host payload byte crossed the veths (plus headers, the store and the checks)
    wire = sum(a["tx_bytes"] - b["tx_bytes"] for a, b in zip(after, before, strict=True))
    payload = sum(C.expected_counts(alg, TOPO_2X2, n)["inter_bytes"] for alg in C.ALGORITHMS)
    assert wire >= payload


# --------------------------------------------------------------------------------------------
# GPU: the CUDA IPC intra-host stage (runs only where a GPU and the kernels module exist)
# --------------------------------------------------------------------------------------------


def _cuda_ready() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device (none here)"
    if importlib.util.find_spec("oallama._collective_cuda") is None:
        return "oallama._collective_cuda not built (OALLAMA_KERNELS=ON bash scripts/setup.sh)"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_ready() is not None, reason=str(_cuda_ready()))
def test_tree_all_reduce_cuda_ipc(tmp_path: Path) -> None:
    code = (
        "import torch, numpy as np\n"
        "from oallama import collective as C\n"
        "c = C.init_from_env(C.CollectiveOptions(device='cuda'))\n"
        "t = torch.full((100003,), float(c.rank + 1), device='cuda')\n"
        "c.all_reduce_cuda(t)\n"
        "assert torch.all(t == 3.0), t[:4]\n"
        "c.close()\n"
    )
    C.launch(lambda r: [sys.executable, "-c", code], C.Topology.uniform(1, 2), timeout_s=120)
