"""The passes of `optimal`'s program compiled into the stages of the exact walk (`chaindp`): stage
j decides one weight or one layer's KV, then runs, in every pass, every node whose device and
sources are known; a pass's carried state (last device, last pinned device, tensors read again
later: their device and whether their copy is paid) is what later nodes can still see. Stages of
layers alike are the same up to a shift of node indices and layer numbers (`shift_src`,
`shift_key`), which `chaingraph` uses to compute them once."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..cost.schedmodel import PassModel

ACC = -1  # a weight's option: on the accelerator (else: the smallest batch its op streams at, NEVER: never)


class NotDecomposable(Exception):
    """The program does not fit the exact walk (the caller falls back to the MILP). incumbent: the
    best placement (a chaindp.Result) found before it ran out (the optimum without streaming
    options), if any."""

    incumbent: object = None


@dataclass
class _Node:
    """One non-view node of one pass, compiled for the walk."""

    index: int
    kind: int  # 0 constant, 1 layer (its KV / pinned to the layer), 2 weight, 3 spread to
    arg: object  # 0/1 | layer | (weight, batch, streamable) | (next pinned node, supported)
    t_host: float  # us, times the pass's weight
    t_acc: float
    reads: tuple  # ((source, up_us, down_us, last), ...): last: no later reader in this pass
    opens: bool  # read later in this pass: its device is carried
    readback_us: float  # its output is read back to the host when on the accelerator (us)


class Walk:
    """The passes compiled into stages: stage j decides `keys[j]` and then runs, in every pass,
    every node whose device and sources are known."""

    def __init__(self, passes: Sequence[tuple[PassModel, float]], full: bool, svars: set[tuple[str, int]]) -> None:
        self.full = full
        self.overhead = sum(pm.fixed_us * w for pm, w in passes)
        first: dict[tuple, float] = {}  # decision -> earliest relative position it is needed at
        compiled: list[list[_Node]] = []
        needs: list[list[frozenset]] = []
        for pm, weight in passes:
            kind, anchors = pm.kinds[full], pm.anchor_map[full]
            pos = {i: k for k, i in enumerate(pm.order)}
            last_read: dict[tuple, int] = {}
            for i in pm.order:
                for src, _ in pm.reads[i]:
                    last_read[src] = pos[i]
            nodes, nd = [], []
            for i in pm.order:
                k = kind[i]
                need: set[tuple] = set()
                if k[0] == "c":
                    node_kind, arg = 0, int(k[1])
                elif k[0] == "kv":
                    node_kind, arg = (0, 1) if full else (1, k[1])
                    if not full:
                        need.add(("kv", k[1]))
                elif k[0] == "w":
                    node_kind, arg = 2, (k[1], k[4], (k[1], k[4]) in svars)
                    need.add(("w", k[1]))
                else:
                    nxt = anchors[i][1]
                    node_kind, arg = 3, (nxt if k[1] else None, bool(k[1]))
                    if k[1] and nxt is not None:
                        need |= _device_needs(kind[nxt], full)
                reads = []
                for src, _ in pm.reads[i]:  # copies are sized by the largest read (read_bytes)
                    if src[0] == "w":
                        need.add(("w", src[1]))
                        up = pm.stream.time_us(round(pm.read_bytes[src] * pm.copied_share.get(src[1], 1.0)))
                    else:
                        if src[0] == "kv" and not full:
                            need.add(("kv", src[1]))
                        up = pm.h2d.time_us(pm.read_bytes[src])
                    reads.append((src, up * weight, pm.d2h.time_us(pm.read_bytes[src]) * weight,
                                  last_read[src] == pos[i]))
                th, ta = pm.t_host.get(i), pm.t_acc.get(i)
                rb = 0.0
                if pm.readback is not None and pm.readback[0] == i:
                    rb = pm.d2h.time_us(pm.readback[1]) * weight
                nodes.append(_Node(i, node_kind, arg, 0.0 if th is None else th * weight,
                                   0.0 if ta is None else ta * weight, tuple(reads),
                                   last_read.get(("node", i), -1) > pos[i], rb))
                fz = frozenset(need)
                nd.append(fz)
                for key in fz:
                    rel = pos[i] / max(len(pm.order), 1)
                    first[key] = min(first.get(key, math.inf), rel)
            compiled.append(nodes)
            needs.append(nd)
        self.launch = [(pm.launch[0] * w, pm.launch[1] * w) for pm, w in passes]
        keys = sorted(first, key=lambda key: (first[key], key))
        # n_gpu_layers: KV layers are decided in increasing order (the last one's bit is carried)
        slots = [j for j, key in enumerate(keys) if key[0] == "kv"]
        layers = sorted(key[1] for key in keys if key[0] == "kv")
        for j, layer in zip(slots, layers, strict=True):
            keys[j] = ("kv", layer)
        self.keys = keys
        # stage j runs these nodes of each pass (stage 0 first runs what needs no decision)
        decided: set[tuple] = set()
        ptr = [0] * len(passes)
        self.runs: list[list[list[_Node]]] = []
        self._needed: list[list[tuple[tuple, ...]]] = []
        self.keep: list[frozenset] = []  # decisions still needed after stage j
        last_need: dict[tuple, int] = {}
        for j in range(len(keys) + 1):
            if j > 0:
                decided.add(keys[j - 1])
            run, used = [], []
            for p, nodes in enumerate(compiled):
                start, seen = ptr[p], set()
                while ptr[p] < len(nodes) and needs[p][ptr[p]] <= decided:
                    for key in needs[p][ptr[p]]:
                        last_need[key] = j
                        seen.add(key)
                    ptr[p] += 1
                run.append(nodes[start:ptr[p]])
                used.append(tuple(sorted(seen)))
            self.runs.append(run)
            self._needed.append(used)
        self.by_index = [{n.index: n for n in nodes} for nodes in compiled]
        self.nodes = compiled
        if any(ptr[p] < len(nodes) for p, nodes in enumerate(compiled)):
            raise NotDecomposable("a node needs a decision that is never made")
        for j in range(len(keys) + 1):
            self.keep.append(frozenset(key for key in keys[:j] if last_need.get(key, -1) > j))
        self._canonical()

    def device(self, node: _Node, dec: Mapping[tuple, int]) -> int:
        """Device of a pinned node (kind 0-2) under the decisions."""
        if node.kind == 0:
            return int(node.arg)  # type: ignore[arg-type]
        if node.kind == 1:
            return dec[("kv", node.arg)]
        w, batch, streamable = node.arg  # type: ignore[misc]
        opt = dec[("w", w)]
        return 1 if opt == ACC or (streamable and batch >= opt) else 0

    def stream_gain(self) -> dict[tuple[str, int], tuple[float, float]]:
        """(weight, batch) -> (us its copies cost, us streaming it can save at most), over the passes
        of that batch. Streaming moves the weight's node to the accelerator and, with it, at most
        the nodes spread between its neighbouring pinned nodes: it can save no more than their
        host-minus-accelerator time, every copy into or out of them, two splits and the readback."""
        out: dict[tuple[str, int], tuple[float, float]] = {}
        for p, nodes in enumerate(self.nodes):
            lo, hi = self.launch[p]
            readers: dict[tuple, float] = {}  # source -> its reads' worst copy cost
            for n in nodes:
                for src, up, down, _ in n.reads:
                    readers[src] = readers.get(src, 0.0) + max(up, down)
            pinned = [k for k, n in enumerate(nodes) if n.kind != 3]
            for a, k in enumerate(pinned):
                n = nodes[k]
                if n.kind != 2 or not n.arg[2]:  # type: ignore[index]
                    continue
                w, batch, _ = n.arg  # type: ignore[misc]
                first = pinned[a - 1] + 1 if a > 0 else 0
                last = pinned[a + 1] if a + 1 < len(pinned) else len(nodes)
                gain = 2 * max(lo, hi)
                copy = 0.0
                for r in nodes[first:last]:
                    gain += max(0.0, r.t_host - r.t_acc) + r.readback_us + readers.get(("node", r.index), 0.0)
                    for src, up, down, _ in r.reads:
                        if r is n and src == ("w", w):
                            copy += up
                        else:
                            gain += max(up, down)
                c0, g0 = out.get((w, batch), (0.0, 0.0))
                out[(w, batch)] = (c0 + copy, g0 + gain)
        return out

    # --- stages alike up to where they are: run once ------------------------------------------------
    # Layers of one shape compile to the same stages shifted by a node offset and a layer number. A
    # stage of one pass is keyed by its nodes written relative to its first node and its decision's
    # layer (`sig`); carried states are written the same way, so a run computed for one layer is
    # reused, shifted, for every layer alike.

    def _canonical(self) -> None:
        sigs: dict[tuple, int] = {}
        self.sig: list[list[int | None]] = []
        self.shift: list[list[tuple[int, int]]] = []
        for j, run in enumerate(self.runs):
            layer = layer_of(self.keys[j - 1]) if j > 0 else 0
            row_sig, row_shift = [], []
            for p, nodes in enumerate(run):
                if not nodes:
                    row_sig.append(None)
                    row_shift.append((0, 0))
                    continue
                base = nodes[0].index
                shift = (base, layer)
                body = []
                for n in nodes:
                    arg: object = n.arg
                    if n.kind == 1:
                        arg = n.arg - layer  # type: ignore[operator]
                    elif n.kind == 2:
                        w, batch, streamable = n.arg  # type: ignore[misc]
                        arg = (shift_name(w, -layer), batch, streamable)
                    elif n.kind == 3:
                        nxt, supported = n.arg  # type: ignore[misc]
                        if nxt is not None:
                            a = self.by_index[p][nxt]
                            a_arg = (a.arg - layer if a.kind == 1 else  # type: ignore[operator]
                                     (shift_name(a.arg[0], -layer), *a.arg[1:]) if a.kind == 2 else a.arg)  # type: ignore[index]
                            arg = (nxt - base, supported, a.kind, a_arg)
                    reads = tuple((shift_src(src, shift), up, down, final) for src, up, down, final in n.reads)
                    body.append((n.index - base, n.kind, arg, n.t_host, n.t_acc, reads, n.opens, n.readback_us))
                row_sig.append(sigs.setdefault(tuple(body), len(sigs)))
                row_shift.append(shift)
                # the decisions' values key the cache in their relative order
                self._needed[j][p] = tuple(sorted(self._needed[j][p], key=lambda k, sh=shift: shift_key(k, sh)))
            self.sig.append(row_sig)
            self.shift.append(row_shift)

    def carried_to(self, j: int, p: int, carried: tuple) -> tuple:
        """A pass's carried state written relative to stage j's nodes."""
        shift = self.shift[j][p]
        return carried[0], carried[1], tuple((shift_src(src, shift), st) for src, st in carried[2])

    def carried_from(self, j: int, p: int, carried: tuple) -> tuple:
        base, layer = self.shift[j][p]
        return carried[0], carried[1], tuple((shift_src(src, (-base, -layer)), st) for src, st in carried[2])

    def needed(self, j: int, p: int) -> tuple[tuple, ...]:
        """The decisions stage j's nodes of pass p read (their values key the stage's cache)."""
        return self._needed[j][p]

    def run_pass(self, j: int, p: int, dec: Mapping[tuple, int], carried: tuple) -> tuple[tuple, float]:
        """Run stage j's nodes of pass p from its carried state: (new carried state, us)."""
        last, anchor, opens_t = carried
        opens = dict(opens_t)
        lo, hi = self.launch[p]
        cost = 0.0
        by_index = self.by_index[p]
        for n in self.runs[j][p]:
            if n.kind == 3:
                nxt, supported = n.arg  # type: ignore[misc]
                d = int(supported and (anchor or (nxt is not None and self.device(by_index[nxt], dec))))
            else:
                d = self.device(n, dec)
                anchor = d
            cost += n.t_acc if d else n.t_host
            if d != last:
                cost += hi if d else lo
                last = d
            done = []
            for src, up, down, final in n.reads:
                st = opens.get(src)
                if st is None:
                    st = (self._source(src, dec), False)
                sd, paid = st
                if sd != d and not paid:
                    cost += up if d else down
                    paid = True
                opens[src] = (sd, paid)
                if final:
                    done.append(src)
            for src in done:  # after all of the node's reads: it may read a tensor twice
                opens.pop(src, None)
            if n.opens:
                opens[("node", n.index)] = (d, False)
            if d and n.readback_us:
                cost += n.readback_us
        return (last, anchor, tuple(sorted(opens.items()))), cost

    def _source(self, src: tuple, dec: Mapping[tuple, int]) -> int:
        if src[0] == "c":
            return int(src[1])
        if src[0] == "kv":
            return 1 if self.full else dec[("kv", src[1])]
        if src[0] == "w":
            return int(dec[("w", src[1])] == ACC)
        raise NotDecomposable(f"node {src[1]} is read before it runs")


_BLK = re.compile(r"^blk\.(-?\d+)\.")


@functools.lru_cache(maxsize=65536)
def shift_name(name: str, by: int) -> str:
    m = _BLK.match(name)
    return name if m is None or by == 0 else f"blk.{int(m[1]) + by}.{name[m.end():]}"


def layer_of(key: tuple) -> int:
    if key[0] == "kv":
        return int(key[1])
    m = _BLK.match(key[1])
    return int(m[1]) if m else 0


def shift_src(src: tuple, shift: tuple[int, int]) -> tuple:
    """A source written relative to (node, layer) = shift (negated shift: back)."""
    kind = src[0]
    if kind == "node":
        return ("node", src[1] - shift[0])
    if kind == "kv":
        return ("kv", src[1] - shift[1])
    if kind == "w":
        return ("w", shift_name(src[1], -shift[1]))
    return src


def shift_key(key: tuple, shift: tuple[int, int]) -> tuple:
    if key[0] == "kv":
        return ("kv", key[1] - shift[1])
    return ("w", shift_name(key[1], -shift[1]))


def _device_needs(k: tuple, full: bool) -> set[tuple]:
    if k[0] == "kv" and not full:
        return {("kv", k[1])}
    if k[0] == "w":
        return {("w", k[1])}
    return set()
