"""Devices and rpc-servers: naming, registration, and the errors a user sees."""

from __future__ import annotations

import os
import signal
import time
import warnings

import pytest

from helpers import closed_port
from oallama import RpcServerError, UnknownDeviceError
from oallama.runtime import devices, rpc


def test_cpu_is_always_there() -> None:
    cpu = devices.resolve("CPU")
    assert cpu.kind == "cpu" and cpu.is_host and not cpu.is_accelerator
    assert "CPU" in [d.name for d in devices.list_devices()]


def test_unknown_device_lists_the_known_ones() -> None:
    with pytest.raises(UnknownDeviceError, match=r"unknown device 'NPU7'.*known devices: CPU"):
        devices.resolve("NPU7")


@pytest.mark.skipif(__import__("oallama._core")._core.have_cuda, reason="CUDA build")
def test_cuda_name_on_a_cpu_build_says_how_to_get_cuda() -> None:
    with pytest.raises(UnknownDeviceError, match=r"built without CUDA.*OALLAMA_CUDA=ON"):
        devices.resolve("CUDA0")


@pytest.mark.parametrize("endpoint", ["nocolon", "host:", ":50052", "host:99999", "host:port"])
def test_malformed_endpoint(endpoint: str) -> None:
    with pytest.raises(RpcServerError, match="not host:port"):
        devices.resolve(f"RPC[{endpoint}]")


def test_unreachable_rpc_server_is_named_not_aborted_on() -> None:
    port = closed_port()
    with pytest.raises(RpcServerError, match=rf"cannot reach rpc-server at 127\.0\.0\.1:{port}"):
        devices.resolve(f"RPC[127.0.0.1:{port}]")


def test_rpc_device_registers_once_and_reports_memory(rpc_server: rpc.RpcServer) -> None:
    dev = devices.resolve(rpc_server.device_name)
    again = devices.resolve(rpc_server.device_name)
    assert dev == again and dev.kind == "rpc" and dev.is_accelerator
    names = [d.name for d in devices.list_devices()]
    assert names.count(rpc_server.device_name) == 1
    mem = {d.name: d for d in devices.list_devices(query_rpc_memory=True)}[rpc_server.device_name]
    assert mem.memory_total > 0 and 0 < mem.memory_free <= mem.memory_total
    assert devices.default_accelerator() is not None


def test_server_binds_loopback_on_a_free_port() -> None:
    with rpc.start_server(threads=1) as server:
        assert server.host == "127.0.0.1" and server.alive()
        assert server.device_name == f"RPC[127.0.0.1:{server.port}]"
    assert not server.alive()


def test_other_address_warns() -> None:
    # 127.0.0.2 is still this machine, but not the loopback address oallama binds by default
    with pytest.warns(RuntimeWarning, match="no authentication"), rpc.start_server("127.0.0.2", threads=1) as s:
        assert s.alive()


def test_server_death_is_reported_with_its_log() -> None:
    server = rpc.start_server(threads=1)
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(RpcServerError, match=rf"rpc-server {server.endpoint} .* exited with code -9"):
        server.check()
    server.stop()


def test_taken_port_is_a_clear_error() -> None:
    with rpc.start_server(threads=1) as first, warnings.catch_warnings():
        with pytest.raises(RpcServerError, match=f"rpc-server 127.0.0.1:{first.port}"):
            rpc.start_server(port=first.port, threads=1, timeout=10)
        assert first.alive()


def test_a_gone_server_does_not_poison_default_loads(tiny_q8) -> None:
    # oallama keeps rpc-server devices out of ggml's global registry: llama.cpp's default device
    # selection (a stock llama_cpp.Llama here) must not see, and abort on, a server that went away
    import llama_cpp

    server = rpc.start_server(threads=1)
    devices.resolve(server.device_name)
    server.stop()
    llm = llama_cpp.Llama(str(tiny_q8), n_ctx=128, verbose=False)
    assert llm.tokenize(b"still fine")
    llm.close()


def test_memory_of_a_gone_server_is_not_fatal() -> None:
    # ggml-rpc aborts the process on a refused connection: asking a stopped server for its
    # memory must be caught before it reaches ggml
    server = rpc.start_server(threads=1)
    name = devices.resolve(server.device_name).name
    server.stop()
    gone = {d.name: d for d in devices.list_devices(query_rpc_memory=True)}[name]
    assert gone.memory_total == 0
    with pytest.raises(RpcServerError, match="cannot reach rpc-server"):
        devices.device_memory(name)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and two CPUs")
def test_a_pinned_local_server_runs_on_its_cpus_and_the_client_beside_it() -> None:
    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    with rpc.local_server_if(True, 1, cpus=(cpu,)) as srv:
        assert srv is not None
        tasks = os.listdir(f"/proc/{srv.pid}/task")
        assert all(os.sched_getaffinity(int(t)) == {cpu} for t in tasks)
        assert os.sched_getaffinity(0) == mine - {cpu}
        assert rpc.restricted_cpus(srv.pid) == str(cpu)
        srv.check()
    assert os.sched_getaffinity(0) == mine  # restored


@pytest.mark.parametrize(("cpus", "listed"), [({0}, "0"), ({0, 1, 2, 5}, "0-2,5"), ({3, 1, 7, 8}, "1,3,7-8")],
                         ids=lambda v: str(sorted(v)) if isinstance(v, set) else v)
def test_cpu_lists_read_as_linux_writes_them(cpus: set[int], listed: str) -> None:
    assert rpc.cpu_list(cpus) == listed


def test_cpus_a_server_or_client_cannot_have_are_named() -> None:
    mine = os.sched_getaffinity(0)
    with pytest.raises(RpcServerError, match="CPUs 4096: this process may use only"):
        rpc.start_server(threads=1, cpus=(4096,))
    with pytest.raises(RpcServerError, match="leaves the client none"):
        rpc.beside(tuple(mine))
    assert os.sched_getaffinity(0) == mine


@pytest.mark.parametrize("n_models", [4, 6])
def test_several_models_on_one_server_load_and_its_memory_reads_while_they_hold_it(tiny_q8, n_models: int) -> None:
    """An rpc-server serves one connection at a time and queues one more (`listen(fd, 1)`); every model
    of a process shares that one connection. A TCP probe while a model holds it waits in the queue,
    and the next one times out: confirmation by measurement loads several placements at once (the
    fourth of four failed: "cannot reach rpc-server ... timed out"). With models holding the server,
    loads and memory queries use the held connection and do not probe."""
    from oallama.runtime.llama import Llama

    with rpc.start_server(threads=1) as server:
        dev = server.device_name
        llms = []
        try:
            for _ in range(n_models):
                llms.append(Llama(str(tiny_q8), devices=["CPU", dev], placement={"output.weight": dev},
                                  n_ctx=64, verbose=False))
                free, total = devices.device_memory(dev)
                assert 0 < free <= total
            for llm in llms:
                assert llm.tensor_devices()["output.weight"] == dev
                llm.eval(llm.tokenize(b"Hello"))  # the held connection still serves each of them
        finally:
            for llm in llms:
                llm.close()
        # every model closed: the server answers probes again
        devices.probe_endpoint(server.endpoint, timeout=5.0)
