#!/usr/bin/env python3
"""A SET_ROWS node's work as the rows it writes (f32 rows and int64 indices read, the rows written
in the cache's f16: every cell here has flash attention off and an f16 cache) rather than
`calfit.work`'s bytes read and written, which for SET_ROWS are the whole cache twice (its result and
third source are the cache): the held-out set's own calibrations, the -np sets' and the device
model's reference calibration fitted again with it (their stored SET_ROWS points given the rows'
work, `calfit.refitted`), the planner's graphs costed with it (`schedmodel.work` replaced), and
predicted again: nothing run, nothing measured. Tried, not taken (README.md).

    python setrows_refit.py {28,29,29d} OUT      the held-out set (OUT/cells, OUT's report printed)
    python setrows_refit.py {28,29,29d} --np     the -np sets (2026-11-26-vm-parallel-layouts: the 8B
                                                 shape in-sample, Phi-3 and Gemma 3 held out), JSON lines
    python setrows_refit.py {28,29,29d} --dm OUT the held-out set costed from the device model version 5
                                                 (2026-11-26-vm-heldout-devicemodel-v5/reference), its
                                                 reference's calibration (PROFILES) fitted again so, its
                                                 attention factors fitted again from its spans
                                                 (device model version 5's factors: commit 64ae001)

  28  the stored works and `calfit.work` as it is (calibration method 28)
  29  the rows, both in the fit and in the planner's graphs
  29d the rows, and the attention kinds (MUL_MAT of two activations, SOFT_MAX) in one-token passes
      fitted on lines of their own (`calfit.op_key`)
  31  on calibration method 31's code (commit a5a69d6 or later), no patches: the stored points given
      method 31's works (SET_ROWS: `rows_work`; a one-token KQ / KQV: kind VEC, the K or V elements
      it reads); stored calibrations have no attention spans, so their lines stay node-by-node ones
  29b the rows, and a matmul of two activations with one column per head (a one-token pass's KQ and
      KQV: a matrix-vector product, which streams its K or V) costed by its bytes read and written on
      a line of its own ("MUL_MAT:vec"); the device model's decode spans in those bytes too (the
      reference's Llama 3 8B heads: 128 wide, 32 queries over 8 K/V heads, f16 cache)
"""
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "heldout"))
sys.path.insert(0, str(HERE.parent / "2026-11-26-vm-refit-ablation"))
import ablate  # noqa: E402
import layouts_refit  # noqa: E402

import heldout  # noqa: E402
import refit  # noqa: E402
from oallama.planner.cost import calfit, schedmodel  # noqa: E402

SRC = HERE.parent / "2026-11-25-vm-heldout"
DM = HERE.parent / "2026-11-26-vm-heldout-devicemodel-v5" / "reference"
# setup -> (the device model, its reference's calibrated profile: copied into reference/)
PROFILES = {"rpc": ("cpu-rpc-1thread-v5.json", "2f8d65f9b31733ac.json"), "cpu": ("cpu-2threads-v5.json", "c421272d40f0205b.json")}


def rows_work(p: dict) -> float:
    ne = p["src0_ne"]  # [row length, rows, ...] f32
    elems, rows = math.prod(ne), math.prod(ne[1:])
    return float(elems * 4 + rows * 8 + elems * 2)


def rows_graph_work(op, ne, nbytes, src_ne, src_bytes, attended=None):
    if op == "SET_ROWS" and len(src_ne) >= 3 and tuple(src_ne[2]) == tuple(ne):
        return float(src_bytes - nbytes + math.prod(src_ne[0]) * nbytes / max(math.prod(ne), 1))
    return calfit.work(op, ne, nbytes, src_ne, src_bytes, attended)


def device_model(fitted, out: Path) -> int:
    from oallama.model import gguf_file
    from oallama.planner.cost import attnspan, devicemodel
    from oallama.planner.cost.profile import Profile

    dms = {}
    for setup, (dname, pname) in PROFILES.items():
        dm = devicemodel.DeviceModel.from_json(json.loads((DM / dname).read_text()))
        ref = Profile.from_json(json.loads((HERE / "reference" / pname).read_text()))
        cal = fitted(ref.calibration, ref)
        ren = dict(zip(ref.devices, dm.names, strict=True))  # the rpc-server's port of each run
        for d, dc in cal.devices.items():
            dm.terms[ren[d]].update({"node_overhead_us": dc.node_overhead_us, "matmul_scale": dc.matmul_scale,
                                "ops": {k: vars(f) for k, f in dc.ops.items()}})
        spans, dm.attention = dm.attention["spans"], {}
        if sys.argv[1] == "29b":
            spans = vec_spans(spans)
        dm.attention = {"factors": attnspan.factors(dm.calibration(dm.names, dm.reference["n_vocab"]), spans)}
        dms[setup] = dm
    from oallama._files import cache_base

    for f in sorted((SRC / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] not in dms:
            continue
        path, _ = heldout.model_path(cell["model"], cache_base() / "models")
        vocab = devicemodel.n_vocab(gguf_file.check_model(path))

        def costed(cal, profile, dm=dms[cell["setup"]], vocab=vocab):
            new = dm.calibration(list(profile.devices), vocab)
            new.routing = cal.routing
            return new

        refit.repredict_cell(SRC, out, cell, "current", costed)
    print(heldout.report(out))
    return 0


VEC = "MUL_MAT:vec"


def vec_bytes(p: dict) -> float:
    """A stored one-token MUL_MAT point's bytes read and written from its MACs and src0 (f16 K or V
    view [k, rows, heads], f32 queries and result)."""
    k, rows = p["src0_ne"][0], p["src0_ne"][1]
    out = p["work"] / k  # result elements: rows x query heads
    return float(math.prod(p["src0_ne"]) * 2 + k * out / rows * 4 + out * 4)


def vec_points(points: list) -> list:
    return [{**p, "op": VEC, "work": vec_bytes(p)} if p["op"] == "MUL_MAT" and not p["weight_type"]
            and p["n_tokens"] == 1 else p for p in points]


def patched_other_ops(self, cal):
    """schedmodel.PassModel._other_ops with a one-column activation matmul costed as VEC."""
    host = cal.devices.get(schedmodel.HOST)
    acc = cal.devices.get(self.acc, host)
    if host is None or acc is None:
        return
    for i in self.order:
        if i in self.targets:
            continue
        n = self.graph.nodes[i]
        srcs = [self.graph.tensor(s) for s in n.srcs]
        cells = self.attended
        if cells is not None and self.attention is not None and n.op == "FLASH_ATTN_EXT" and len(n.srcs) > 1:
            cells = self.attention.cells(self.kv_layer(n.srcs[1]), cells)
        op = VEC if n.op == "MUL_MAT" and n.ne[1] == 1 else n.op
        w = (float(n.nbytes + sum(t.nbytes for t in srcs)) if op == VEC else
             rows_graph_work(n.op, n.ne, n.nbytes, [t.ne for t in srcs], sum(t.nbytes for t in srcs), cells))
        self.t_host[i] = host.node_time_us(op, w, self.n_tokens)
        self.t_acc[i] = acc.node_time_us(op, w, self.n_tokens)
    self.overhead_us = cal.pass_overhead_us(self.n_tokens)
    self.detached_us = min(cal.detached_us(self.acc, self.n_tokens), self.overhead_us)


def method31_points(points: list) -> list:
    """Stored method-28 points with method 31's works (run on method 31's code)."""
    out = []
    for p in points:
        if p["op"] == "SET_ROWS":
            p = {**p, "work": rows_work(p)}
        elif p["op"] == "MUL_MAT" and not p["weight_type"] and p["n_tokens"] == 1:
            p = {**p, "kind": "MUL_MAT:vec", "work": float(math.prod(p["src0_ne"]))}
        out.append(p)
    return out


def vec_spans(spans: list) -> list:
    """The device model's spans with their one-token MUL_MAT nodes in VEC bytes (the reference's heads)."""
    def conv(op, w):
        return (VEC, 2176 / 4096 * w + 16384) if op == "MUL_MAT" else (op, w)
    out = []
    for s in spans:
        if s["n_tokens"] != 1:
            out.append(s)
            continue
        nodes = [[conv(op, ws)[0], conv(op, ws)[1], conv(op, wl)[1]] for op, ws, wl in s["nodes"]]
        out.append({**s, "nodes": nodes})
    return out


def main() -> int:
    method, out = sys.argv[1], Path(sys.argv[2])
    if method == "29b":
        schedmodel.PassModel._other_ops = patched_other_ops
    if method in ("29", "29d"):
        schedmodel.work = rows_graph_work
    if method == "29d":  # the attention kinds' one-token passes on lines of their own
        base = calfit.op_key
        calfit.op_key = lambda op, n: f"{op}:1" if n == 1 and op in ("MUL_MAT", "SOFT_MAX") else base(op, n)

    def fitted(cal, profile):
        if method in ("29", "29d", "29b"):
            cal = replace(cal, points=[{**p, "work": rows_work(p)} if p["op"] == "SET_ROWS" else p for p in cal.points])
        if method == "29b":
            cal = replace(cal, points=vec_points(cal.points))
        if method == "31":
            cal = replace(cal, points=method31_points(cal.points))
        return calfit.refitted(cal, profile)

    if str(out) == "--dm":
        return device_model(fitted, Path(sys.argv[3]))
    if str(out) == "--np":
        ablate.fit_again = fitted
        sys.argv = [sys.argv[0], "current"]
        return layouts_refit.main()
    for f in sorted((SRC / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        if cell["setup"] in ("cpu", "rpc"):
            refit.repredict_cell(SRC, out, cell, "current", fitted)
    print(heldout.report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
