"""An rpc-server that dies (SIGKILL) or hangs (SIGSTOP) while a model uses it: the caller gets
RpcServerError naming the server within a bounded time (patch 0007 + the rpc timeout), never an
abort, and the process stays usable: a new model on a new server generates what the same
placement generated before the fault, and a CPU-only model still runs.

Each case kills or stops a real llama.cpp rpc-server at one moment: during the load (from the
load's progress callback, with half the weights sent), before a prefill, or between decode
steps of a streamed generation. A watchdog ends the pytest process if anything hangs."""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oallama import Llama, RpcServerError
from oallama.runtime import devices, rpc

TIMEOUT_S = 2.0  # rpc timeout of these tests (s)
BOUND_S = 8 * TIMEOUT_S  # a failure must surface within this (s): a few timed-out messages at most
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
N_GEN = 8

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    """A hang is a failure, not a stuck CI: dump every thread's stack and exit after 120 s."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def rpc_timeout() -> Iterator[None]:
    devices.set_rpc_timeout(TIMEOUT_S)
    yield
    devices.set_rpc_timeout(devices.RPC_TIMEOUT_S)


def _placement(server: rpc.RpcServer) -> dict[str, str]:
    # weights of three layers on the server, the rest on the CPU: every pass crosses it twice
    return {f"blk.{i}.{w}.weight": server.device_name
            for i in (1, 2) for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}


def _load(model: Path, server: rpc.RpcServer, **kw: object) -> Llama:
    return Llama(str(model), devices=["CPU", server.device_name], placement=_placement(server), n_ctx=256,
                 verbose=False, seed=1, **kw)


def _generate(llm: Llama) -> str:
    return llm.create_completion(PROMPT, max_tokens=N_GEN, temperature=0.0)["choices"][0]["text"]


def _hit(server: rpc.RpcServer, how: str) -> None:
    os.kill(server.pid, SIGNALS[how])
    deadline = time.monotonic() + 10
    while how == "kill" and server.alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # gone before the caller goes on


def _end(server: rpc.RpcServer) -> None:
    if server.alive():  # a stopped server ignores the context manager's SIGTERM
        os.kill(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(tiny_q8: Path) -> str:
    """What the placement generates on a healthy server."""
    with rpc.start_server(threads=1) as server:
        llm = _load(tiny_q8, server)
        try:
            return _generate(llm)
        finally:
            llm.close()


def _still_usable(model: Path, reference: str) -> None:
    """A new model on a new server generates the reference; a CPU-only model runs."""
    with rpc.start_server(threads=1) as server:
        llm = _load(model, server)
        try:
            assert _generate(llm) == reference
        finally:
            llm.close()
    cpu = Llama(str(model), n_ctx=256, verbose=False)
    try:
        assert _generate(cpu)
    finally:
        cpu.close()


def _expect_rpc_error(server: rpc.RpcServer, fn: object, start: float) -> RpcServerError:
    with pytest.raises(RpcServerError) as ei:
        fn()  # type: ignore[operator]
    elapsed = time.monotonic() - start
    assert server.endpoint in str(ei.value)
    assert elapsed < BOUND_S, f"the failure took {elapsed:.1f} s to surface (bound {BOUND_S} s)"
    return ei.value


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_server_lost_during_load_is_rpc_error(tiny_q8: Path, reference: str, how: str) -> None:
    with rpc.start_server(threads=1) as server:
        t0: list[float] = []

        def progress(p: float) -> None:
            if p >= 0.5 and not t0:  # half the weights are on their way: lose the server now
                _hit(server, how)
                t0.append(time.monotonic())

        try:
            err = _expect_rpc_error(server, lambda: _load(tiny_q8, server, load_progress=progress),
                                    time.monotonic())
            assert t0, "the load never reported half its progress"
            assert "loading" in str(err)
        finally:
            _end(server)
    assert not devices.failed_rpc_endpoints([server.endpoint])  # the refused load let go of it
    _still_usable(tiny_q8, reference)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_server_lost_before_prefill_is_rpc_error(tiny_q8: Path, reference: str, how: str) -> None:
    with rpc.start_server(threads=1) as server:
        llm = _load(tiny_q8, server)
        try:
            _hit(server, how)
            err = _expect_rpc_error(server, lambda: llm.eval(llm.tokenize(PROMPT.encode())), time.monotonic())
            assert "decoding" in str(err)
            # the model stays failed, and says so again, instead of computing on a missing server
            with pytest.raises(RpcServerError, match=server.endpoint):
                llm.eval(llm.tokenize(b"again"))
            # another load on the failed connection is refused before it probes or allocates anything
            with pytest.raises(RpcServerError, match="close that model first"):
                _load(tiny_q8, server)
        finally:
            llm.close()
            _end(server)
    _still_usable(tiny_q8, reference)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_server_lost_between_decode_steps_is_rpc_error(tiny_q8: Path, reference: str, how: str) -> None:
    with rpc.start_server(threads=1) as server:
        llm = _load(tiny_q8, server)
        try:
            stream = llm.create_completion(PROMPT, max_tokens=N_GEN, temperature=0.0, stream=True)
            first = [next(stream)["choices"][0]["text"] for _ in range(2)]  # prefill + one decode step
            assert "".join(first) and reference.startswith("".join(first))
            _hit(server, how)
            _expect_rpc_error(server, lambda: list(stream), time.monotonic())
        finally:
            llm.close()
            _end(server)
    _still_usable(tiny_q8, reference)


def test_rpc_timeout_option_is_checked(tiny_q8: Path) -> None:
    with pytest.raises(RpcServerError, match="rpc_timeout=-1"):
        Llama(str(tiny_q8), rpc_timeout=-1, verbose=False)


def test_load_progress_false_cancels_the_load(tiny_q8: Path) -> None:
    seen: list[float] = []

    def progress(p: float) -> bool:
        seen.append(p)
        return p < 0.5

    from oallama.errors import ModelFileError

    with pytest.raises(ModelFileError, match="cancelled"):
        Llama(str(tiny_q8), n_ctx=256, verbose=False, load_progress=progress)
    assert seen and max(seen) >= 0.5


def test_a_closed_rpc_model_is_freed(tiny_q8: Path, rpc_server: rpc.RpcServer) -> None:
    # the decode check hangs on llama_cpp's context, not on the Llama: a cycle through oallama's
    # native handles (invisible to the GC) kept every closed Llama and its buffers alive (the soak's
    # loads phase grew 0.7 MiB per load)
    import gc
    import weakref

    llm = _load(tiny_q8, rpc_server)
    assert _generate(llm)
    ref = weakref.ref(llm)
    llm.close()
    del llm
    gc.collect()
    assert ref() is None
