"""A second device without a second GPU: llama.cpp's rpc-server, started and watched from Python.

    >>> from oallama import rpc
    >>> with rpc.start_server() as server:          # 127.0.0.1, a free port
    ...     llm = Llama(path, devices=["CPU", server.device_name],
    ...                 placement={"blk.0.ffn_up.weight": server.device_name})

rpc-server has no authentication and executes whatever graph a client sends: oallama binds it
to loopback unless the caller names another address, and then warns.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import tempfile
import time
import warnings
import weakref
from collections.abc import Collection, Iterator
from pathlib import Path
from types import TracebackType

from .. import _libs
from ..errors import RpcServerError

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# s: the longest any one send/receive to an rpc-server may take before the server counts as hung
# (devices.set_rpc_timeout). A receive waits while the server computes a ubatch, so this must cover
# the slowest prefill step of the slowest server.
RPC_TIMEOUT_S = 300.0
_live: weakref.WeakSet[RpcServer] = weakref.WeakSet()


def listening_pid(host: str, port: int) -> int | None:
    """pid of the process on this machine listening on host:port (None: not local, or unknown)."""
    if host not in _LOOPBACK:
        return None
    try:
        import psutil

        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    except (ImportError, OSError, RuntimeError):
        return None
    return None


def server_threads(host: str, port: int) -> int | None:
    """CPU threads of the local rpc-server on host:port, from its command line (`-t N`); None
    when it is not local, not readable, or runs with rpc-server's default."""
    pid = listening_pid(host, port)
    if pid is None:
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for flag, value in itertools.pairwise(args):
        if flag in (b"-t", b"--threads") and value.isdigit():
            return int(value)
    return None


def cpu_list(cpus: Collection[int]) -> str:
    """CPUs as Linux lists them: {0, 1, 2, 5} -> "0-2,5"."""
    runs = []
    for _, run in itertools.groupby(enumerate(sorted(cpus)), key=lambda ic: ic[1] - ic[0]):
        seq = [c for _, c in run]
        runs.append(str(seq[0]) if len(seq) == 1 else f"{seq[0]}-{seq[-1]}")
    return ",".join(runs)


def restricted_cpus(pid: int = 0) -> str | None:
    """The CPUs a process (0: this one) may run on (cpu_list), where that is fewer than the
    machine's; None when unrestricted or unknown. Where a client and a loopback rpc-server run
    decides what a visit of the server costs: on the project's 2-core VM a tiny model's decode
    with 12 splits took 0.77-0.95 ms with both on one CPU and a median 1.2-1.5 ms (p90 up to
    3.7) where the kernel placed them (bench/results/2026-11-25-vm-tiny-visits)."""
    try:
        allowed = os.sched_getaffinity(pid)
    except (OSError, AttributeError):
        return None
    return cpu_list(allowed) if len(allowed) < (os.cpu_count() or 0) else None


def bytes_acked(port: int) -> int:
    """Bytes this process has sent on its one TCP connection to `port` (an rpc-server it uses)
    that the peer acknowledged: the kernel's tcp_info.tcpi_bytes_acked (a u64 at offset 120,
    Linux 4.1+). What a pass really copied to the server, to check the cost model's copies."""
    import struct

    import psutil

    conns = [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]
    if len(conns) != 1:
        raise RpcServerError(f"expected one connection of this process to port {port}, found {len(conns)}")
    s = socket.socket(fileno=os.dup(conns[0].fd))
    try:
        return int(struct.unpack_from("Q", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), 120)[0])
    finally:
        s.close()


def _free_port(host: str, port: int = 0) -> int:
    """A port nothing listens on at `host` (port=0: any); RpcServerError if `port` is taken.

    Checked before launching because a readiness probe cannot tell our server from another
    process already listening on the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise RpcServerError(f"rpc-server {host}:{port}: cannot bind: {e.strerror or e}") from None
        return int(s.getsockname()[1])


class RpcServer:
    """A running rpc-server process. Use `.device_name` in `devices=` and placements."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, log: Path) -> None:
        self._proc = proc
        self.host = host
        self.port = port
        self._log = log
        _live.add(self)

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def device_name(self) -> str:
        """oallama's name of the server's first device."""
        return f"RPC[{self.endpoint}]"

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def log_tail(self, n_bytes: int = 2000) -> str:
        try:
            return self._log.read_bytes()[-n_bytes:].decode(errors="replace").strip()
        except OSError:
            return ""

    def check(self) -> None:
        """Raise RpcServerError if the server process has exited."""
        rc = self._proc.poll()
        if rc is not None:
            raise RpcServerError(
                f"rpc-server {self.endpoint} (pid {self.pid}) exited with code {rc}; its log ends:\n"
                f"{self.log_tail()}"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `timeout` s); idempotent."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        with contextlib.suppress(OSError):
            self._log.unlink()
        _live.discard(self)

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited {self._proc.returncode}"
        return f"RpcServer({self.endpoint}, pid={self.pid}, {state})"


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop(timeout=1.0)


@contextlib.contextmanager
def pinned(cpus: Collection[int] | None) -> Iterator[None]:
    """The calling thread, and the threads and processes it starts, on `cpus` while inside (None:
    as it is); RpcServerError naming them where this process may not use them all."""
    if not cpus:
        yield
        return
    old = os.sched_getaffinity(0)
    if not set(cpus) <= old:
        raise RpcServerError(f"CPUs {cpu_list(cpus)}: this process may use only {cpu_list(old)}")
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def beside(cpus: Collection[int] | None) -> contextlib.AbstractContextManager[None]:
    """This process on the CPUs it may use other than `cpus` (a local rpc-server's) while inside:
    the server a device of its own, as a remote one is. RpcServerError where none would be left."""
    if not cpus:
        return contextlib.nullcontext()
    rest = os.sched_getaffinity(0) - set(cpus)
    if not rest:
        raise RpcServerError(f"rpc-server on CPUs {cpu_list(cpus)} leaves the client none")
    return pinned(rest)


def start_server(host: str = "127.0.0.1", port: int | None = None, *, threads: int | None = None,
                 devices: list[str] | None = None, cache: bool = False,
                 timeout: float = 30.0, cpus: Collection[int] | None = None) -> RpcServer:
    """Start oallama's rpc-server and wait until it accepts connections.

    host: address to bind; loopback by default. Any other address exposes an unauthenticated
        service that runs arbitrary compute graphs, so it is allowed but warned about.
    port: None picks a free port.
    threads: CPU threads of the server's CPU device (rpc-server's default when None).
    devices: the server's devices (ggml names, e.g. ["CUDA0"]); None = rpc-server's default.
    cache: let the server cache large tensors on disk (rpc-server -c).
    timeout: seconds to wait for the server to accept connections.
    cpus: the CPUs the server runs on (None: wherever the kernel puts it); see `beside`.
    """
    if host not in _LOOPBACK:
        warnings.warn(
            f"starting rpc-server on {host}: it has no authentication and runs any graph a client "
            "sends; never expose it beyond a trusted network",
            RuntimeWarning,
            stacklevel=2,
        )
    binary = _libs.tool_path("rpc-server")
    attempts = 3 if port is None else 1
    last_error: RpcServerError | None = None
    for _ in range(attempts):
        p = _free_port(host, port or 0)
        cmd = [str(binary), "-H", host, "-p", str(p)]
        if threads is not None:
            cmd += ["-t", str(threads)]
        if devices:
            cmd += ["-d", ",".join(devices)]
        if cache:
            cmd.append("-c")
        fd, log_name = tempfile.mkstemp(prefix=f"oallama-rpc-{p}-", suffix=".log")
        # own process group: a Ctrl-C aimed at the client does not kill the server mid-reply; the
        # child inherits this thread's CPUs
        with os.fdopen(fd, "wb") as log, pinned(cpus):
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        server = RpcServer(proc, host, p, Path(log_name))
        try:
            _wait_ready(server, timeout)
            return server
        except RpcServerError as e:
            server.stop()
            last_error = e
            if port is not None or "socket" not in str(e).lower():
                break  # a port race is worth another try; anything else is not
    assert last_error is not None
    raise last_error


@contextlib.contextmanager
def local_server_if(enabled: bool, threads: int | None = 1,
                    cpus: Collection[int] | None = None) -> Iterator[RpcServer | None]:
    """A loopback rpc-server for the duration of a command when `enabled` (CLI --rpc-local);
    with `cpus`, the server on them and this process on the others while inside."""
    if not enabled:
        yield None
        return
    server = start_server(threads=threads, cpus=cpus)
    try:
        with beside(cpus):
            yield server
    finally:
        server.stop()


def _wait_ready(server: RpcServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        server.check()
        try:
            with socket.create_connection((server.host, server.port), timeout=0.5):
                pass
            time.sleep(0.02)
            server.check()  # still alive after accepting: it is ours that answered
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RpcServerError(f"rpc-server {server.endpoint} did not accept connections within "
                                 f"{timeout:.0f} s; its log ends:\n{server.log_tail()}")
        time.sleep(0.05)


# --- CLI ------------------------------------------------------------------------------------


def _cmd_rpc_server(args: argparse.Namespace) -> int:
    server = start_server(args.host, args.port, threads=args.threads, devices=args.device, cache=args.cache)
    print(f"rpc-server running: use device name {server.device_name}  (pid {server.pid}; Ctrl-C stops it)",
          flush=True)
    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        while server.alive():
            time.sleep(0.5)
        server.check()  # it died on its own: say why
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rpc-server", help="start llama.cpp's rpc-server on loopback (a second device)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; others warn)")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the server")
    p.add_argument("--device", action="append", help="server device (ggml name), repeatable")
    p.add_argument("--cache", action="store_true", help="enable rpc-server's local file cache")
    p.set_defaults(func=_cmd_rpc_server)
