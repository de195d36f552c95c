"""Devices: what ggml can run on in this process, named the way oallama names them.

Names are ggml's ("CPU", "CUDA0", "Vulkan0", ...) except for rpc-server devices, which are
named by endpoint, "RPC[127.0.0.1:50052]" (a server's further devices: "RPC[...]#1"), because
ggml's own RPC names depend on the order servers were added. Naming an RPC device makes it
known: `resolve("RPC[host:port]")` first checks that the server accepts connections (a clear
error now instead of a failed load later), then registers it with ggml. A server that dies,
hangs or drops the connection while in use fails its model's loads and decodes with
RpcServerError (patch 0007; `set_rpc_timeout` bounds the wait) instead of aborting the process.

    >>> from oallama import devices
    >>> [d.name for d in devices.list_devices()]
    ['CPU']
"""

from __future__ import annotations

import argparse
import re
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .. import _core, _libs
from ..errors import RpcServerError, UnknownDeviceError
from .rpc import RPC_TIMEOUT_S

_RPC_NAME = re.compile(r"^RPC\[(?P<endpoint>[^\]]+)\](?:#(?P<index>\d+))?$")
_PROBE_TIMEOUT_S = 5.0
# endpoint -> models of this process loaded on it. They share ggml's one connection to the server, which
# serves one connection at a time and queues one more (`listen(fd, 1)`): while they hold it, a TCP probe
# would wait in that queue and the next would time out, so none is made (`probe_endpoint`); a server that
# dies under them fails the held connection instead (`failed_rpc_endpoints`, the rpc timeout).
_held: Counter[str] = Counter()


@dataclass(frozen=True)
class Device:
    name: str  # oallama name
    ggml_name: str
    description: str
    backend: str  # registry: "CPU", "CUDA", "RPC", ...
    kind: str  # "cpu" | "gpu" | "igpu" | "accel" | "rpc" | "other"
    buffer_type: str
    memory_free: int  # bytes (0 for RPC devices unless queried)
    memory_total: int  # bytes
    host_buffer_type: str = ""  # pinned host buffer type ("CUDA_Host", "Vulkan_Host"); "" if none

    @staticmethod
    def from_native(d: _core.Device) -> Device:
        """A copy of _core's read-only device record (same field names as oallama_device_info)."""
        return Device(*(getattr(d, f.name) for f in fields(Device)))

    @property
    def is_host(self) -> bool:
        """Weights placed here live in this process's host memory."""
        return self.kind in ("cpu", "accel")

    @property
    def is_accelerator(self) -> bool:
        """A device that is not this host's CPU: a GPU or a remote rpc-server."""
        return self.kind in ("gpu", "igpu", "rpc")


_initialised = False


def _init() -> None:
    global _initialised
    if not _initialised:
        _core.backend_init()
        _core.rpc_set_timeout(RPC_TIMEOUT_S)  # until set_rpc_timeout says otherwise
        _initialised = True


def list_devices(query_rpc_memory: bool = False) -> list[Device]:
    """Every device ggml knows in this process, in ggml's order (CPU is always there).

    query_rpc_memory asks each rpc-server for its memory, after checking it still answers
    (a short TCP probe, so that a gone server costs no rpc timeout); a gone server reports 0 bytes."""
    _init()
    devs = [Device.from_native(d) for d in _core.devices_list(False)]
    if query_rpc_memory:
        devs = [_with_memory(d) if d.kind == "rpc" else d for d in devs]
    return devs


def _with_memory(d: Device) -> Device:
    try:
        probe_endpoint(d.description, timeout=2.0)
    except RpcServerError:
        return d
    free, total = _core.device_memory(d.name)
    return replace(d, memory_free=int(free), memory_total=int(total))


def device_memory(name: str) -> tuple[int, int]:
    """(free, total) bytes of one device; an rpc-server that stopped answering raises RpcServerError."""
    d = resolve(name)
    if d.kind == "rpc":
        probe_endpoint(d.description, timeout=2.0)
    free, total = _core.device_memory(d.name)
    return int(free), int(total)


def _proc_bytes(path: str, key: str) -> int | None:
    """A "Key:   N kB" line of a /proc file (bytes), None where there is none."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (bytes: free memory and what the kernel can reclaim, the page
    cache of a mapped model included), None where there is none."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def peak_rss_bytes() -> int:
    """This process's peak resident memory (bytes): VmHWM of /proc/self/status, its own since it
    started. getrusage's ru_maxrss also keeps the peak of the process that spawned it where that
    used vfork, as Python's subprocess does: a bench worker started after a 12 GB calibration
    reported 12 GB whatever it loaded."""
    hwm = _proc_bytes("/proc/self/status", "VmHWM")
    if hwm is not None:
        return hwm
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' -> (host, port); IPv6 hosts in brackets: '[::1]:50052'."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RpcServerError(f"rpc endpoint '{endpoint}' is not host:port")
    return host.strip("[]"), int(port)


def probe_endpoint(endpoint: str, timeout: float = _PROBE_TIMEOUT_S) -> None:
    """Raise RpcServerError unless something accepts TCP connections at `endpoint`; nothing to check
    while a model of this process holds the server's connection (`hold_rpc`)."""
    host, port = parse_endpoint(endpoint)
    if _held[endpoint] > 0:
        return
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise RpcServerError(f"cannot reach rpc-server at {endpoint}: {e.strerror or e}") from None


def add_rpc_server(endpoint: str, probe: bool = True) -> list[str]:
    """Make a running rpc-server's devices known to ggml; returns their oallama names. `probe`:
    first check that it accepts connections (a clear error now rather than a failed load later)."""
    _init()
    if probe:
        probe_endpoint(endpoint)
    try:
        return list(_core.rpc_add_server(endpoint))
    except RuntimeError as e:
        raise RpcServerError(str(e)) from None


def set_rpc_timeout(seconds: float) -> None:
    """Bound every later send/receive to any rpc-server of this process (s; 0: wait forever). A
    server that dies, hangs longer than this or drops the connection then fails its model's
    decodes with RpcServerError (patch 0007) instead of aborting the process."""
    _init()
    if not isinstance(seconds, int | float) or not seconds >= 0:
        raise RpcServerError(f"rpc_timeout={seconds!r}: give seconds >= 0 (0: wait forever)")
    _core.rpc_set_timeout(float(seconds))


def rpc_endpoint(name: str) -> str | None:
    """'RPC[host:port]' or 'RPC[host:port]#1' -> 'host:port'; None for any other device name."""
    m = _RPC_NAME.match(name.strip()) if isinstance(name, str) else None  # a bad plan entry: checked later
    return m["endpoint"] if m else None


def hold_rpc(endpoints: Iterable[str]) -> None:
    """A model loaded on these rpc-servers holds this process's connection to each (until `release_rpc`)."""
    _held.update(endpoints)


def release_rpc(endpoints: Iterable[str]) -> None:
    _held.subtract(endpoints)


def failed_rpc_endpoints(endpoints: Iterable[str]) -> list[str]:
    """Those of `endpoints` whose open connection failed (died, hung past the timeout, dropped)."""
    return [ep for ep in endpoints if _core.rpc_failed(ep)]


def resolve(name: str, probe: bool = True) -> Device:
    """The device called `name` (oallama or ggml name); RPC names are registered on demand, after
    a probe of the server unless `probe` is False (a name the caller resolved a moment ago: an
    rpc-server takes one connection at a time, and back-to-back probes wait on SYN retries)."""
    _init()
    m = _RPC_NAME.match(name.strip())
    if m:
        add_rpc_server(m["endpoint"], probe=probe)
    try:
        canonical = _core.device_name(name.strip())
    except RuntimeError as e:
        hint = ""
        if name.strip().upper().startswith("CUDA") and not _core.have_cuda:
            hint = "; this oallama was built without CUDA: rebuild with `OALLAMA_CUDA=ON scripts/setup.sh`"
        raise UnknownDeviceError(f"{e}{hint}") from None
    for d in list_devices():
        if d.name == canonical:
            return d
    raise UnknownDeviceError(f"unknown device '{name}'")  # pragma: no cover - registry changed under us


def default_accelerator() -> Device | None:
    """The device oallama offloads to when none is named: the first GPU, else the first RPC device."""
    devs = list_devices()
    for kinds in (("gpu",), ("igpu",), ("rpc",)):
        for d in devs:
            if d.kind in kinds:
                return d
    return None


# The two integer addresses oallama hands out, and only for llama-cpp-python's ctypes
# llama_model_params (devices, tensor_buft_overrides): every other native handle is a typed object.


def buffer_type_address(name: str) -> int:
    """ggml_backend_buffer_type_t of a device's default buffer type, or of a host weight layout
    ("CPU_REPACK", "CPU_REPACK_DUAL": _core.cpu_layouts()) (integer address, for ctypes)."""
    if name in _core.cpu_layouts():
        return int(_core.buffer_type_address(name))
    return int(_core.buffer_type_address(resolve(name, probe=False).name))


def device_address(name: str) -> int:
    """ggml_backend_dev_t of a device (integer address, for ctypes)."""
    return int(_core.device_address(resolve(name, probe=False).name))


# --- CLI ------------------------------------------------------------------------------------


def _cmd_devices(args: argparse.Namespace) -> int:
    for ep in args.rpc or []:
        add_rpc_server(ep)
    rows = [("name", "kind", "buffer type", "free MiB", "total MiB", "description")]
    for d in list_devices(query_rpc_memory=True):
        rows.append((d.name, d.kind, d.buffer_type, f"{d.memory_free >> 20}", f"{d.memory_total >> 20}",
                     d.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    build = _libs.describe_build()
    print(f"\nbuilt from {build[0]}; {build[-1]}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="list the devices ggml can use here")
    p.add_argument("--rpc", action="append", metavar="HOST:PORT", help="also add this rpc-server (repeatable)")
    p.set_defaults(func=_cmd_devices)
