"""oallama.collective.wire: what a job's ranks actually sent over TCP, read from the kernel
(seed 001: checks the all-reduce counting model against the wire).

``snapshot(pids)`` runs ``ss -tinp`` (iproute2) and keeps the established TCP sockets of the given
processes with the kernel's per-socket counters (tcp_info: bytes_received, data_segs_in, ...).
``traffic(before, after, rank_of_pid)`` pairs the two ends of every connection between ranks (on
loopback both ends are visible: a socket's peer address is the other socket's local address) and
returns, per directed rank pair, the TCP payload bytes and data segments that went from one to
the other between the snapshots, counted at the receiving socket (bytes_received counts in-order
payload once, whatever was retransmitted).

What gloo adds to a message's payload: every operation on a connection starts with a 48-byte
preamble (gloo/transport/tcp/pair.h, Op::preamble: six size_t), and a message of an unbound
buffer (torch.distributed's send/recv, gloo's ring all-reduce) takes three operations
(gloo/transport/tcp/pair.cc): NOTIFY_SEND_READY and the data from sender to receiver,
NOTIFY_RECV_READY back. So a message of b payload bytes is b + 144 bytes of TCP payload on its
connection (GLOO_MESSAGE_OVERHEAD), counting both directions. TCP/IP headers, ACKs and the
connection handshakes are not TCP payload and are not counted. Connections to the rendezvous
store (the MASTER_PORT) are not rank-to-rank traffic and are left out.

Only sockets of one network namespace are visible: ranks in separate namespaces (emulated hosts)
need one snapshot per namespace and are not supported here; their links' interface counters are
bench/scripts/netns_hosts.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import CollectiveError
from .topology import Topology

__all__ = ["GLOO_MESSAGE_OVERHEAD", "GLOO_PREAMBLE_BYTES", "Flow", "TcpSocket", "inter_host", "parse_ss",
           "snapshot", "ss_available", "traffic"]

GLOO_PREAMBLE_BYTES = 48  # gloo tcp Op::preamble: nbytes, opcode, slot, offset, length, roffset (6 x size_t)
# TCP payload bytes a point-to-point message adds to its own payload, both directions of its
# connection: NOTIFY_SEND_READY + the data's preamble (sender -> receiver), NOTIFY_RECV_READY back
GLOO_MESSAGE_OVERHEAD = 3 * GLOO_PREAMBLE_BYTES

_COUNTERS = ("bytes_sent", "bytes_acked", "bytes_received", "segs_out", "segs_in", "data_segs_out", "data_segs_in")
_USER = re.compile(r"pid=(\d+),fd=(\d+)")
_FIELD = re.compile(r"\b(" + "|".join(_COUNTERS) + r"):(\d+)")


@dataclass(frozen=True)
class TcpSocket:
    """One established TCP socket of a process, with the kernel's counters (bytes: TCP payload)."""

    pid: int
    fd: int
    local: str  # "addr:port" as ss prints it
    peer: str
    counters: Mapping[str, int]

    @property
    def key(self) -> tuple[int, int, str, str]:
        return (self.pid, self.fd, self.local, self.peer)

    def port(self, which: str) -> int:
        return int((self.local if which == "local" else self.peer).rsplit(":", 1)[1])


@dataclass
class Flow:
    """Traffic from one rank to another between two snapshots."""

    bytes: int = 0  # TCP payload bytes delivered to the receiver (gloo headers included)
    segments: int = 0  # TCP segments that carried data (the kernel may coalesce or split messages)


def ss_available() -> bool:
    return shutil.which("ss") is not None


def snapshot(pids: Iterable[int]) -> list[TcpSocket]:
    """The established TCP sockets of these processes (this network namespace), with counters."""
    want = set(pids)
    if not ss_available():
        raise CollectiveError("observing the wire needs `ss` (iproute2), which is not installed")
    p = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise CollectiveError(f"ss -tinpH failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return [s for s in parse_ss(p.stdout) if s.pid in want]


def parse_ss(text: str) -> list[TcpSocket]:
    """Sockets in `ss -tinpH` output: a line per socket (state, queues, local, peer, users), then
    an indented line of tcp_info fields. Counters ss leaves out (it prints only nonzero ones) are 0."""
    out: list[TcpSocket] = []
    head: list[str] | None = None
    for line in text.splitlines():
        if line[:1] not in (" ", "\t") and line.strip():
            head = line.split()
            continue
        if head is None or len(head) < 6 or head[0] != "ESTAB":
            continue
        users = " ".join(head[5:])
        fields = {k: int(v) for k, v in _FIELD.findall(line)}
        for pid, fd in _USER.findall(users):  # a socket shared by several processes: each owner
            out.append(TcpSocket(int(pid), int(fd), _addr(head[3]), _addr(head[4]),
                                 {k: fields.get(k, 0) for k in _COUNTERS}))
        head = None
    return out


def _addr(text: str) -> str:
    """'[::ffff:127.0.0.1]:41809' -> '127.0.0.1:41809' (an IPv4 peer of a dual-stack socket)."""
    return text.replace("[::ffff:", "").replace("]:", ":") if text.startswith("[::ffff:") else text


def traffic(before: Iterable[TcpSocket], after: Iterable[TcpSocket], rank_of_pid: Mapping[int, int],
            exclude_ports: Iterable[int] = ()) -> dict[tuple[int, int], Flow]:
    """{(src rank, dst rank): Flow} between two snapshots, counted at the receiving socket.

    Sockets whose local or peer port is in exclude_ports (the rendezvous store) are left out, as are
    sockets whose other end belongs to no rank. A socket opened after `before` counts from zero.
    """
    skip = set(exclude_ports)
    old = {s.key: s for s in before}
    after = [s for s in after if s.pid in rank_of_pid and s.port("local") not in skip and s.port("peer") not in skip]
    owner = {s.local: rank_of_pid[s.pid] for s in after}
    flows: dict[tuple[int, int], Flow] = {}
    for s in after:
        src = owner.get(s.peer)
        if src is None:
            continue
        prev = old.get(s.key)
        f = flows.setdefault((src, rank_of_pid[s.pid]), Flow())
        f.bytes += s.counters["bytes_received"] - (prev.counters["bytes_received"] if prev else 0)
        f.segments += s.counters["data_segs_in"] - (prev.counters["data_segs_in"] if prev else 0)
    return flows


def inter_host(flows: Mapping[tuple[int, int], Flow], topo: Topology) -> dict[str, int]:
    """Totals of flows split by whether they cross hosts: inter/intra bytes and segments."""
    tot = {"inter_bytes": 0, "inter_segments": 0, "intra_bytes": 0, "intra_segments": 0}
    for (a, b), f in flows.items():
        kind = "inter" if topo.crosses(a, b) else "intra"
        tot[f"{kind}_bytes"] += f.bytes
        tot[f"{kind}_segments"] += f.segments
    return tot
