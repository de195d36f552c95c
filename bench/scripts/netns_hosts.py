#!/usr/bin/env python3
"""Emulated hosts on one machine: network namespaces on a private switch, with shaped links.

    hosts h0..h{n-1}     one network namespace each, interface `tp0` = 10.213.<id>.<i+1>/24
    switch               one more namespace with a bridge; every host hangs on it by a veth pair
    links                each host's uplink is shaped in both directions (host egress on tp0, switch
                         egress on its port): tc netem (rate, delay, jitter, loss) where the kernel
                         has it, else tc tbf (rate only: delay, jitter and loss are then NOT applied,
                         and Hosts.shaping says so)

No namespace has a route out: traffic between ranks stays inside these namespaces. Teardown
(deleting the namespaces, which removes their veths and bridge) always runs: on leaving the
`with` block, on SIGINT/SIGTERM, and at exit.

    sudo bench/scripts/netns_hosts.py check                       what this machine allows, as JSON
    sudo bench/scripts/netns_hosts.py run --hosts 2 --rate 1gbit --delay-ms 0.2 -- CMD ...
        runs CMD (in the root namespace) with OALLAMA_NETNS=ns0,ns1, OALLAMA_NETNS_ADDRS=ip0,ip1
        and OALLAMA_NETNS_IFNAME=tp0 set; a command starts a rank on host i with
        `ip netns exec <ns_i> ...` (oallama.collective.launch(netns=..., ifnames=...) does that)
    sudo bench/scripts/netns_hosts.py down                        remove namespaces left by a killed run
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

PREFIX = "oatp"  # every namespace this script makes starts with it (`down` removes them all)
IFNAME = "tp0"  # the host-side interface inside each host namespace


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def _tc(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetnsError(f"tc {' '.join(args)} (in {ns}): {p.stderr.strip()}")
    return p


@dataclass(frozen=True)
class LinkOptions:
    rate: str = "1gbit"  # tc rate: 1gbit, 100mbit, ...
    delay_ms: float = 0.2  # one-way delay per link (netem only)
    jitter_ms: float = 0.0  # netem only
    loss_pct: float = 0.0  # netem only
    burst: str = "64kb"  # tbf bucket size (tbf only)


def check() -> dict[str, Any]:
    """What this machine permits: root, namespaces, veth, tc tbf, tc netem. Never raises; each
    entry is True or the reason it is not."""
    out: dict[str, Any] = {"root": os.geteuid() == 0}
    if not shutil.which("ip") or not shutil.which("tc"):
        out["ip_netns"] = "iproute2 (ip, tc) not installed"
        return out
    ns = f"{PREFIX}chk{os.getpid()}"
    try:
        p = _ip("netns", "add", ns, check=False)
        if p.returncode != 0:
            out["ip_netns"] = p.stderr.strip() or "ip netns add failed"
            return out
        out["ip_netns"] = True
        p = _ip("-n", ns, "link", "add", "a0", "type", "veth", "peer", "name", "a1", check=False)
        out["veth"] = True if p.returncode == 0 else p.stderr.strip()
        if p.returncode == 0:
            for kind, args in (("tbf", ["tbf", "rate", "1gbit", "burst", "64kb", "latency", "50ms"]),
                               ("netem", ["netem", "delay", "1ms", "rate", "1gbit"])):
                q = _tc(ns, "qdisc", "replace", "dev", "a0", "root", *args, check=False)
                out[f"tc_{kind}"] = True if q.returncode == 0 else q.stderr.strip()
    finally:
        _ip("netns", "del", ns, check=False)
    return out


@dataclass
class Hosts:
    """n emulated hosts; use as a context manager (teardown is guaranteed)."""

    n: int
    link: LinkOptions = field(default_factory=LinkOptions)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    namespaces: list[str] = field(default_factory=list)
    addrs: list[str] = field(default_factory=list)
    shaping: str = ""  # "netem ..." or "tbf ... (no delay/jitter/loss)"
    _up: bool = False

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.tag}sw"

    @property
    def ifnames(self) -> list[str]:
        return [IFNAME] * self.n

    def __enter__(self) -> Hosts:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        if self.n < 1 or self.n > 200:
            raise ValueError("1..200 hosts")
        atexit.register(self.down)
        self._up = True
        subnet = 1 + int(self.tag, 16) % 250
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(self.n):
                ns = f"{PREFIX}{self.tag}h{i}"
                _ip("netns", "add", ns)
                self.namespaces.append(ns)
                # the pair is made inside the switch namespace, then one end moves to the host
                _ip("-n", self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", f"h{i}")
                _ip("-n", self.switch, "link", "set", f"h{i}", "netns", ns)
                _ip("-n", ns, "link", "set", f"h{i}", "name", IFNAME)
                addr = f"10.213.{subnet}.{i + 1}"
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
                _ip("-n", ns, "link", "set", IFNAME, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
                _ip("-n", self.switch, "link", "set", f"p{i}", "up")
                self.addrs.append(addr)
                self._shape(ns, IFNAME)
                self._shape(self.switch, f"p{i}")
        except BaseException:
            self.down()
            raise

    def _shape(self, ns: str, dev: str) -> None:
        L = self.link
        # one-way host-to-host delay = host egress + switch egress: half on each
        netem = ["netem", "rate", L.rate]
        if L.delay_ms or L.jitter_ms:
            netem += ["delay", f"{L.delay_ms / 2:g}ms"] + ([f"{L.jitter_ms / 2:g}ms"] if L.jitter_ms else [])
        if L.loss_pct:
            netem += ["loss", f"{L.loss_pct / 2:g}%"]
        if _tc(ns, "qdisc", "replace", "dev", dev, "root", *netem, check=False).returncode == 0:
            self.shaping = "netem " + " ".join(netem[1:]) + " per hop (host egress + switch egress)"
            return
        _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", L.rate, "burst", L.burst, "latency", "50ms")
        dropped = [k for k, v in (("delay", L.delay_ms), ("jitter", L.jitter_ms), ("loss", L.loss_pct)) if v]
        self.shaping = (f"tbf rate {L.rate} burst {L.burst} per hop (no netem in this kernel"
                        + (f": {', '.join(dropped)} NOT applied)" if dropped else ")"))

    def down(self) -> None:
        if not self._up:
            return
        for ns in [*self.namespaces, self.switch]:
            _ip("netns", "del", ns, check=False)
        self.namespaces, self.addrs, self._up = [], [], False
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)

    def counters(self) -> list[dict[str, int]]:
        """Per host: bytes and packets its uplink sent and received (the kernel's veth counters)."""
        out = []
        for ns in self.namespaces:
            p = _ip("-n", ns, "-s", "-j", "link", "show", "dev", IFNAME)
            st = json.loads(p.stdout)[0]["stats64"]
            out.append({"tx_bytes": st["tx"]["bytes"], "tx_packets": st["tx"]["packets"],
                        "rx_bytes": st["rx"]["bytes"], "rx_packets": st["rx"]["packets"]})
        return out

    def env(self) -> dict[str, str]:
        return {"OALLAMA_NETNS": ",".join(self.namespaces), "OALLAMA_NETNS_ADDRS": ",".join(self.addrs),
                "OALLAMA_NETNS_IFNAME": IFNAME}

    def describe(self) -> dict[str, Any]:
        return {"hosts": self.n, "namespaces": self.namespaces, "addrs": self.addrs, "link": asdict(self.link),
                "shaping": self.shaping}


def down_all() -> list[str]:
    """Remove every namespace this script made (left behind by a killed run)."""
    gone = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX):
            _ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


def _signal_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `with Hosts(...)`: teardown runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="print what this machine permits (JSON)")
    sub.add_parser("down", help="remove namespaces left behind by a killed run")
    r = sub.add_parser("run", help="make hosts, run a command, tear down")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--rate", default="1gbit")
    r.add_argument("--delay-ms", type=float, default=0.2)
    r.add_argument("--jitter-ms", type=float, default=0.0)
    r.add_argument("--loss-pct", type=float, default=0.0)
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        print(json.dumps(check(), indent=1))
        return 0
    if args.cmd == "down":
        print("\n".join(down_all()) or "nothing to remove")
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("run needs a command after --")
    signal.signal(signal.SIGTERM, _signal_exit)
    signal.signal(signal.SIGINT, _signal_exit)
    link = LinkOptions(rate=args.rate, delay_ms=args.delay_ms, jitter_ms=args.jitter_ms, loss_pct=args.loss_pct)
    with Hosts(args.hosts, link) as hosts:
        print(json.dumps(hosts.describe()), file=sys.stderr)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env={**os.environ, **hosts.env()})
        print(json.dumps({"seconds": time.perf_counter() - t0, "counters": hosts.counters()}), file=sys.stderr)
        return p.returncode


if __name__ == "__main__":
    sys.exit(main())
