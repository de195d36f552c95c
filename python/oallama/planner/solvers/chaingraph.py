"""The layered graph of the exact walk (`chaindp`): every carried state reachable within the budget,
stage by stage, the edges between them, and the walk through it (`_core.pareto_walk`) with its
Lagrangian bounds (`_core.pareto_bounds`) and heuristic start."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ... import _core
from ..cost.schedmodel import NEVER
from .chainwalk import ACC, NotDecomposable, Walk, layer_of, shift_key, shift_src


class StageGraph:
    """Every carried state reachable within the budget, stage by stage, and the edges between them
    (an option of the stage's decision: the bytes it fixes, the bytes of the weight it streams, the
    us it adds). A state is (open decisions, last KV bit, per-pass carried state); the largest
    streamed weight so far is carried per front entry."""

    def __init__(self, walk: Walk, options, weight_bytes: Mapping[str, int], kv_suffix: Mapping[int, int],
                 cap: int, base: int, deadline: float = math.inf, reuse: bool = True) -> None:
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

        # Stages alike, reached from alike states, have alike edges: a stage is computed once and its
        # edges reused, shifted, for the layers after it. A stage's states are kept as `lists` (ids)
        # or as an alias (list, node shift per pass, layer shift) of a computed list, written out
        # only where a stage must be computed.
        lists: list[list[tuple]] = [[((), 0, carried0)]]
        alias: list[tuple[int, tuple[int, ...], int]] = [(0, (0,) * n_pass, 0)]  # per stage: (list, nodes, layers)
        shifted: dict[tuple, int] = {}

        def shift_carried(c: int, by: tuple[int, int]) -> int:
            k = (c, by)
            got = shifted.get(k)
            if got is None:
                last, anchor, opens = self.carried[c]
                got = shifted[k] = intern((last, anchor, tuple(sorted((shift_src(src, (-by[0], -by[1])), st)
                                                                      for src, st in opens))))
            return got

        def states(j: int) -> list[tuple]:
            """Stage j's states written out (from its alias)."""
            li, nodes, layers = alias[j]
            if nodes == (0,) * n_pass and layers == 0:
                return lists[li]
            return [(tuple(sorted((shift_key(k, (0, -layers)), v) for k, v in open_dec)), kv_last,
                     tuple(shift_carried(c, (nodes[p], layers)) for p, c in enumerate(carried)))
                    for open_dec, kv_last, carried in lists[li]]

        def signature(j: int) -> tuple:
            """What makes stage j's edges from alike states alike (its decision and runs, relative)."""
            key = walk.keys[j - 1]
            layer = layer_of(key)
            return (shift_key(key, (0, layer)), tuple(self.opts[j - 1]), tuple(walk.sig[j]),
                    tuple(sorted(shift_key(k, (0, layer)) for k in walk.keep[j])))

        def aligned(j: int, i: int) -> tuple[int, ...] | None:
            """Per pass, the node shift by which stage j's states are stage i's (alike stages), or None.
            Two lists written out and equal once shifted become one an alias of the other."""
            d_layer = layer_of(walk.keys[j - 1]) - layer_of(walk.keys[i - 1])
            li, nodes, layers = alias[j - 1]
            lj, nodes_i, layers_i = alias[i - 1]
            if li != lj:
                d_run = []  # per pass: the node shift between the stages where it last ran
                for p in range(n_pass):
                    k = 0
                    while walk.sig[j - k][p] is None and k < i:
                        k += 1
                    d_run.append(walk.shift[j - k][p][0] - walk.shift[i - k][p][0])
                mine = alias[j - 1]
                alias[j - 1] = (lj, tuple(a + b for a, b in zip(nodes_i, d_run, strict=True)), layers_i + d_layer)
                if states(j - 1) != lists[li]:
                    alias[j - 1] = mine
                    return None
                li, nodes, layers = alias[j - 1]
            d_nodes = tuple(a - b for a, b in zip(nodes, nodes_i, strict=True))
            if layers - layers_i != d_layer or any(walk.sig[j][p] is not None and
                                                   walk.shift[j][p][0] - walk.shift[i][p][0] != d_nodes[p]
                                                   for p in range(n_pass)):
                return None
            return d_nodes

        # per stage: edge arrays (source state, option, destination state, bytes fixed, bytes streamed, us)
        self.edges: list[tuple[np.ndarray, ...]] = []
        self.n_states = [1]
        fb = np.array([base], dtype=np.int64)  # least bytes any path to each state has (streamed copies aside)
        done: dict[tuple, list[int]] = {}  # signature -> the stages computed with it
        codes: dict[int, np.ndarray] = {}  # stage computed -> per edge: 1 bytes fixed, 2 streamed, 3 KV entered
        self.empty = False
        self.lambdas: np.ndarray | None = None  # prices of accelerator bytes (us per byte), once known
        self.computed = 0  # stages computed (the others: reused from a stage alike)
        for j, key in enumerate(walk.keys, start=1):
            if time.perf_counter() > deadline:
                raise NotDecomposable(f"time limit reached at decision {j} of {len(walk.keys)}")
            wb = weight_bytes.get(key[1], 0) if key[0] == "w" else 0
            kvb = kv_suffix[key[1]] if key[0] == "kv" else 0  # every later layer's KV comes with it
            sig = signature(j)
            reused = False
            for i in reversed(done.get(sig, [])[-4:] if reuse else []):  # alike to stage i: from alike states?
                d_nodes = aligned(j, i)
                if d_nodes is None:
                    continue
                src, opt_i, dst, _, _, dt = self.edges[i - 1]
                code = codes[i]
                db = np.where(code == 1, wb, np.where(code == 3, kvb, 0)).astype(np.int64)
                sw = np.where(code == 2, wb, 0).astype(np.int64)
                if np.any(fb[src] + db + sw > cap):  # the budget cuts an edge here: not the same edges
                    break
                li, nodes, layers = alias[i]
                alias.append((li, tuple(a + b for a, b in zip(nodes, d_nodes, strict=True)),
                              layers + layer_of(key) - layer_of(walk.keys[i - 1])))
                self.edges.append((src, opt_i, dst, db, sw, dt))
                self.n_states.append(self.n_states[i])
                nfb = np.full(self.n_states[i], np.iinfo(np.int64).max, dtype=np.int64)
                np.minimum.at(nfb, dst, fb[src] + db)
                fb = nfb
                reused = True
                break
            if reused:
                continue
            keep = sorted(walk.keep[j])
            index: dict[tuple, int] = {}
            src_l, opt_l, dst_l, code_l, dts = [], [], [], [], []
            nfb_l: list[int] = []
            pruned = False
            for si, skey in enumerate(states(j - 1)):
                open_dec, kv_last, carried = skey
                dec = dict(open_dec)
                for oi, opt in enumerate(self.opts[j - 1]):
                    c, db, sw, kv2 = 0, 0, 0, kv_last
                    if key[0] == "kv":
                        if opt < kv_last:
                            continue
                        if opt and not kv_last:
                            c, db = 3, kvb
                        kv2 = opt
                    elif opt == ACC:
                        c, db = 1, wb
                    elif opt != NEVER:
                        c, sw = 2, wb
                    if fb[si] + db + sw > cap:
                        pruned = True
                        continue
                    dec[key] = opt
                    new_carried, dt = run(j, dec, carried)
                    nkey = (tuple([(k, dec[k]) for k in keep]), kv2, new_carried)
                    di = index.get(nkey)
                    if di is None:
                        di = index[nkey] = len(nfb_l)
                        nfb_l.append(int(fb[si]) + db)
                    else:
                        nfb_l[di] = min(nfb_l[di], int(fb[si]) + db)
                    src_l.append(si)
                    opt_l.append(oi)
                    dst_l.append(di)
                    code_l.append(c)
                    dts.append(dt)
                dec.pop(key, None)
            if not index:
                self.empty = True
                return
            lists.append(list(index))
            alias.append((len(lists) - 1, (0,) * n_pass, 0))
            self.computed += 1
            code = np.array(code_l, dtype=np.int8)
            self.edges.append((np.array(src_l, dtype=np.int64), np.array(opt_l, dtype=np.int64),
                               np.array(dst_l, dtype=np.int64), np.where(code == 1, wb, np.where(code == 3, kvb, 0)),
                               np.where(code == 2, wb, 0), np.array(dts)))
            self.n_states.append(len(index))
            if not pruned:  # the budget cut no edge: its edges hold for every stage alike
                done.setdefault(sig, []).append(j)
                codes[j] = code
            fb = np.array(nfb_l, dtype=np.int64)

    def least_bytes(self, edges: Sequence[tuple[np.ndarray, ...]]) -> list[np.ndarray]:
        """Per stage and state: the least bytes the rest of the walk fixes (streamed copies aside)."""
        out = [np.zeros(self.n_states[-1], dtype=np.int64)]
        for j in range(len(edges) - 1, -1, -1):
            src, _, dst, db, _, _ = edges[j]
            b = np.full(self.n_states[j], np.iinfo(np.int64).max // 4, dtype=np.int64)
            np.minimum.at(b, src, db + out[-1][dst])
            out.append(b)
        out.reverse()
        return out

    def least_priced(self, edges: Sequence[tuple[np.ndarray, ...]], lambdas: np.ndarray,
                     levels: Sequence[int] = ()) -> list[np.ndarray]:
        """Per stage: [levels, len(lambdas), states] the least (us + lambda * bytes fixed) the rest of
        the walk adds streaming no weight above each level, for each price lambda (us per byte; 0:
        its least us, whatever its bytes). No levels: one, streaming unbounded."""
        return _core.pareto_bounds([(src, dst, db, sw, dt, self.n_states[j], self.n_states[j + 1])
                                    for j, (src, _, dst, db, sw, dt) in enumerate(edges)],
                                   np.asarray(lambdas).tolist(), list(levels))

    def prices(self, edges: Sequence[tuple[np.ndarray, ...]]) -> np.ndarray:
        """Prices of accelerator bytes (us per byte) whose Lagrangian bounds prune the walk: 0, and a
        spread around the price that maximises the bound at the start, c0 + R(lambda) - lambda *
        (cap - base), a concave function of lambda (a log grid, then two finer linear ones)."""
        room = float(self.cap - self.base)

        def bound(lams: np.ndarray) -> np.ndarray:
            return self.least_priced(edges, lams)[0][0, :, 0] - lams * room

        grid = np.concatenate(([0.0], np.logspace(-9, 2, 23)))  # us per byte
        for _ in range(3):
            k = int(np.argmax(bound(grid)))
            if grid[k] == 0.0:
                return np.zeros(1)  # the budget does not bind the rest's least us
            grid = np.linspace(grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)], 17)
        best = grid[8]
        return np.concatenate(([0.0], best * np.array([0.25, 0.5, 0.7, 0.9, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0])))

    def best(self, bound: float, max_entries: int, deadline: float = math.inf, streaming: bool = True,
             beam: int = 0) -> tuple[float, dict[tuple, int]] | None:
        """The least-us path within the budget and below `bound` (us, the walk's part): per state,
        a Pareto front of (bytes, us) for each largest streamed weight so far (_core.pareto_walk),
        pruned by Lagrangian bounds of the rest. streaming=False: without the streaming options;
        beam: first a heuristic walk keeping this many entries per stage (0: none), whose path, if
        any, bounds the exact walk."""
        edges = self.edges
        if not streaming:
            edges = []
            for j, e in enumerate(self.edges):
                plain = np.array([opt in (ACC, NEVER) for opt in self.opts[j]] if self.walk.keys[j][0] == "w"
                                 else [True] * len(self.opts[j]))[e[1]]
                edges.append(tuple(a[plain] for a in e))
        least = self.least_bytes(edges)
        if self.base + int(least[0][0]) > self.cap:
            return None
        limit = bound * (1 + 1e-9) + 1e-6 if math.isfinite(bound) else math.inf
        if self.lambdas is None:  # the prices of the first walk serve the next (the same budget)
            self.lambdas = self.prices(edges)
        # the largest streamed weight a path ends with: what its rest may still stream, and the
        # bytes its copy still takes from the budget (a bound per size streamed)
        levels = sorted({0, *(int(x) for e in edges for x in np.unique(e[4]))})
        rest = self.least_priced(edges, self.lambdas, levels)
        stages = [(src, dst, db, sw, dt, self.n_states[j], least[j + 1], rest[j + 1])
                  for j, (src, _, dst, db, sw, dt) in enumerate(edges)]

        def walk(limit: float, entries: int, heuristic: bool) -> tuple | None:
            try:
                return _core.pareto_walk(stages, self.base, self.c0, self.cap, limit, entries,
                                         max(0.0, deadline - time.perf_counter()) if math.isfinite(deadline) else 1e9,
                                         self.lambdas.tolist(), heuristic, levels)
            except ValueError as e:
                raise NotDecomposable(str(e)) from None

        # a heuristic walk first (the fronts cut to the entries of least bound): its placement
        # bounds the exact walk as a known placement would, the closer the more it prunes
        near = walk(limit, beam, True) if beam > 0 else None
        if near is not None:
            limit = min(limit, near[0] * (1 + 1e-9) + 1e-6)
        found = walk(limit, max_entries, False)
        if found is None:
            return None
        t, _, path, _ = found
        dec = {key: self.opts[j][int(edges[j][1][path[j]])] for j, key in enumerate(self.walk.keys)}
        return float(t), dec
