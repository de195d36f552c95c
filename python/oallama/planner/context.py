"""What a plan is made for (seed 002): a memory budget, a stated workload (`workload`), and the
planning context of one model on (CPU, accelerator) -- the pass models of every ubatch the workload
runs, the weights' and KV cache's sizes, and the profile they are costed with.

Budget: bytes ("12GiB", "512MiB", "8000000000") or a share of the model's weights ("50%"). The
KV cache, compute buffers and streamed weights that a placement puts on the accelerator count
against it. Every strategy (`strategies`) plans in a `PlanContext`; `plan` turns the result into a
plan file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BudgetError, ModelFileError, PlanError
from ..model import gguf_file
from ..runtime import devices as devmod
from ..runtime import kvcache
from ..runtime.place import layer_weights
from .cost import devicemodel, opsizes
from .cost.calfit import Calibration, interpolated
from .cost.measure import profile_model
from .cost.profile import DEFAULT_TOKENS, PLAIN, REPACK, Link, Profile, default_settings, grid_columns
from .cost.schedmodel import HOST, PassModel, Placement, kv_bytes_per_layer, weight_bytes
from .graph import Graph, GraphSession, attention_layers, target_ops
from .workload import ONE, Ubatch, Workload

SHAPE_NODE_MIN = 10.0  # a weight matmul shape's nodes took at least this many times what timing a node alone
# adds (2.3 us on the project's VM) to get a plain-memory ratio of their own (`shape_ratios`)
_BINARY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_budget(value: str | int, model_weight_bytes: int) -> int:
    """Budget in bytes: an int, "12GiB", "512MiB", "8000000000", or "50%" of the weights."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BudgetError(f"budget {value!r}: expected bytes or a string such as '12GiB' or '50%'")
    if isinstance(value, int):
        if value <= 0:
            raise BudgetError(f"budget {value}: must be more than 0 bytes")
        return value
    text = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", text)
    if m:
        pct = float(m[1])
        if not 0 < pct <= 100:
            raise BudgetError(f"budget {value!r}: a share of the model's weights must be in (0%, 100%]")
        return max(int(model_weight_bytes * pct / 100), 1)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(B|KiB|MiB|GiB|TiB)?", text)
    if m:
        n = float(m[1]) * _BINARY[m[2] or "B"]
        if n < 1:
            raise BudgetError(f"budget {value!r}: must be at least 1 byte")
        return int(n)
    if re.fullmatch(r"\d+(?:\.\d+)?\s*[kKMGT]?B", text) or re.fullmatch(r"\d+(?:\.\d+)?\s+\w+", text):
        raise BudgetError(f"budget {value!r}: write binary units without a space, e.g. '12GiB' or '512MiB' "
                          "(decimal GB/MB are ambiguous)")
    raise BudgetError(f"budget {value!r}: expected bytes ('12GiB', '512MiB', '8000000000') or a share of "
                      "the model's weights ('50%')")


@dataclass
class PlanContext:
    """One model on (CPU, accelerator) for one workload: pass models, sizes, profile."""

    model: gguf_file.GGUFInfo
    acc: str | None  # None: CPU only (the only choices are host weight layouts)
    workload: Workload
    profile: Profile
    passes: dict[Ubatch, PassModel]  # the model of each pass the workload runs
    weight_bytes: dict[str, int]
    kv_bytes: dict[int, int]  # per layer
    n_layer: int
    settings: dict[str, Any]
    # streamed weights' link when the calibration measured it (`stream_link`), else None
    stream: Link | None = None
    # each split's cost beyond the profiled hand-over when the calibration measured it (`split_cost`)
    split_us: float | None = None
    # weights llama.cpp's n_gpu_layers rule assigns to the accelerator but its loader keeps on the host,
    # the device refusing the weight's op (lavapipe: a 151936-row output matrix): `place_layers` skips them
    kept_on_host: frozenset[str] = frozenset()

    def predict(self, p: Placement) -> dict[str, Any]:
        costs = {u: pm.cost(p) for u, pm in self.passes.items()}
        w = self.workload
        ttft = sum(costs[u].total_us for u in w.prompt_passes())  # one sequence's prompt
        tpot = costs[w.decode_pass].total_us
        out = {"ttft_ms": ttft / 1e3, "tpot_ms": tpot / 1e3, "e2e_ms": (w.parallel * ttft + (w.gen - 1) * tpot) / 1e3,
               "passes": {str(u): {"compute_ms": c.compute_us / 1e3, "other_ms": c.other_us / 1e3,
                                   "copy_ms": c.copy_us / 1e3, "stream_ms": c.stream_us / 1e3,
                                   "launch_ms": c.launch_us / 1e3, "overhead_ms": c.overhead_us / 1e3,
                                   "acc_ms": c.acc_us / 1e3, "total_ms": c.total_us / 1e3, "splits": c.n_splits,
                                   "copies": c.n_copies, "copy_bytes": c.copy_bytes,
                                   "stream_bytes": c.stream_bytes} for u, c in costs.items()}}
        if self.stream is not None:  # GB/s = bytes/us / 1e3
            out["stream_gb_s"] = self.stream.bytes_per_us / 1e3
        if self.split_us is not None:
            out["split_us"] = self.split_us
        return out

    def objective_ms(self, p: Placement) -> float:
        pred = self.predict(p)
        return float(pred[f"{self.workload.objective}_ms"])

    def attention(self) -> dict[str, Any]:
        """The plan's attention settings: flash attention (resolved, a bool) and the KV cache's types."""
        return {k: self.settings[k] for k in ("flash_attn", "type_k", "type_v")}

    def session_kwargs(self) -> dict[str, Any]:
        """GraphSession's keywords for a metadata-only load of this context (without the placement)."""
        return {"n_ctx": self.workload.n_ctx, "n_ubatch": self.workload.n_ubatch,
                "op_offload": bool(self.settings["op_offload"]), **self.attention(), **self.workload.sequences()}

    def llama_kwargs(self) -> dict[str, Any]:
        """oallama.Llama's keywords for the plan's settings (attention, sequences)."""
        return {**kvcache.llama_kwargs(**self.attention()), **self.workload.sequences()}

    def acc_bytes(self, p: Placement) -> int:
        """Weights + KV the placement puts on the accelerator (bytes, without compute buffers)."""
        return sum(self.weight_bytes[w] for w in p.on_acc) + sum(
            b for layer, b in self.kv_bytes.items() if layer >= self.n_layer - p.kv_layers)


def log(msg: str) -> None:
    """A planning step on stderr (what `oallama plan` shows unless --quiet)."""
    print(f"plan: {msg}", file=sys.stderr, flush=True)


CALIBRATIONS = ("auto", "model", "device")


def build_context(path: str | Path, acc: str | None, workload: Workload, *, profile: Profile | None = None,
                  threads: int | None = None, op_offload: bool = True, progress: bool = True,
                  calibration: str = "auto") -> PlanContext:
    """Graphs of every pass (all weights on the host, and fully offloaded), and the profile.
    acc None: the CPU alone (plans choose host weight layouts only). calibration (when `profile`
    is None): "model" times this model's real graph (calibrate.py); "device" costs it from the
    devices' model (devicemodel.py), characterising them first if they have none; "auto" is
    "device" for a shape-only file (it cannot be run), else "model" (the device model carries to
    other models less well so far: bench/results/2026-11-25-vm-heldout-devicemodel)."""
    if calibration not in CALIBRATIONS:
        raise PlanError(f"calibration '{calibration}': choose one of {', '.join(CALIBRATIONS)}")
    model = gguf_file.check_model(path)
    dev = devmod.resolve(acc) if acc is not None else None
    if dev is not None and dev.is_host:
        raise PlanError(f"device {acc} is host memory; name an accelerator (a GPU or an rpc-server device)")
    acc_name = dev.name if dev is not None else None
    n_layer = int(model.hparam("block_count", 0))
    # ONE: the one-token pass that the calibration's link terms are read on (`split_cost`, `stream_link`)
    sizes = sorted({*workload.prompt_passes(), ONE, workload.decode_pass})
    attention = {"flash_attn": resolve_flash_attn(path, acc_name, workload, n_layer),
                 "type_k": workload.cache_type_k, "type_v": workload.cache_type_v}
    if progress and workload.flash_attn == "auto":
        log(f"flash attention auto: {'on' if attention['flash_attn'] else 'off'} (as llama.cpp resolves it "
            f"with every layer on {' and on '.join(['the host', *([acc_name] if acc_name else [])])})")
    kw = {"devices": [acc_name] if acc_name else [], "n_ctx": workload.n_ctx, "n_ubatch": max(u.n_tokens for u in sizes),
          "op_offload": op_offload, **attention, **workload.sequences()}
    if progress:
        log(f"building llama.cpp's graphs for {', '.join(map(str, sizes))} token(s)"
            + (f" ({workload.decode_pass}: {workload.parallel} sequences of one token)" if workload.parallel > 1
               else ""))
    # each pass's graph at the KV length it runs at (attention's cost grows with it; with several
    # sequences, the length of each one's stream)
    kv_len, attended = workload.pass_kv(), workload.pass_attended()
    kv_len.setdefault(ONE, kv_len[workload.decode_pass])
    attended.setdefault(ONE, attended[workload.decode_pass])
    base: dict[tuple[Ubatch, int], Graph] = {}  # (ubatch, n_kv) -> graph, all weights on the host
    offl: dict[tuple[Ubatch, int], Graph] = {}  # the same, every layer offloaded
    kept: set[str] = set()  # weights every layer offloaded would put on the accelerator, which its loader keeps
    unified = workload.unified  # one KV stream of n_kv cells, whatever the sequences

    def build(n_kv: int, want: list[Ubatch], seqs: int) -> None:
        """Graphs of `want` (ubatches of `seqs` sequences each) over KV streams of n_kv cells, in a
        context of `seqs` sequences (a one-sequence pass in its own: llama.cpp reserves a graph over
        every stream)."""
        nonlocal kept
        for n_gpu_layers, out in ((0, base), (n_layer + 1, offl)) if acc_name else ((0, base),):
            with GraphSession(path, n_gpu_layers=n_gpu_layers, **{**kw, "n_ctx": n_kv * (1 if unified else seqs),
                                                                  "n_seq_max": seqs,
                                                                  "n_ubatch": max(*(u.n_tokens for u in want),
                                                                                  seqs)}) as s:
                out.update({(u, n_kv): s.graph(u.n_tokens, seqs, seqs) for u in want})
                if n_gpu_layers:
                    kept |= loader_kept(s, acc_name, n_layer)

    # memory is counted on the decode pass's graph over every sequence's whole stream (its cache
    # leafs are per layer, every stream's cells)
    for n_kv in sorted(set(kv_len.values()) | {workload.n_ctx_seq}):
        want = [u for u in sizes if kv_len[u] == n_kv or (u == workload.decode_pass and n_kv == workload.n_ctx_seq)]
        for seqs in sorted({u.n_seqs for u in want}):
            build(n_kv, [u for u in want if u.n_seqs == seqs], seqs)
    g_mem = base[(workload.decode_pass, workload.n_ctx_seq)]
    graphs = {u: base[(u, kv_len[u])] for u in sizes}
    full = {u: offl[(u, kv_len[u])] for u in sizes} if acc_name else {u: None for u in sizes}
    if profile is None:
        if progress:
            log("profiling (cached after the first time)")
        used = {op.n_tokens for g in [*graphs.values(), *(g for g in full.values() if g is not None)]
                for op in target_ops(g)}  # the column counts this plan costs weight matmuls at
        profile = _profile(path, model, acc_name, workload, threads=threads, op_offload=op_offload,
                           progress=progress, calibration=calibration, attention=attention, used=used)
    _check_profile(profile, acc_name, graphs, attention)
    if acc_name:  # the accelerator's kernels run columns in tiles: its matmuls timed at these pass sizes too
        timed = opsizes.time_missing(profile, [*graphs.values(), *(g for g in full.values() if g is not None)],
                                     acc_name, progress=progress)
        if timed and progress:
            log(f"timed {timed} op shape(s) on {acc_name} at pass sizes the profile lacked (kept in it)")
    layers = attention_layers(path) if attention["flash_attn"] else None  # its window layers' flash attention
    passes = {u: PassModel(graphs[u], profile, acc_name, n_layer=n_layer, op_offload=op_offload, full_graph=full[u],
                           attended=attended[u], attention=layers) for u in sizes}
    for pm in passes.values():  # llama.cpp's -ngl leaves them on the host; an override would force them (slow)
        pm.acc_ok.update({w: False for w in kept if w in pm.acc_ok})
    settings = {**profile.settings.as_dict(), "n_ctx": workload.n_ctx, "n_ubatch": workload.n_ubatch, **attention,
                **workload.sequences(), "pass_kv": {str(u): kv_len[u] for u in sizes}}
    cal = profile.calibration if acc_name else None
    # first the splits' cost (the streamed pass's many splits pay it too), then the streamed link
    carried = cal.links.get(acc_name, {}) if cal is not None else {}  # a device model's, already derived
    split_us = carried.get("split_us") or split_cost(passes[ONE], cal.scatter.get(acc_name) if cal is not None else None)
    if split_us is not None:
        for pm in passes.values():
            pm.set_split_cost(split_us)
        if progress:
            log(f"splits in a real pass (calibrated): {split_us:.0f} us each beyond the profiled hand-over "
                f"({passes[ONE].issue[0]:.0f} / {passes[ONE].issue[1]:.0f} us)")
    stream = (Link(carried["stream_latency_us"], carried["stream_bytes_per_us"]) if "stream_bytes_per_us" in carried
              else stream_link(passes[ONE], cal.stream.get(acc_name) if cal is not None else None))
    if stream is not None:
        for pm in passes.values():
            pm.set_stream(stream)
        if progress:
            h2d = passes[ONE].h2d
            log(f"streamed weights in a real load (calibrated): {stream.latency_us:.0f} us + "
                f"{stream.bytes_per_us / 1e3:.2f} GB/s per weight (a one-op copy: {h2d.latency_us:.0f} us + "
                f"{h2d.bytes_per_us / 1e3:.2f} GB/s)")
    for u, pm in passes.items():
        times = plain_times(pm, profile.calibration, profile)
        if times is None:
            continue
        pm.set_plain_times(times)
        if progress:
            log(f"host weights in plain memory at {u} token(s) (calibrated): " + ", ".join(
                f"{k.split(':', 1)[1]} {r:.2f}x" for k, r in sorted(plain_ratios(pm).items())) + " their repacked time")
    # every tensor of the file, not only those a graph reads: a weight no pass uses (MiniCPM3's
    # rope_factors_long at a context below its original length) still goes where its layer goes
    wbytes = {t.name: t.nbytes for t in model.tensors} | weight_bytes(g_mem)
    return PlanContext(model, acc_name, workload, profile, passes, wbytes, kv_bytes_per_layer(g_mem),
                       n_layer, settings, stream, split_us, frozenset(kept))


def _profile(path: str | Path, model: gguf_file.GGUFInfo, acc: str | None, workload: Workload, *,
             threads: int | None, op_offload: bool, progress: bool, calibration: str,
             attention: Mapping[str, Any], used: Iterable[int]) -> Profile:
    """The one-op profile of `path`, with its calibration from where `calibration` says
    (`build_context`), measured with `attention` (flash attention resolved, the KV cache's types).
    A shape-only file is never run: only the device model can cost it. used: the column counts the
    plan costs weight matmuls at; a model costed from the device model is timed at those of the
    profile's grid they are interpolated from (`grid_columns`), not at the others."""
    devices = [HOST, acc] if acc else [HOST]
    # the workload's decode pass of several sequences: its weights (the output at a column per
    # sequence) timed one-op, and the pass in the real graph when this model is calibrated (the
    # device model's reference has the one-op column counts of a one-sequence decode only)
    grid = tuple(sorted({*DEFAULT_TOKENS, workload.decode}))
    kw: dict[str, Any] = {"threads": threads, "n_tokens": grid,
                          "n_ctx": workload.n_ctx, "op_offload": op_offload, "progress": progress,
                          "decode_tokens": workload.decode, "routed": not model.shape_only, **attention}
    settings = default_settings(threads, op_offload=op_offload, **attention)
    if model.shape_only and calibration == "model":
        raise PlanError(f"{path}: a shape-only file (zero weights) cannot be calibrated by running it; "
                        "plan it from the device model (calibration 'device' or 'auto')")
    use_dm = calibration == "device" or model.shape_only
    dm = devicemodel.lookup(devices, settings) if use_dm else None
    if dm is None and use_dm:
        if progress:
            log(f"characterising {', '.join(devices)} once on a reference model"
                + (f" ({path} is shape-only: it is never run)" if model.shape_only else ""))
        ref_workload = Workload(prompt=64, gen=8, n_ubatch=64, flash_attn="on" if attention["flash_attn"] else "off",
                                cache_type_k=attention["type_k"], cache_type_v=attention["type_v"])
        dm = devicemodel.characterise(devices, settings, lambda ref: build_context(
            ref, acc, ref_workload, threads=threads, op_offload=op_offload, progress=progress,
            calibration="model"), progress=progress)
    if dm is None:  # the decode attention also timed after the cells the workload decodes after, on average
        past = round(workload.pass_attended()[workload.decode_pass] - 1)
        return profile_model(path, devices, decode_past=past, **kw)
    # no calibration of this model reads the other column counts, so they are not timed: every op
    # the plan costs is interpolated between the same ones as over the whole grid (a plan of other
    # pass sizes adds its counts to the same profile: measure.time_more_columns); the 30B-A3B's expert
    # matmuls at 32-256 columns took as long as at 512
    prof = profile_model(path, devices, calibrated=False, known=dm.known_times(devices),
                         **{**kw, "n_tokens": tuple(sorted(grid_columns(used, grid)))})
    prof.calibration = dm.calibration(list(prof.devices), devicemodel.n_vocab(model))
    n_expert = int(model.hparam("expert_count", 0) or 0)
    if n_expert and not model.shape_only:  # which experts a pass touches: the model's own (one host pass)
        from .cost.routing import measure as measure_routing

        prof.calibration.routing = measure_routing(path, n_expert, n_tokens=min(workload.n_ctx, 512),
                                                   threads=prof.settings.threads, mmap=True, progress=progress)
    if progress:
        log(f"costed from the device model {dm.key[:12]} (characterised on {Path(dm.reference['model']).name}): "
            "this model's graph is not run")
    return prof


def resolve_flash_attn(path: str | Path, acc: str | None, workload: Workload, n_layer: int) -> bool:
    """The workload's flash attention as a load pins it: on, off, or for "auto" what llama.cpp
    resolves with every layer on the host and with every layer on `acc` -- on only where both keep
    it (llama.cpp turns it off when a layer's attention would run on a device other than the
    layer's, the device lacking the op for that head size or cache type, and on whatever the
    devices under a quantized V cache, which needs it), so that any placement between them runs it
    as planned."""
    if workload.flash_attn != "auto":
        return workload.flash_attn == "on"
    for n_gpu_layers in (0, n_layer + 1) if acc else (0,):
        try:
            with GraphSession(path, devices=[acc] if acc else [], n_gpu_layers=n_gpu_layers, n_ctx=256, n_ubatch=1,
                              flash_attn="auto", type_k=workload.cache_type_k, type_v=workload.cache_type_v) as s:
                on = any(n.op == "FLASH_ATTN_EXT" for n in s.graph(1).nodes)
        except ModelFileError:  # llama.cpp refused the context: auto turned off under a quantized V cache
            on = False
        if not on:
            where = f"with every layer on {acc}" if n_gpu_layers else "on the host"
            if kvcache.is_quantized(workload.cache_type_v):
                raise PlanError(f"--flash-attn auto: llama.cpp turns flash attention off {where} for {path}, and "
                                f"--cache-type-v {workload.cache_type_v} needs it: use an f16 V cache")
            return False
    return True


def loader_kept(session: GraphSession, acc: str, n_layer: int) -> set[str]:
    """Weights llama.cpp's n_gpu_layers rule assigns to `acc` that its loader, asked for every layer
    (`session` loaded with n_gpu_layers = n_layer + 1), kept on the host: the device does not support
    the weight's op at the size the loader tests it with (lavapipe: a 151936-row output matrix)."""
    rule = set(layer_weights({t.name: t.nbytes for t in session.model.tensors}, n_layer + 1, n_layer))
    return {t.name for t in session.model_tensors() if t.device != acc and t.name in rule}


def split_cost(pm: PassModel, measured: Mapping[str, Any] | None) -> float | None:
    """What a split costs beyond the profiled hand-over, from the calibration's scattered decode
    pass (`realpass.measure_scatter`: weights alternating between the devices, a change of
    device at almost every weight): its measured wall time less the model's cost of that
    placement, over its changes of device (splits less the first). None without a measurement, or when the model already
    accounts for the pass (within 5%: nothing to attribute)."""
    if not measured or pm.acc is None:
        return None
    on_acc = frozenset(w for w in measured.get("on_acc", ()) if w in pm.weights)
    c = pm.cost(Placement(on_acc, int(measured.get("kv_layers", 0))))
    wall = float(measured["wall_us"])
    left = wall - c.total_us  # us the model does not see
    if c.n_splits < 4 or left <= 0.05 * wall:
        return None
    return left / (c.n_splits - 1)  # per change of device


def stream_link(pm: PassModel, measured: Mapping[str, Any] | None) -> Link | None:
    """The link streamed host weights take, from the calibration's streamed decode pass
    (`realpass.measure_stream`) in the model's own terms: its measured wall time less all the
    model costs for that pass but the streamed weights' copies is what those copies took. Of the
    link's two terms, the larger in that pass takes it all (large weights: the bandwidth, e.g. an
    H100's weights leaving pinned-or-not host memory; many small ones: the per-copy latency, e.g.
    an rpc-server synchronised before each copy). None without a measurement, or when the copies
    are too small a part of the pass to be measured."""
    if not measured or pm.acc is None:
        return None
    c = pm.cost(Placement(frozenset(), 0, {w: 1 for w in pm.weights}))
    # the bytes the copies moved, in the model's terms: of an expert tensor only the experts the
    # pass's token was routed to (the measurement's `weight_bytes` counts whole tensors)
    nbytes = c.stream_bytes
    wall = float(measured["wall_us"])
    left = wall - (c.total_us - c.stream_us)  # us the streamed copies took
    if c.n_streamed == 0 or nbytes <= 0 or left <= 0.1 * wall:
        return None
    lat0, bw0 = pm.stream.latency_us, pm.stream.bytes_per_us
    if nbytes / bw0 >= c.n_streamed * lat0:
        return Link(lat0, nbytes / max(left - c.n_streamed * lat0, 1e-3))
    return Link(max(left - nbytes / bw0, 0.0) / c.n_streamed, bw0)


def plain_times(pm: PassModel, cal: Calibration | None, profile: Profile | None = None) -> dict[int, float] | None:
    """What each host weight matmul that a default load repacks costs in plain memory (us), from the
    calibration's host passes with those weights repacked and plain (`realpass.measure_layouts`).
    A shape whose nodes took well over what timing a node alone adds (SHAPE_NODE_MIN) costs its
    repacked time times its ratio of plain to repacked node times (between timed pass sizes
    interpolated on log tokens); another shape its one-op plain time. All of them are then scaled
    alike so that the model costs the all-plain placement at the measured ratio of the two layouts'
    walls times its default cost. None without a measurement or anything to scale.

    A pass larger than the largest timed one (a full 8B's calibration times 1 and 32 tokens at 2
    threads; its workloads prompt in 512-token passes) carries the measurement's corrections to the
    one-op `profile`, which times every weight in both layouts at up to 512 columns, not its ratios:
    each shape costs its repacked time times the profile's ratio at the pass's columns times the
    shape's measured / profiled ratio at the largest timed pass, and the walls' measured / modelled
    ratio there scales them (`_beyond`). The q4_K matrices' plain / repacked ratio falls from 0.8
    at 32 columns to 0.55 at 512 on this VM's CPU, where the real graph's 512-token prompt ran 0.59
    (bench/results/2026-11-28-vm-layouts-zen4): a ratio carried from 32 tokens chose repacked
    weights that ran the prompt 1.7x slower."""
    measured = cal.layouts if cal is not None else None
    sizes = {int(n): v["plain_us"] / v["default_us"] for n, v in ((measured or {}).get("sizes") or {}).items()
             if v.get("default_us", 0) > 0 and v.get("plain_us", 0) > 0}
    scaled = pm.repacked_by_default()
    if not sizes or not scaled or measured is None:
        return None
    h_us = cal.devices[HOST].node_overhead_us if cal is not None and HOST in cal.devices else 0.0
    host = Placement(frozenset(), 0, {w: 1 << 30 for w in pm.weights})  # all on the host, nothing streamed
    default = pm.cost(host).total_us
    repacked = sum(pm.t_host[i] for i in scaled)  # us, as a default load runs them
    if profile is not None and pm.n_tokens > max(sizes):
        plain, g = _beyond(pm, measured, h_us, max(sizes), profile)
        ratio = g * (default - repacked + sum(plain.values())) / default if default > 0 else 0.0
    else:
        ratio = interpolated(sizes, pm.n_tokens)
        shapes = shape_ratios(measured, h_us, pm.n_tokens)
        plain = {i: (pm.t_host[i] * shapes[pm.shape_key[i]] if pm.shape_key.get(i) in shapes
                     else pm.plain_profiled[i]) for i in scaled}  # us, before the walls' ratio
    total = sum(plain.values())
    f = (ratio * default - default + repacked) / total if total > 0 else 0.0
    return {i: t * f for i, t in plain.items()} if f > 0 else None


def _beyond(pm: PassModel, measured: Mapping[str, Any], h_us: float, top: int,
            profile: Profile) -> tuple[dict[int, float], float]:
    """`plain_times` past the largest timed pass (`top` tokens): each repacked weight's plain time (us)
    from the profile's ratio at its columns and its shape's correction at `top` (the measured ratio over the
    profile's at the columns it had there), and the walls' correction at `top`: their measured ratio over
    what the shapes' node times there give (1 + plain - repacked node time over the default wall)."""
    ops = {op.index: op for op in target_ops(pm.graph)}
    at_top = shape_ratios(measured, h_us, top)

    def profiled(i: int, cols: int) -> float:  # one-op plain / repacked time of weight matmul i at cols columns
        rep = profile.op_time_us(HOST, ops[i], n=cols, layout=REPACK)
        return profile.op_time_us(HOST, ops[i], n=cols, layout=PLAIN) / rep if rep > 0 else 1.0

    plain: dict[int, float] = {}
    for i in pm.repacked_by_default():
        cols = ops[i].n_tokens  # a prompt's output matmul: its last token's column only
        k = pm.shape_key[i]
        c = at_top[k] / profiled(i, max(1, round(cols * top / pm.n_tokens))) if k in at_top else 1.0
        plain[i] = pm.t_host[i] * profiled(i, cols) * c
    v = measured["sizes"][str(top)]
    keys = {pm.shape_key[i] for i in plain}
    diff = sum(float(sh.get("plain_us", 0)) - float(sh.get("default_us", 0))
               for k, sh in (v.get("shapes") or {}).items() if k in keys)  # the timing overheads cancel
    modelled = 1.0 + diff / v["default_us"]
    return plain, (v["plain_us"] / v["default_us"]) / modelled if modelled > 0 else 1.0


def shape_ratios(measured: Mapping[str, Any], h_us: float, n_tokens: int) -> dict[str, float]:
    """Weight matmul shape class -> its plain / repacked ratio of node times in the calibration's
    passes (`measure_layouts`' `shapes`) at a pass of n_tokens, less what timing each node alone adds
    (h_us): the shapes whose repacked nodes took at least SHAPE_NODE_MIN times that at n_tokens, or at
    timed sizes on both sides of it (interpolated on log tokens; never carried beyond them: the tiny
    model's FFN matrices ran 1.75x slower plain at 32 tokens and 1.3x at 1, where timing was the noise)."""
    by: dict[str, dict[int, float]] = {}
    for n, v in (measured.get("sizes") or {}).items():
        for key, sh in (v.get("shapes") or {}).items():
            count = int(sh.get("nodes", 0))
            d, p = float(sh.get("default_us", 0)) - count * h_us, float(sh.get("plain_us", 0)) - count * h_us
            if count > 0 and d >= SHAPE_NODE_MIN * max(h_us, 1.0) * count and p > 0:
                by.setdefault(key, {})[int(n)] = p / d
    return {k: interpolated(r, n_tokens) for k, r in by.items() if min(r) <= n_tokens <= max(r)}


def plain_ratios(pm: PassModel) -> dict[str, float]:
    """Shape class -> what the pass model costs its host matmuls in plain memory over repacked."""
    plain: dict[str, float] = {}
    rep: dict[str, float] = {}
    for i in pm.repacked_by_default():
        k = pm.shape_key[i]
        plain[k] = plain.get(k, 0.0) + pm.t_layout[i][PLAIN]
        rep[k] = rep.get(k, 0.0) + pm.t_host[i]
    return {k: plain[k] / rep[k] for k in plain if rep[k] > 0}


def _check_profile(profile: Profile, acc: str | None, graphs: Mapping[int, Graph],
                   attention: Mapping[str, Any]) -> None:
    st = profile.settings
    theirs = {"flash_attn": st.flash_attn, "type_k": st.type_k, "type_v": st.type_v}
    if profile.calibration is not None and theirs != dict(attention):
        raise PlanError(f"profile {profile.key[:12]} was calibrated with flash attention "
                        f"{'on' if st.flash_attn else 'off'} and a {st.type_k}/{st.type_v} KV cache; the workload "
                        f"runs {'on' if attention['flash_attn'] else 'off'} and {attention['type_k']}/"
                        f"{attention['type_v']}: profile it with the workload's settings")
    for d in (HOST, acc) if acc else (HOST,):
        if d not in profile.ops:
            raise PlanError(f"profile {profile.key[:12]} was not measured on {d} (it has {', '.join(profile.ops)})")
    for g in graphs.values():
        for op in target_ops(g):
            profile.op_time_us(HOST, op)  # raises if the profile lacks this op shape
