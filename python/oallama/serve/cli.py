"""`oallama serve`: run the OpenAI-compatible server (app.py) under uvicorn until SIGTERM/SIGINT.

Start-up: an optional loopback rpc-server (--rpc-local), the model loaded with its placement (a
plan file, or planned here for --gpu-budget), log lines saying where its weights went and what the
plan predicts, then ``listening on http://HOST:PORT``. Shutdown (SIGTERM or Ctrl-C): the listening
socket closes, the request in flight finishes (up to --shutdown-timeout), waiting and new requests
get 503, the model and the rpc-server are freed, and the command exits 0 (130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..options import add_arguments, from_args
from .options import ServeError, ServeOptions, check_exposure

if TYPE_CHECKING:
    import uvicorn

    from .gate import Admission

_SERVER_MODULES = ("fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")


def log(message: str) -> None:
    print(f"oallama serve: {message}", file=sys.stderr, flush=True)


def require_server_extra() -> None:
    """ServeError naming the missing package when llama-cpp-python's server extra is absent."""
    import importlib.util

    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ServeError(f"oallama serve needs llama-cpp-python's server packages (missing: {', '.join(missing)}); "
                         "install them with: pip install 'oallama[serve]'")


def bind(host: str, port: int) -> socket.socket:
    """A bound socket for host:port (port 0: a free one); ServeError naming --host/--port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServeError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


def _make_server(config: uvicorn.Config, admission: Admission) -> uvicorn.Server:
    import uvicorn
    from sse_starlette.sse import AppStatus

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, draining the gate first: on the first SIGTERM/SIGINT the waiting
        requests are refused and the one in flight finishes (streams included: sse-starlette's
        own "cut every stream on exit" is off until nothing is in flight)."""

        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit and self.loop is not None:
                self.loop.call_soon_threadsafe(self._drain, sig)
            super().handle_exit(sig, frame)

        def _drain(self, sig: int) -> None:
            log(f"{signal.Signals(sig).name}: finishing {admission.active} request(s) in flight, refusing "
                f"{admission.waiting} waiting and any new one")
            admission.close()
            admission.on_idle_after_close(_end_streams)

    def _end_streams() -> None:
        AppStatus.should_exit = True

    AppStatus.disable_automatic_graceful_drain()
    return GracefulServer(config)


@contextlib.contextmanager
def _quiet_sigterm() -> Iterator[None]:
    """uvicorn re-raises the signal that stopped it once it has shut down; a SIGTERM that asked
    for a graceful stop ends the command normally (exit 0) instead of killing it then."""
    previous: Callable[[int, FrameType | None], Any] | int | None = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(opts: ServeOptions) -> int:
    """Run the server until it is told to stop; 0 after a graceful stop."""
    require_server_extra()
    import uvicorn

    from ..runtime import devices, rpc
    from .app import build_app, placement_lines

    devices.set_rpc_timeout(opts.rpc_timeout)  # bad values fail before the port is bound
    warning = check_exposure(opts)
    if warning:
        log(f"warning: {warning}")
    sock = bind(opts.host, opts.port)  # first: a taken port fails before a long load
    try:
        port = int(sock.getsockname()[1])
        with rpc.local_server_if(opts.rpc_local, opts.rpc_threads) as rpc_server:
            if rpc_server is not None:
                log(f"started rpc-server {rpc_server.endpoint} as device {rpc_server.device_name}")
            log(f"loading {opts.model}")
            served = build_app(opts, rpc_device=rpc_server.device_name if rpc_server is not None else None)
            try:
                for line in placement_lines(served.report):
                    log(line)
                if served.report["chat"]["warning"]:
                    log(f"warning: {served.report['chat']['warning']}")
                config = uvicorn.Config(served.app, host=opts.host, port=port,
                                        timeout_graceful_shutdown=opts.shutdown_timeout,
                                        log_level="info" if opts.verbose else "warning", access_log=opts.verbose)
                server = _make_server(config, served.admission)
                base = _url(opts.host, port)
                log(f"model '{served.alias}' listening on {base} (OpenAI API at {base}/v1; {base}/health, "
                    f"{base}/placement; queue limit {opts.queue})")
                with _quiet_sigterm():
                    server.run(sockets=[sock])
            finally:
                served.close()  # before the rpc-server goes (local_server_if stops it)
    finally:
        sock.close()
    log("stopped")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    return serve(from_args(ServeOptions, args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (llama_cpp.server) over a placed model")
    add_arguments(p, ServeOptions)
    p.set_defaults(func=_cmd_serve)
