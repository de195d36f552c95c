"""Optimal, by dynamic programming along the graph: the program of `optimal` solved exactly,
without branch and bound.

The MILP's hard part is proving its bound: a 48-layer mixture of experts has ~1.2k binaries whose
LP relaxation blends layers, and HiGHS spends seconds closing a gap under 1%. Its objective is
local along llama.cpp's graph order, though: a node's device depends on its own weight (or its
layer's KV, or a constant) and, for a node the scheduler spreads to, on the nearest pinned nodes
before and after it; a split starts where two consecutive nodes differ; a copy is charged where a
tensor is read on the other device, once per (tensor, direction). The memory budget is the only
term that spans the whole graph. So the placement is decided weight by weight in graph order (all
passes in step: a weight's decision holds in every pass), carrying only what later nodes can
still see:

  per pass   the device of the last node (splits) and of the last pinned node (spreading), and
             for every tensor read again later its device and whether its copy is already paid;
  globally   decisions still needed later (a weight read further on, a layer's KV) and the last
             layer's KV bit (n_gpu_layers counts the trailing layers).

Stage j decides one weight (on the accelerator; on the host, streamed from some batch on; never
streamed) or one layer's KV, then runs every node whose device is known. The stages and carried
states form a layered graph (`_Graph`; runs are computed once per shape of layer: layers alike
are the same stages shifted); its edges fix bytes, may stream a weight (the compute buffer needs
room for the largest streamed weight: `optimal`'s m) and add us. The least-time path within the
budget is found by label setting (`_core.pareto_walk`, C++): per state and largest streamed size,
the Pareto front of (bytes, us), pruned by the budget (with the least bytes the rest must fix) and
against the best known placement (with the least us the rest must add). The result is the
program's optimum (tests compare it with HiGHS's on real graphs).

What it costs: the carried states multiply where passes can differ, which is what streaming
does (a weight streamed at prefill but not in decode): a 48-layer Qwen3-30B-A3B shape walks ~60
states and ~40k front entries per stage without streaming options (2-3 s here), ~200 states and
~300k entries with them (12-20 s). `NotDecomposable` says when a front or the time limit runs
out; `optimal.solve` then goes on with HiGHS.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _core
from .schedmodel import NEVER, PassModel, Placement

ACC = -1  # a weight's option: on the accelerator (else: the smallest batch its op streams at, NEVER: never)
MAX_ENTRIES = 400_000  # front entries of one stage; beyond this the MILP is the better tool


class NotDecomposable(Exception):
    """The program does not fit this solver (the caller falls back to the MILP)."""


@dataclass
class Result:
    placement: Placement
    objective_us: float
    stream_batches: dict[str, list[int]]


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


class _Walk:
    """The passes compiled into stages: stage j decides `keys[j]` and then runs, in every pass,
    every node whose device and sources are known."""

    def __init__(self, passes: Sequence[tuple[PassModel, float]], full: bool, svars: set[tuple[str, int]]) -> None:
        self.full = full
        self.overhead = sum(pm.overhead_us * w for pm, w in passes)
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
            layer = _layer_of(self.keys[j - 1]) if j > 0 else 0
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
                        arg = (_shift_name(w, -layer), batch, streamable)
                    elif n.kind == 3:
                        nxt, supported = n.arg  # type: ignore[misc]
                        if nxt is not None:
                            a = self.by_index[p][nxt]
                            a_arg = (a.arg - layer if a.kind == 1 else  # type: ignore[operator]
                                     (_shift_name(a.arg[0], -layer), *a.arg[1:]) if a.kind == 2 else a.arg)  # type: ignore[index]
                            arg = (nxt - base, supported, a.kind, a_arg)
                    reads = tuple((_to(src, shift), up, down, final) for src, up, down, final in n.reads)
                    body.append((n.index - base, n.kind, arg, n.t_host, n.t_acc, reads, n.opens, n.readback_us))
                row_sig.append(sigs.setdefault(tuple(body), len(sigs)))
                row_shift.append(shift)
                # the decisions' values key the cache in their relative order
                self._needed[j][p] = tuple(sorted(self._needed[j][p], key=lambda k, sh=shift: _to_key(k, sh)))
            self.sig.append(row_sig)
            self.shift.append(row_shift)

    def carried_to(self, j: int, p: int, carried: tuple) -> tuple:
        """A pass's carried state written relative to stage j's nodes."""
        shift = self.shift[j][p]
        return carried[0], carried[1], tuple((_to(src, shift), st) for src, st in carried[2])

    def carried_from(self, j: int, p: int, carried: tuple) -> tuple:
        base, layer = self.shift[j][p]
        return carried[0], carried[1], tuple((_to(src, (-base, -layer)), st) for src, st in carried[2])

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
def _shift_name(name: str, by: int) -> str:
    m = _BLK.match(name)
    return name if m is None or by == 0 else f"blk.{int(m[1]) + by}.{name[m.end():]}"


def _layer_of(key: tuple) -> int:
    if key[0] == "kv":
        return int(key[1])
    m = _BLK.match(key[1])
    return int(m[1]) if m else 0


def _to(src: tuple, shift: tuple[int, int]) -> tuple:
    """A source written relative to (node, layer) = shift (negated shift: back)."""
    kind = src[0]
    if kind == "node":
        return ("node", src[1] - shift[0])
    if kind == "kv":
        return ("kv", src[1] - shift[1])
    if kind == "w":
        return ("w", _shift_name(src[1], -shift[1]))
    return src


def _to_key(key: tuple, shift: tuple[int, int]) -> tuple:
    if key[0] == "kv":
        return ("kv", key[1] - shift[1])
    return ("w", _shift_name(key[1], -shift[1]))


def _device_needs(k: tuple, full: bool) -> set[tuple]:
    if k[0] == "kv" and not full:
        return {("kv", k[1])}
    if k[0] == "w":
        return {("w", k[1])}
    return set()


def stream_options(passes: Sequence[tuple[PassModel, float]], *, full: bool, stream: bool,
                   fixed: Mapping[str, bool], no_stream: Collection[str]) -> set[tuple[str, int]]:
    """(weight, batch) whose op may be streamed (`optimal`'s s variables)."""
    if not stream:
        return set()
    return {(k[1], k[4]) for pm, _ in passes for k in pm.kinds[full].values()
            if k[0] == "w" and k[2] and not fixed.get(k[1], False) and k[1] not in no_stream}


def solve(passes: Sequence[tuple[PassModel, float]], *, weight_bytes: Mapping[str, int],
          kv_bytes: Mapping[int, int], budget: int, reserve: int = 0, full: bool = False,
          stream: bool = True, fixed: Mapping[str, bool] | None = None, no_stream: Collection[str] = (),
          cutoff_us: float | None = None, start_us: float | None = None,
          max_entries: int = MAX_ENTRIES, time_limit: float = math.inf) -> Result | None:
    """The placement `optimal.solve` would return (same arguments), or None when nothing fits or
    nothing beats `cutoff_us`. start_us: the objective of a placement known to fit, if any (prunes).
    Raises NotDecomposable when a stage's fronts would grow beyond `max_entries` entries or the
    search would take longer than `time_limit` seconds."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    fixed = dict(fixed or {})
    n_layer = passes[0][0].n_layer
    weights = sorted(set().union(*(pm.weights for pm, _ in passes)))
    acc_ok = {w: all(pm.acc_ok.get(w, True) for pm, _ in passes) for w in weights}
    svars = stream_options(passes, full=full, stream=stream, fixed=fixed, no_stream=no_stream)
    walk = _Walk(passes, full, svars)
    decided_w = {key[1] for key in walk.keys if key[0] == "w"}
    cap = budget - reserve  # bytes for weights, KV and the largest streamed copy
    base = 0
    for w in weights:  # weights no node reads: only their memory counts
        if w not in decided_w and fixed.get(w, False):
            if not acc_ok[w]:
                return None
            base += weight_bytes.get(w, 0)
    if full:
        base += sum(kv_bytes.values())
    if base > cap:
        return None
    batches: dict[str, set[int]] = {}
    for w, b in svars:
        batches.setdefault(w, set()).add(b)
    # a threshold whose copies cost more than streaming can save anywhere is never better than not
    # streaming (which needs no more bytes): not an option
    gain = walk.stream_gain()
    for w, bs in batches.items():
        for b in sorted(bs):
            copy = sum(gain.get((w, x), (0.0, 0.0))[0] for x in bs if x >= b)
            save = sum(gain.get((w, x), (0.0, 0.0))[1] for x in bs if x >= b)
            if copy >= save:
                bs.discard(b)

    def options(key: tuple) -> list[int]:
        if key[0] == "kv":
            return [0] if key[1] == 0 else [0, 1]
        w = key[1]
        opts = []
        if acc_ok[w] and fixed.get(w, True):
            opts.append(ACC)
        if not fixed.get(w, False):
            opts.append(NEVER)
            opts.extend(sorted(batches.get(w, ())))
        return opts

    kv_suffix = {layer: sum(kv_bytes.get(m, 0) for m in range(layer, n_layer)) for layer in range(n_layer + 1)}
    g = _Graph(walk, options, weight_bytes, kv_suffix, cap, base, deadline)
    if g.empty:
        return None
    bound = min(x for x in (cutoff_us, start_us, math.inf) if x is not None) - walk.overhead
    found = g.best(bound, max_entries, deadline)
    if found is None and start_us is not None and (cutoff_us is None or start_us < cutoff_us):
        # the start was not a placement of this program (e.g. a baseline's default streaming)
        found = g.best((cutoff_us if cutoff_us is not None else math.inf) - walk.overhead, max_entries, deadline)
    if found is None:
        return None
    obj, dec = found
    obj += walk.overhead
    if cutoff_us is not None and obj >= cutoff_us * (1 - 1e-9):
        return None
    on_acc = frozenset(w for w in weights if dec.get(("w", w)) == ACC or (w not in decided_w and fixed.get(w, False)))
    on_layers = [layer for layer in range(n_layer) if dec.get(("kv", layer), 0)]
    kv_layers = n_layer if full else (n_layer - on_layers[0] if on_layers else 0)
    streamed: dict[str, list[int]] = {}
    for w, b in sorted(svars):
        opt = dec.get(("w", w), NEVER)
        if opt != ACC and b >= opt:
            streamed.setdefault(w, []).append(b)
    min_batch = {w: (min(streamed[w]) if w in streamed else NEVER) for w in weights if w not in on_acc}
    return Result(Placement(on_acc, kv_layers, min_batch), obj, streamed)


class _Graph:
    """Every carried state reachable within the budget, stage by stage, and the edges between them
    (an option of the stage's decision: the bytes it fixes, the bytes of the weight it streams, the
    us it adds). A state is (open decisions, last KV bit, per-pass carried state); the largest
    streamed weight so far is carried per front entry."""

    def __init__(self, walk: _Walk, options, weight_bytes: Mapping[str, int], kv_suffix: Mapping[int, int],
                 cap: int, base: int, deadline: float = math.inf) -> None:
        self.walk, self.cap, self.base = walk, cap, base
        self.opts = [options(key) for key in walk.keys]
        n_pass = len(walk.runs[0])
        # per-pass carried states are interned (ids); a stage's run is cached per (stage, id, the
        # decisions it reads), and, written relative to the stage, across stages alike
        ids: dict[tuple, int] = {}
        self.carried: list[tuple] = []

        def intern(c: tuple) -> int:
            i = ids.get(c)
            if i is None:
                i = ids[c] = len(self.carried)
                self.carried.append(c)
            return i

        memo: dict[tuple, tuple[int, float]] = {}
        alike: dict[tuple, tuple[int, float]] = {}
        to_rel: dict[tuple, int] = {}
        from_rel: dict[tuple, int] = {}

        def run(j: int, dec: Mapping[tuple, int], carried: tuple) -> tuple[tuple, float]:
            out, cost = [], 0.0
            for p in range(n_pass):
                sig = walk.sig[j][p]
                if sig is None:  # nothing of this pass runs at this stage
                    out.append(carried[p])
                    continue
                vals = tuple(dec[k] for k in walk.needed(j, p))
                mk = (j, p, carried[p], vals)
                hit = memo.get(mk)
                if hit is None:
                    shift = walk.shift[j][p]
                    rk = (shift, carried[p])
                    rel = to_rel.get(rk)
                    if rel is None:
                        rel = to_rel[rk] = intern(walk.carried_to(j, p, self.carried[carried[p]]))
                    ak = (sig, rel, vals)
                    got = alike.get(ak)
                    if got is None:
                        new, us = walk.run_pass(j, p, dec, self.carried[carried[p]])
                        got = alike[ak] = (intern(walk.carried_to(j, p, new)), us)
                    bk = (shift, got[0])
                    back = from_rel.get(bk)
                    if back is None:
                        back = from_rel[bk] = intern(walk.carried_from(j, p, self.carried[got[0]]))
                    hit = memo[mk] = (back, got[1])
                out.append(hit[0])
                cost += hit[1]
            return tuple(out), cost

        start = intern((-1, 0, ()))
        carried0, self.c0 = run(0, {}, tuple(start for _ in range(n_pass)))
        self.keys: list[list[tuple]] = [[((), 0, carried0)]]
        # per stage: edge arrays (source state, option, destination state, bytes fixed, bytes streamed, us)
        self.edges: list[tuple[np.ndarray, ...]] = []
        fb = [base]  # least bytes any path to each state has (streamed copies aside)
        self.empty = False
        for j, key in enumerate(walk.keys, start=1):
            if time.perf_counter() > deadline:
                raise NotDecomposable(f"time limit reached at decision {j} of {len(walk.keys)}")
            keep = sorted(walk.keep[j])
            index: dict[tuple, int] = {}
            src, opt_i, dst, dbs, sws, dts = [], [], [], [], [], []
            nfb: list[int] = []
            for si, skey in enumerate(self.keys[-1]):
                open_dec, kv_last, carried = skey
                dec = dict(open_dec)
                for oi, opt in enumerate(self.opts[j - 1]):
                    db, sw, kv2 = 0, 0, kv_last
                    if key[0] == "kv":
                        if opt < kv_last:
                            continue
                        if opt and not kv_last:
                            db = kv_suffix[key[1]]  # every later layer's KV comes with it
                        kv2 = opt
                    elif opt == ACC:
                        db = weight_bytes.get(key[1], 0)
                    elif opt != NEVER:
                        sw = weight_bytes.get(key[1], 0)
                    if fb[si] + db + sw > cap:
                        continue
                    dec[key] = opt
                    new_carried, dt = run(j, dec, carried)
                    nkey = (tuple([(k, dec[k]) for k in keep]), kv2, new_carried)
                    di = index.get(nkey)
                    if di is None:
                        di = index[nkey] = len(nfb)
                        nfb.append(fb[si] + db)
                    else:
                        nfb[di] = min(nfb[di], fb[si] + db)
                    src.append(si)
                    opt_i.append(oi)
                    dst.append(di)
                    dbs.append(db)
                    sws.append(sw)
                    dts.append(dt)
                dec.pop(key, None)
            if not index:
                self.empty = True
                return
            self.keys.append(list(index))
            self.edges.append((np.array(src, dtype=np.int64), np.array(opt_i, dtype=np.int64),
                               np.array(dst, dtype=np.int64), np.array(dbs, dtype=np.int64),
                               np.array(sws, dtype=np.int64), np.array(dts)))
            fb = nfb

    def least_bytes(self) -> list[np.ndarray]:
        """Per stage and state: the least bytes the rest of the walk fixes (streamed copies aside)."""
        out = [np.zeros(len(self.keys[-1]), dtype=np.int64)]
        for j in range(len(self.edges) - 1, -1, -1):
            src, _, dst, db, _, _ = self.edges[j]
            b = np.full(len(self.keys[j]), np.iinfo(np.int64).max // 4, dtype=np.int64)
            np.minimum.at(b, src, db + out[-1][dst])
            out.append(b)
        out.reverse()
        return out

    def least_us(self) -> list[np.ndarray]:
        """Per stage and state: the least us the rest of the walk adds, whatever its bytes (a bound)."""
        out = [np.zeros(len(self.keys[-1]))]
        for j in range(len(self.edges) - 1, -1, -1):
            src, _, dst, _, _, dt = self.edges[j]
            t = np.full(len(self.keys[j]), math.inf)
            np.minimum.at(t, src, dt + out[-1][dst])
            out.append(t)
        out.reverse()
        return out

    def best(self, bound: float, max_entries: int, deadline: float = math.inf) -> tuple[float, dict[tuple, int]] | None:
        """The least-us path within the budget and below `bound` (us, the walk's part): per state,
        a Pareto front of (bytes, us) for each largest streamed weight so far (_core.pareto_walk)."""
        least = self.least_bytes()
        if self.base + int(least[0][0]) > self.cap:
            return None
        limit = bound * (1 + 1e-9) + 1e-6 if math.isfinite(bound) else math.inf
        rest = self.least_us()
        stages = [(src, dst, db, sw, dt, len(self.keys[j]), least[j + 1], rest[j + 1])
                  for j, (src, _, dst, db, sw, dt) in enumerate(self.edges)]
        try:
            found = _core.pareto_walk(stages, self.base, self.c0, self.cap, limit, max_entries,
                                      max(0.0, deadline - time.perf_counter()) if math.isfinite(deadline) else 1e9)
        except ValueError as e:
            raise NotDecomposable(str(e)) from None
        if found is None:
            return None
        t, _, path, _ = found
        dec = {key: self.opts[j][int(self.edges[j][1][path[j]])] for j, key in enumerate(self.walk.keys)}
        return float(t), dec
