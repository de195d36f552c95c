#!/usr/bin/env python3
"""An emulated cluster of weak machines on one host, built from a scenario file.

    client namespace   <tag>c: the command runs here (oallama's client: embedding, head)
    device namespaces  <tag>d<k>: one rpc-server each, bound to 10.214.<k>.2:50052 (the
                       namespace's own address; nothing else listens)
    links              client 10.214.<k>.1 <-> device 10.214.<k>.2, shaped in BOTH directions
                       with the scenario's rate, one-way delay, jitter and loss:
                         netem: a veth pair with `tc qdisc ... netem` on each end (the default);
                         tun:   where the kernel has no sch_netem, a TUN device in each namespace
                                and a relay process (this script, `relay`) that moves IP packets
                                between them with the same rate / delay / jitter / loss per
                                packet (a user-space netem; TCP sees real drops and delays)

No namespace has a route anywhere else: the rpc-servers (which have no authentication) can be
reached from the client namespace only. Everything is bounded by the scenario's duration_s
(or --timeout) and always torn down: rpc-servers and the relay are killed, the namespaces
(with their veths / TUNs) deleted, on normal exit, on error, on SIGINT/SIGTERM/SIGHUP.

    sudo bench/scripts/netem_scenario.py check                  what this machine allows (JSON; exit 3: nothing)
    sudo bench/scripts/netem_scenario.py run bench/scripts/scenarios/lan.json -- CMD ARGS...
         CMD runs in the client namespace with OALLAMA_SCENARIO=<runtime JSON: endpoints, memory, links>
    sudo bench/scripts/netem_scenario.py cleanup                remove what a killed run left behind

Scenario file (JSON):
    {"name": "lan", "description": "...", "duration_s": 900,
     "devices": [{"name": "d0", "memory_mib": 96, "threads": 1,
                  "link": {"rate_mbit": 1000, "delay_ms": 0.5, "jitter_ms": 0, "loss_pct": 0}}, ...]}
device 0 (the first) holds block 0 in every oallama plan. memory_mib is the memory the
emulated device offers (all rpc-servers share this host's RAM, so the benchmark writes it into
the devices file); rate_mbit 0 = unshaped; delay/jitter/loss apply to each direction (RTT =
2 x delay).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "oadist"  # every namespace this script creates starts with it
STATE_DIR = Path(tempfile.gettempdir()) / "oallama-netem"
SUBNET = "10.214"  # 10.214.<k>.1 client side, 10.214.<k>.2 device side (inside the namespaces only)
RPC_PORT = 50052
MAX_DURATION_S = 3600.0


class ScenarioError(RuntimeError):
    pass


# --- scenario files --------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    rate_mbit: float = 0.0  # per direction (Mbit/s); 0 = unshaped
    delay_ms: float = 0.0  # one-way, each direction (ms)
    jitter_ms: float = 0.0  # +- around the delay (ms)
    loss_pct: float = 0.0  # packets dropped, each direction (%)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_mib: float  # what the emulated device offers (MiB)
    threads: int = 1  # rpc-server CPU threads
    link: Link = field(default_factory=Link)


@dataclass(frozen=True)
class Scenario:
    name: str
    devices: list[DeviceSpec]
    description: str = ""
    duration_s: float = 900.0  # upper bound of the whole run (s)
    path: str = ""


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ScenarioError(f"{p}: cannot read scenario ({e})") from None
    try:
        devs = []
        for k, d in enumerate(doc["devices"]):
            link = Link(**d.get("link", {}))
            dev = DeviceSpec(str(d.get("name", f"d{k}")), float(d["memory_mib"]), int(d.get("threads", 1)), link)
            if dev.memory_mib <= 0 or dev.threads < 1 or link.rate_mbit < 0 or link.delay_ms < 0 \
                    or link.jitter_ms < 0 or not 0 <= link.loss_pct < 100:
                raise ValueError(f"device {dev.name}: out-of-range value")
            devs.append(dev)
        sc = Scenario(str(doc["name"]), devs, str(doc.get("description", "")),
                      float(doc.get("duration_s", 900.0)), str(p))
    except (KeyError, TypeError, ValueError) as e:
        raise ScenarioError(f"{p}: bad scenario ({e}); see bench/scripts/netem_scenario.py's docstring") from None
    if not sc.devices or len(sc.devices) > 32:
        raise ScenarioError(f"{p}: a scenario has 1..32 devices")
    if not 0 < sc.duration_s <= MAX_DURATION_S:
        raise ScenarioError(f"{p}: duration_s must be in (0, {MAX_DURATION_S:.0f}]")
    return sc


# --- what this machine allows ----------------------------------------------------------------


def _run(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise ScenarioError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def check() -> dict[str, Any]:
    """root, network namespaces, veth, netem, TUN: True or the reason not. "shaper" is what a
    run would use ("netem", "tun") or None with "reason"."""
    out: dict[str, Any] = {"root": os.geteuid() == 0}
    if not out["root"]:
        out.update(shaper=None, reason="needs root (CAP_NET_ADMIN) for network namespaces")
        return out
    if not shutil.which("ip") or not shutil.which("tc"):
        out.update(shaper=None, reason="iproute2 (ip, tc) is not installed")
        return out
    tag = f"{PREFIX}chk{os.getpid()}"
    try:
        p = _run("ip", "netns", "add", tag, check=False)
        out["netns"] = True if p.returncode == 0 else p.stderr.strip()
        if out["netns"] is not True:
            out.update(shaper=None, reason=f"cannot create a network namespace: {out['netns']}")
            return out
        p = _run("ip", "-n", tag, "link", "add", "oachk0", "type", "veth", "peer", "name", "oachk1", check=False)
        out["veth"] = True if p.returncode == 0 else p.stderr.strip()
        if out["veth"] is True:
            p = _run("ip", "netns", "exec", tag, "tc", "qdisc", "add", "dev", "oachk0", "root", "netem", "delay", "1ms",
                     check=False)
            out["netem"] = True if p.returncode == 0 else (p.stderr.strip() or "tc netem failed")
        else:
            out["netem"] = "no veth"
        out["tun"] = True if os.path.exists("/dev/net/tun") else "no /dev/net/tun"
        if out["tun"] is True:
            p = _run("ip", "-n", tag, "tuntap", "add", "dev", "oachkt", "mode", "tun", check=False)
            out["tun"] = True if p.returncode == 0 else p.stderr.strip()
    finally:
        _run("ip", "netns", "del", tag, check=False)
    if out.get("netem") is True and out.get("veth") is True:
        out["shaper"] = "netem"
    elif out.get("tun") is True:
        out["shaper"] = "tun"
        out["note"] = (f"tc netem is unavailable ({out.get('netem')}): links are emulated by a user-space relay "
                       "over TUN devices (rate, delay, jitter, loss per packet, both directions)")
    else:
        out.update(shaper=None, reason=f"neither tc netem ({out.get('netem')}) nor TUN ({out.get('tun')}) works")
    return out


# --- the user-space netem (TUN relay) -------------------------------------------------------

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000


def _open_tun(ns: str, name: str) -> int:
    """Create TUN device `name` inside namespace `ns` and return its fd (the device lives as
    long as the fd)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    finally:
        libc.setns(own, _CLONE_NEWNET)
        os.close(own)
        os.close(target)
    return fd


class _Direction:
    """One direction of one link: Bernoulli loss, delay +- uniform jitter (order kept), then a
    serialising rate limit, with a 1000-packet queue (netem's default limit)."""

    LIMIT = 1000

    def __init__(self, src: int, dst: int, link: Link, rng: random.Random) -> None:
        self.src, self.dst, self.link, self.rng = src, dst, link, rng
        self.queue: deque[tuple[float, bytes]] = deque()
        self.last_due = 0.0
        self.free_at = 0.0
        self.stats = {"in": 0, "out": 0, "lost": 0, "overflow": 0}

    def push(self, pkt: bytes, now: float) -> None:
        self.stats["in"] += 1
        ln = self.link
        if ln.loss_pct > 0 and self.rng.random() * 100.0 < ln.loss_pct:
            self.stats["lost"] += 1
            return
        if len(self.queue) >= self.LIMIT:
            self.stats["overflow"] += 1
            return
        delay = max(0.0, ln.delay_ms + (self.rng.uniform(-ln.jitter_ms, ln.jitter_ms) if ln.jitter_ms else 0.0)) / 1e3
        due = max(now + delay, self.last_due)
        if ln.rate_mbit > 0:
            due = max(due, self.free_at) + len(pkt) * 8 / (ln.rate_mbit * 1e6)
            self.free_at = due
        self.last_due = due
        self.queue.append((due, pkt))

    def flush(self, now: float) -> None:
        while self.queue and self.queue[0][0] <= now:
            try:
                os.write(self.dst, self.queue[0][1])
            except BlockingIOError:
                return
            except OSError:
                pass  # the device went away: drop
            self.queue.popleft()
            self.stats["out"] += 1


def relay(spec: dict[str, Any]) -> int:
    """Run the user-space netem for the links in `spec` until SIGTERM or the deadline."""
    rng = random.Random(spec.get("seed", 0))
    dirs: list[_Direction] = []
    by_fd: dict[int, list[_Direction]] = {}
    for ln in spec["links"]:
        link = Link(**ln["link"])
        c = _open_tun(ln["client_ns"], ln["client_if"])
        d = _open_tun(ln["device_ns"], ln["device_if"])
        up, down = _Direction(c, d, link, rng), _Direction(d, c, link, rng)
        dirs += [up, down]
        by_fd[c] = [up]
        by_fd[d] = [down]
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print("ready", flush=True)
    deadline = time.monotonic() + float(spec["duration_s"])
    fds = list(by_fd)
    while not stop and time.monotonic() < deadline:
        now = time.monotonic()
        heads = [q.queue[0][0] for q in dirs if q.queue]
        timeout = min(max(min(heads) - now, 0.0), 0.05) if heads else 0.05
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in ready:
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                for q in by_fd[fd]:
                    q.push(pkt, now)
        now = time.monotonic()
        for q in dirs:
            q.flush(now)
    stats = [q.stats for q in dirs]
    print(json.dumps({"relay_stats": stats}), flush=True)
    return 0


# --- building and tearing down a scenario ----------------------------------------------------


class Cluster:
    """The namespaces, links and rpc-servers of one scenario; a context manager that always
    tears down."""

    def __init__(self, sc: Scenario, shaper: str, rpc_server: str, workdir: Path) -> None:
        self.sc, self.shaper, self.rpc_server, self.workdir = sc, shaper, rpc_server, workdir
        self.tag = f"{PREFIX}{os.getpid() % 100000}"
        self.client_ns = f"{self.tag}c"
        self.device_ns = [f"{self.tag}d{k}" for k in range(len(sc.devices))]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.relay: subprocess.Popen[str] | None = None
        self.created: list[str] = []
        self.state = STATE_DIR / f"{self.tag}.json"

    # addresses
    @staticmethod
    def client_addr(k: int) -> str:
        return f"{SUBNET}.{k}.1"

    @staticmethod
    def device_addr(k: int) -> str:
        return f"{SUBNET}.{k}.2"

    def endpoints(self) -> list[str]:
        return [f"{self.device_addr(k)}:{RPC_PORT}" for k in range(len(self.sc.devices))]

    def _save_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.state.write_text(json.dumps({"owner_pid": os.getpid(), "namespaces": self.created,
                                          "pids": [p.pid for p in self.procs] + ([self.relay.pid] if self.relay else [])}))

    def _netns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        self._save_state()
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def up(self) -> None:
        self._netns(self.client_ns)
        for ns in self.device_ns:
            self._netns(ns)
        links = []
        for k, (dev, ns) in enumerate(zip(self.sc.devices, self.device_ns, strict=True)):
            c_if, d_if = f"{self.tag}c{k}"[-15:], f"{self.tag}d{k}"[-15:]
            if self.shaper == "netem":
                _run("ip", "link", "add", c_if, "netns", self.client_ns, "type", "veth", "peer", "name", d_if,
                     "netns", ns)
                for ifname, nsname in ((c_if, self.client_ns), (d_if, ns)):
                    _run("ip", "netns", "exec", nsname, "tc", "qdisc", "add", "dev", ifname, "root", "netem",
                         *self._netem_args(dev.link))
                _run("ip", "-n", self.client_ns, "addr", "add", f"{self.client_addr(k)}/30", "dev", c_if)
                _run("ip", "-n", ns, "addr", "add", f"{self.device_addr(k)}/30", "dev", d_if)
            else:
                links.append({"client_ns": self.client_ns, "client_if": c_if, "device_ns": ns, "device_if": d_if,
                              "link": asdict(dev.link)})
        if self.shaper == "tun":
            self._start_relay(links)
            for k, ns in enumerate(self.device_ns):
                c_if, d_if = f"{self.tag}c{k}"[-15:], f"{self.tag}d{k}"[-15:]
                _run("ip", "-n", self.client_ns, "addr", "add", self.client_addr(k), "peer", self.device_addr(k),
                     "dev", c_if)
                _run("ip", "-n", ns, "addr", "add", self.device_addr(k), "peer", self.client_addr(k), "dev", d_if)
        for k, ns in enumerate(self.device_ns):
            c_if, d_if = f"{self.tag}c{k}"[-15:], f"{self.tag}d{k}"[-15:]
            _run("ip", "-n", self.client_ns, "link", "set", c_if, "up")
            _run("ip", "-n", ns, "link", "set", d_if, "up")
        for k, (dev, ns) in enumerate(zip(self.sc.devices, self.device_ns, strict=True)):
            # bound to the namespace's own address: reachable from the client namespace only
            cmd = ["ip", "netns", "exec", ns, self.rpc_server, "-H", self.device_addr(k), "-p", str(RPC_PORT),
                   "-t", str(dev.threads)]
            with open(self.workdir / f"rpc-server-{dev.name}.log", "wb") as log:  # the child keeps its own fd
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
            self._save_state()
        for k, ns in enumerate(self.device_ns):
            self._wait_listening(ns, self.device_addr(k))

    @staticmethod
    def _netem_args(link: Link) -> list[str]:
        args = ["limit", "1000", "delay", f"{link.delay_ms}ms"]
        if link.jitter_ms:
            args.append(f"{link.jitter_ms}ms")
        if link.loss_pct:
            args += ["loss", f"{link.loss_pct}%"]
        if link.rate_mbit:
            args += ["rate", f"{link.rate_mbit}mbit"]
        return args

    def _start_relay(self, links: list[dict[str, Any]]) -> None:
        spec = {"links": links, "duration_s": self.sc.duration_s + 60, "seed": 1}
        self.relay = subprocess.Popen([sys.executable, __file__, "relay", json.dumps(spec)], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=None, text=True, start_new_session=True)
        self._save_state()
        line = self.relay.stdout.readline() if self.relay.stdout else ""
        if line.strip() != "ready":
            raise ScenarioError(f"the TUN relay did not start (said {line.strip()!r})")

    def _wait_listening(self, ns: str, addr: str, timeout: float = 30.0) -> None:
        probe = (f"import socket,sys\ntry:\n socket.create_connection(('{addr}',{RPC_PORT}),0.5).close()\n"
                 "except OSError: sys.exit(1)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise ScenarioError(f"an rpc-server exited at start; see {self.workdir}")
            if _run("ip", "netns", "exec", ns, sys.executable, "-c", probe, check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise ScenarioError(f"rpc-server {addr}:{RPC_PORT} in {ns} did not listen within {timeout:.0f} s")

    def runtime_doc(self) -> dict[str, Any]:
        return {"scenario": self.sc.name, "file": self.sc.path, "description": self.sc.description,
                "shaper": self.shaper, "client_ns": self.client_ns, "duration_s": self.sc.duration_s,
                "devices": [{"name": d.name, "endpoint": ep, "memory_bytes": int(d.memory_mib * 2**20),
                             "threads": d.threads, "link": asdict(d.link)}
                            for d, ep in zip(self.sc.devices, self.endpoints(), strict=True)]}

    def down(self) -> dict[str, Any]:
        """Kill what we started, delete the namespaces; never raises."""
        info: dict[str, Any] = {}
        for p in self.procs:
            _stop(p)
        if self.relay is not None:
            _stop(self.relay)
            with contextlib.suppress(Exception):
                out = self.relay.stdout.read() if self.relay.stdout else ""
                for line in out.splitlines():
                    if line.startswith("{"):
                        info.update(json.loads(line))
        for ns in reversed(self.created):
            _run("ip", "netns", "del", ns, check=False)
        with contextlib.suppress(OSError):
            self.state.unlink()
        return info

    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def _stop(p: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to the process group we created for p."""
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _rpc_server_binary() -> str:
    """oallama's rpc-server (run this script with the Python that has oallama installed)."""
    from oallama import _libs

    return str(_libs.tool_path("rpc-server"))


def run(scenario: Scenario, command: list[str], *, shaper: str = "auto", timeout: float | None = None,
        workdir: Path | None = None) -> int:
    """Build the scenario, run `command` in the client namespace, tear down. Returns its exit
    code (124 if it ran past the time bound)."""
    caps = check()
    if caps.get("shaper") is None:
        raise ScenarioError(f"cannot emulate a network here: {caps.get('reason')}")
    if shaper == "auto":
        shaper = caps["shaper"]
    elif caps.get(shaper) is not True:
        raise ScenarioError(f"shaper '{shaper}' is not available here: {caps.get(shaper)}")
    limit = min(timeout or scenario.duration_s, scenario.duration_s)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="oallama-scenario-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    cmd_proc: subprocess.Popen[bytes] | None = None
    try:
        with Cluster(scenario, shaper, _rpc_server_binary(), workdir) as cl:
            runtime = workdir / "scenario-runtime.json"
            runtime.write_text(json.dumps(cl.runtime_doc(), indent=1))
            print(f"scenario {scenario.name}: {len(scenario.devices)} devices ({shaper}), endpoints "
                  f"{', '.join(cl.endpoints())}; running for at most {limit:.0f} s", file=sys.stderr, flush=True)
            env = {**os.environ, "OALLAMA_SCENARIO": str(runtime)}
            cmd_proc = subprocess.Popen(["ip", "netns", "exec", cl.client_ns, *command], env=env,
                                        start_new_session=True)
            try:
                rc = cmd_proc.wait(limit)
            except subprocess.TimeoutExpired:
                print(f"scenario {scenario.name}: time bound of {limit:.0f} s reached, stopping", file=sys.stderr)
                _stop(cmd_proc)
                rc = 124
            cmd_proc = None
    finally:
        if cmd_proc is not None:
            _stop(cmd_proc)
        for s, h in old.items():
            signal.signal(s, h)
    return rc


def cleanup() -> list[str]:
    """Remove namespaces (and kill processes) of runs whose owner died."""
    removed: list[str] = []
    if STATE_DIR.exists():
        for f in STATE_DIR.glob(f"{PREFIX}*.json"):
            try:
                st = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            owner = int(st.get("owner_pid", 0))
            with contextlib.suppress(OSError):
                if owner:
                    os.kill(owner, 0)
                    continue  # still running
            for pid in st.get("pids", []):
                with contextlib.suppress(OSError):
                    os.killpg(int(pid), signal.SIGKILL)
            for ns in st.get("namespaces", []):
                if _run("ip", "netns", "del", ns, check=False).returncode == 0:
                    removed.append(ns)
            f.unlink()
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="what this machine allows (JSON); exit 3 if no scenario can run")
    r = sub.add_parser("run", help="build a scenario, run a command in its client namespace, tear down")
    r.add_argument("scenario")
    r.add_argument("--shaper", default="auto", choices=["auto", "netem", "tun"])
    r.add_argument("--timeout", type=float, default=None, help="seconds (default: the scenario's duration_s)")
    r.add_argument("--workdir", default=None, help="logs and the runtime JSON (default: a temporary folder)")
    sub.add_parser("cleanup", help="remove namespaces left by a killed run")
    rl = sub.add_parser("relay", help=argparse.SUPPRESS)
    rl.add_argument("spec")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.cmd == "check":
        caps = check()
        print(json.dumps(caps, indent=1))
        return 0 if caps.get("shaper") else 3
    if args.cmd == "cleanup":
        print("\n".join(cleanup()) or "nothing to clean up")
        return 0
    if args.cmd == "relay":
        return relay(json.loads(args.spec))
    if not command:
        ap.error("run needs a command after --")
    try:
        return run(load_scenario(args.scenario), command, shaper=args.shaper, timeout=args.timeout,
                   workdir=Path(args.workdir) if args.workdir else None)
    except ScenarioError as e:
        print(f"netem_scenario: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("netem_scenario: interrupted; torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
