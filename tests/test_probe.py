"""The probe: our ggml-rpc client computes what numpy computes, measures a loopback link and
device, writes a devices file the planner reads, and names an unreachable or busy server."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from oallama import RpcServerError
from oallama import cluster as D
from oallama.cluster import probe as P
from oallama.runtime import rpc

FAST = P.ProbeOptions(payload_bytes=2**16, samples=3, rtt_samples=5, warmup=1, matmul_k=256, matmul_m=128,
                      tokens=(1, 8), compute_target_s=0.02, compute_repeats=1)


@pytest.fixture(scope="module")
def server() -> Iterator[rpc.RpcServer]:
    with rpc.start_server(threads=1) as s:
        yield s


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RPC_HEADER = Path(__file__).resolve().parents[1] / "third_party/llama.cpp/src/ggml/include/ggml-rpc.h"


def _header_version() -> tuple[int, ...]:
    """RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION of the ggml-rpc.h the rpc-server was built from."""
    if not RPC_HEADER.exists():
        pytest.skip(f"{RPC_HEADER} is not here (upstream source not fetched)")
    text = RPC_HEADER.read_text()
    found = [re.search(rf"#define RPC_PROTO_{part}_VERSION\s+(\d+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    assert all(found), RPC_HEADER
    return tuple(int(m[1]) for m in found if m)


def test_hello_memory_and_device_count(server: rpc.RpcServer) -> None:
    with P.RpcClient(server.endpoint) as c:
        assert len(c.version) == 3 and c.version[0] == P.RPC_PROTO_MAJOR
        assert c.device_count() == 1  # rpc-server started without --device serves one device
        free, total = c.device_memory()
        assert 0 < free <= total


def test_hello_answers_the_protocol_of_ggml_rpc_h(server: rpc.RpcServer) -> None:
    """The version in the server's HELLO answer and the probe's own constant, against ggml's header
    (the client refuses another major by itself, so comparing with its constant alone proves nothing)."""
    want = _header_version()
    assert want[0] == P.RPC_PROTO_MAJOR
    with P.RpcClient(server.endpoint) as c:
        assert c.version == want


def test_matmul_over_the_wire_is_the_matmul(server: rpc.RpcServer) -> None:
    """The compute probe times a real product: its result equals numpy's (q8_0 activations
    round to ~1%)."""
    with P.RpcClient(server.endpoint) as c:
        run = P.MatmulRun(c, 0, 512, 96, 7)
        try:
            for n in (1, 7):
                y, _ = run.run(n)
                got = run.result(y)
                want = run.x_data[:n] @ run.dense.T
                assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
        finally:
            run.close()


def test_set_and_get_round_trip(server: rpc.RpcServer) -> None:
    with P.RpcClient(server.endpoint) as c:
        buf = c.alloc(4096)
        t = P.bytes_tensor(c.new_id(), buf, 128, 1000)
        data = bytes(range(256)) * 4
        c.set(t, data[:1000])
        assert c.get(t, 1000) == data[:1000]
        assert c.get(t, 10, offset=5) == data[5:15]
        c.free(buf)


def test_link_measurement_on_loopback(server: rpc.RpcServer) -> None:
    with P.RpcClient(server.endpoint) as c:
        link = P.measure_link(c, FAST)
    assert link["rtt_s"] > 0 and link["latency_s"] == pytest.approx(link["rtt_s"] / 2)
    assert link["bandwidth_up_Bps"] > 0 and link["bandwidth_down_Bps"] > 0
    assert link["jitter_s"] >= 0 and len(link["samples"]["up_s"]) == FAST.samples
    if sys.platform == "linux":
        sample = link["loss_sample"]
        assert sample["segments_sent"] > 0 and 0 <= link["loss"] <= 1
        # counted over the paced payloads only, at half the up goodput
        assert sample["paced_Bps"] == pytest.approx(link["bandwidth_up_Bps"] / 2)


@pytest.mark.skipif(sys.platform != "linux", reason="SO_MAX_PACING_RATE is Linux's")
def test_a_paced_connection_has_its_cap_while_inside(server: rpc.RpcServer) -> None:
    """The loss sample's cap is the kernel's (its effect, no loss counted on clean links under CUBIC,
    is in bench/results/2026-11-24-vm-distributed), set on entering and lifted on leaving."""
    def cap(c: P.RpcClient) -> int:
        return struct.unpack("I", c.sock.getsockopt(socket.SOL_SOCKET, P.SO_MAX_PACING_RATE, 4))[0]

    with P.RpcClient(server.endpoint) as c:
        unpaced = cap(c)
        with c.paced(4 * 2**20) as paced:
            assert paced and cap(c) == 4 * 2**20
        assert cap(c) == unpaced == 2**32 - 1  # no cap


def test_a_round_trip_measured_slow_does_not_inflate_the_computes(server: rpc.RpcServer) -> None:
    """The round trip subtracted from a sample was measured in a slow moment (at least 1 ms and 10x
    the one just measured; loopback's is ~60 us): two computes then measure "negative", and the
    extrapolation from that sample took the computes per sample to 240,000 (seconds each; 95 s for
    a probe that takes 5). Each sample stays near the target (0.1 s), here bounded at 10x it."""
    opts = replace(FAST, compute_target_s=0.1)
    with P.RpcClient(server.endpoint) as c:
        link = P.measure_link(c, opts)
        slow = max(1e-3, 10 * link["rtt_s"])
        out = P.measure_compute(c, opts, {**link, "rtt_s": slow, "rtt_jitter_s": 0.0})
    for n in map(str, opts.tokens):
        computes, fastest = out["matmul"]["computes"][n], min(out["matmul"]["seconds"][n])
        assert computes * fastest < 1.0, (n, computes, fastest)


def test_probe_writes_a_devices_file_the_planner_reads(server: rpc.RpcServer, tmp_path: Path) -> None:
    with rpc.start_server(threads=1) as second:
        doc = P.probe([second.endpoint, server.endpoint], FAST)
    assert [d["name"] for d in doc["devices"]] == [second.device_name, server.device_name]  # device 0 first
    columns = {str(n) for n in FAST.tokens}  # measured at each column count asked for
    for d in doc["devices"]:
        assert d["memory_free"] > 0 and set(d["flops"]) == columns and all(v > 0 for v in d["flops"].values())
    assert set(doc["client"]["flops"]) == columns
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(doc))
    cluster = D.read_devices(path)
    assert cluster.devices[0].name == second.device_name and cluster.client_flops[1] > 0


def test_unreachable_device_is_named() -> None:
    port = _closed_port()
    with pytest.raises(RpcServerError, match=rf"cannot reach rpc-server at 127\.0\.0\.1:{port}"):
        P.probe([f"127.0.0.1:{port}"], FAST, client=False)


def test_cli_unreachable_exits_2_naming_it(server: rpc.RpcServer) -> None:
    port = _closed_port()
    r = subprocess.run([sys.executable, "-m", "oallama", "probe", server.endpoint, f"127.0.0.1:{port}", "--no-client"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"cannot reach rpc-server at 127.0.0.1:{port}" in r.stderr


def test_cli_probe_shows_progress_and_writes(server: rpc.RpcServer, tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    r = subprocess.run([sys.executable, "-m", "oallama", "probe", server.endpoint, "-o", str(out), "--samples", "2",
                        "--rtt-samples", "3", "--payload-mib", "0.0625", "--matmul-size", "256", "--tokens", "1,4"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "[1/1]" in r.stderr and "rtt" in r.stderr and "GFLOP/s" in r.stderr
    assert D.read_devices(out).devices[0].name == server.device_name


def test_busy_server_is_reported_not_hung(server: rpc.RpcServer) -> None:
    """rpc-server serves one client at a time: a second client waits for HELLO forever."""
    host, port = server.host, server.port
    with socket.create_connection((host, port), timeout=5) as first:
        first.sendall(struct.pack("<BQ", P.CMD_HELLO, P.CONN_CAPS_SIZE) + bytes(P.CONN_CAPS_SIZE))
        size = struct.unpack("<Q", first.recv(8, socket.MSG_WAITALL))[0]
        first.recv(size, socket.MSG_WAITALL)
        with pytest.raises(RpcServerError, match="serves one client at a time"):
            P.RpcClient(server.endpoint, timeout=1.0)
    with P.RpcClient(server.endpoint) as c:  # free again once the first client left
        assert c.device_count() == 1


def test_tcp_counters_parse() -> None:
    if not hasattr(socket, "TCP_INFO"):
        pytest.skip("no TCP_INFO on this platform")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()) as c:
            peer, _ = srv.accept()
            with peer:
                c.sendall(b"x" * 100_000)
                peer.recv(100_000, socket.MSG_WAITALL)
                got = P.TcpCounters.read(c)
    assert got is not None and got.data_segs_out >= 1 and got.total_retrans == 0 and got.rtt_us >= 0
