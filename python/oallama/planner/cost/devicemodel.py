"""A device model: what each device costs beyond a model's own weight matmuls, measured once per
set of devices and shared by every model planned on them.

A plan needs, besides each weight matmul's one-op time (profile.py: seconds per model), what one
op timed alone cannot show: every other op, a pass's time outside its graph, the link weights
really stream over, what a change of device costs. Per-model calibration (calibrate.py) measures
these in the model's own real graph: a minute or more for every model, and a shape-only file
(zero weights) cannot be run at all. The device model measures them once, in the real graph of a
reference model (`REFERENCE`: Llama 3 8B's widths and vocabulary, 2 layers, Q4_K_M), keeps the
terms that describe the devices rather than that model, and costs any other model from them:

  per device  node_overhead_us  what timing one node alone adds (us)
              ops[op]           us = a + b * work, work = multiply-adds (a matmul of two
                                activations) or bytes read + written (any other op)
              matmul_scale      weight matmuls' real-graph time over their one-op time
  outside     a pass's time outside its graph (us): prompt a + b * n_tokens, decode `decode_us`;
              of each, sampling the token grows with the vocabulary: `sample_us_per_id` * n_vocab
  per link    streamed weights (latency us, bytes/us), a change of device (us per split), and
              what an attached rpc-server costs a pass that does not use it (`detached`, us)
  matmuls     the reference's one-op weight matmul times (per device, and per host layout), each
              layer weight's at every column count of a profile (DEFAULT_TOKENS: its last layer
              runs some at 1 column only, the same weight elsewhere in a deeper model at all): a
              model with the same weight shapes and types (an 8B of Llama 3's widths) takes them
              rather than timing them again (profile.KnownTimes)

The reference's per-pass-size anchors and per-shape shares (corrections to that model's passes),
its plain-layout ratios (per shape: a new model's one-op plain times stand) and a mixture of
experts' routing (per model) are not carried.

Cached in $OALLAMA_CACHE/devices/<key>.json; the key is the devices' identities, the settings and
the build, as a profile's is. `context.build_context` costs a shape-only file from it (characterising
the devices first where they have none) and any model when asked (calibration "device").

Held out (bench/results/2026-11-25-vm-heldout-devicemodel): Phi-3-mini's passes as well as its own
calibration, Gemma 3 270M's decode 20-53% too slow, mostly op kinds the reference has not (GEGLU,
SCALE: costed by a "*" fit over every op) and its 256-wide heads' attention. With an unseen op kind at
the median kind's line (version 4; bench/results/2026-11-26-vm-devicemodel-unseen-ops) what is left of
it is the attention matmuls, whose line the reference fits at its own head sizes. The reference's
attention lines fitted to its spans timed whole at two KV lengths (calibration method 30, version 6)
and a decode pass's KQ and KQV costed by what they read (methods 29, 31): bench/results/2026-11-26-vm-setrows,
bench/results/2026-11-26-vm-heldout-method31-device. On an H100 machine, held out, it costs host-only
placements 18% too slow (bench/results/2026-11-26-h100-heldout).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..._files import cache_base, read_json, write_json
from ...errors import ProfileError
from ...model import gguf_file
from ...runtime import devices as devmod
from ..graph import target_ops
from .calfit import Calibration, DeviceCalibration, OpFit
from .calibrate import VERSION as METHOD  # the reference's calibration method: its fits are the terms
from .measure import time_more_columns
from .profile import DEFAULT_TOKENS, KnownTimes, Settings, build_info, device_identity

VERSION = 6  # of the device model's terms: part of its cache key; 2: matmuls; 3: at every column count; 4: an unseen
# op kind at the median byte-work kind's line (calfit.unseen_op_fit); 5: attention's growth from spans (attnspan.py);
# 6: those spans part of the reference's calibration, its attention lines fitted to them (calfit.span_lines)
REFERENCE = ("llama3-8b", "q4_k_m", 2)  # preset, type, layers of the model the devices are characterised on
SCHEMA = "oallama.devicemodel/1"


def cache_dir() -> Path:
    return cache_base() / "devices"


def device_key(devices: list[str], settings: Settings) -> str:
    """What a device model is valid for: the devices (as profiles identify them), the settings
    without the calibration flag, the build, this module's VERSION and the calibration's method."""
    devs = [devmod.resolve(d) for d in devices]
    doc = {"schema": SCHEMA, "version": VERSION, "method": METHOD, "devices": [device_identity(d) for d in devs],
           "settings": {**settings.as_dict(), "calibrate": None}, "build": build_info()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def n_vocab(info: gguf_file.GGUFInfo) -> int:
    """Rows of the model's token embedding (its vocabulary; 0 when it has none)."""
    try:
        return int(info.tensor("token_embd.weight").shape[1])
    except KeyError:
        return 0


@dataclass
class DeviceModel:
    key: str
    names: list[str]  # the devices' names when measured, the CPU first
    terms: dict[str, dict[str, Any]]  # device name -> node_overhead_us, matmul_scale, ops {op: OpFit fields}
    outside: dict[str, float]  # pass_a_us, pass_b_us, decode_us (all less sampling), sample_us_per_id
    links: dict[str, dict[str, float]]  # accelerator -> split_us, stream_latency_us, stream_bytes_per_us
    detached: dict[str, list[float]]  # accelerator -> (a, b): us = a + b * n_tokens
    reference: dict[str, Any]  # the reference model, its n_vocab, the characterisation's seconds
    # the reference's one-op weight matmul times: {"ops": device -> op key -> stats, "layouts": layout -> ...}
    matmuls: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def calibration(self, names: list[str], vocab: int) -> Calibration:
        """The terms as a model of `vocab` token ids is costed with, under today's device names
        (`names`, positionally the measured ones: an rpc-server listens on another port)."""
        ren = dict(zip(self.names, names, strict=False))
        devs = {ren.get(d, d): DeviceCalibration(t["node_overhead_us"], {op: OpFit(**f) for op, f in t["ops"].items()},
                                                 t["matmul_scale"], t.get("n_matmuls", 0))
                for d, t in self.terms.items()}
        sample = self.outside["sample_us_per_id"] * vocab
        cal = Calibration(devs, self.outside["pass_a_us"] + sample, self.outside["pass_b_us"],
                          detached={ren.get(d, d): list(v) for d, v in self.detached.items()},
                          decode_us=self.outside["decode_us"] + sample)
        cal.links = {ren.get(d, d): dict(v) for d, v in self.links.items()}
        return cal

    def known_times(self, names: list[str]) -> KnownTimes:
        """The reference's one-op matmul times under today's device names (as `calibration`)."""
        ren = dict(zip(self.names, names, strict=False))
        return KnownTimes({ren.get(d, d): dict(t) for d, t in self.matmuls.get("ops", {}).items()},
                          {lay: dict(t) for lay, t in self.matmuls.get("layouts", {}).items()})

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @staticmethod
    def from_json(doc: dict[str, Any], path: str | Path = "") -> DeviceModel:
        if doc.get("schema") != SCHEMA:
            raise ProfileError(f"{path}: not a device model of schema {SCHEMA} (got {doc.get('schema')!r})")
        try:
            return DeviceModel(doc["key"], list(doc["names"]), dict(doc["terms"]), dict(doc["outside"]),
                               dict(doc["links"]), dict(doc["detached"]), dict(doc["reference"]),
                               dict(doc.get("matmuls", {})), float(doc.get("created", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{path}: corrupt device model ({type(e).__name__}: {e})") from None

    def save(self) -> Path:
        p = cache_dir() / f"{self.key}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, self.to_json())
        return p


def lookup(devices: list[str], settings: Settings) -> DeviceModel | None:
    """The cached device model of these devices and settings, if any."""
    p = cache_dir() / f"{device_key(devices, settings)}.json"
    if not p.exists():
        return None
    return DeviceModel.from_json(read_json(p, "device model", ProfileError), p)


def from_reference(key: str, names: list[str], cal: Calibration, *, split_us: float | None,
                   stream: Any | None, sample_us: float, vocab: int, reference: dict[str, Any],
                   matmuls: dict[str, dict[str, dict[str, Any]]] | None = None) -> DeviceModel:
    """The device terms of a reference model's calibration `cal` (names: its devices, the CPU
    first), with the split cost and streamed-weight link its planning context derived from it
    (`context.split_cost`, `context.stream_link`: None where not measured) and the time of
    sampling one token from its `vocab` logits (us); matmuls: its one-op weight matmul times."""
    terms = {d: {"node_overhead_us": dc.node_overhead_us, "matmul_scale": dc.matmul_scale, "n_matmuls": dc.n_matmuls,
                 "ops": {op: asdict(f) for op, f in dc.ops.items()}} for d, dc in cal.devices.items()}
    decode = cal.decode_us if cal.decode_us is not None else cal.pass_overhead_us(1)
    outside = {"pass_a_us": max(cal.pass_a_us - sample_us, 0.0), "pass_b_us": cal.pass_b_us,
               "decode_us": max(decode - sample_us, 0.0), "sample_us_per_id": sample_us / max(vocab, 1)}
    links: dict[str, dict[str, float]] = {}
    for acc in names[1:]:
        ln: dict[str, float] = {}
        if split_us is not None:
            ln["split_us"] = float(split_us)
        if stream is not None:
            ln["stream_latency_us"], ln["stream_bytes_per_us"] = float(stream.latency_us), float(stream.bytes_per_us)
        links[acc] = ln
    return DeviceModel(key, list(names), terms, outside, links, {d: list(v) for d, v in cal.detached.items()},
                       reference, matmuls or {})


def reference_model(progress: bool = True) -> Path:
    """The reference model's file: $OALLAMA_REFERENCE_MODEL, else `REFERENCE` written once into the
    cache (a synthetic model: real shapes and weights drawn as `oallama synth` draws them)."""
    env = os.environ.get("OALLAMA_REFERENCE_MODEL")
    if env:
        return Path(env)
    from ...model import synthetic

    preset, qtype, layers = REFERENCE
    p = cache_base() / "models" / f"reference-{preset}-{qtype}-{layers}l.gguf"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        if progress:
            print(f"device model: writing the reference model {p} ({preset} {qtype}, {layers} layers)",
                  file=sys.stderr, flush=True)
        synthetic.write_model(p, preset, qtype, n_layer=layers, progress=progress)
    return p


def _sample_us(path: Path, threads: int, reps: int = 20) -> float:
    """Sampling one token from a pass's logits as the generation loop does (us; outside.sample_us)."""
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama
    from .outside import sample_us

    llm = Llama(str(path), n_gpu_layers=0, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    try:
        llm.eval(prompt_tokens(llm, 8))
        return sample_us(llm, reps)
    finally:
        llm.close()


def characterise(devices: list[str], settings: Settings, plan_reference: Callable[[Path], Any], *,
                 progress: bool = True) -> DeviceModel:
    """Characterise `devices` (the CPU first, at most one accelerator) on the reference model and
    cache the result. `plan_reference(path)`: the reference's planning context with its own
    calibration (`context.build_context`: the one run of a real graph), whose split and stream
    links it derives."""
    t0 = time.perf_counter()
    ref = reference_model(progress)
    info = gguf_file.check_model(ref)
    if info.shape_only:
        raise ProfileError(f"{ref}: the reference model is shape-only (zero weights): it cannot be run")
    ctx = plan_reference(ref)
    layer_weights = {(op.op, op.weight_type, op.weight_shape): DEFAULT_TOKENS for pm in ctx.passes.values()
                     for op in target_ops(pm.graph) if op.layer is not None}
    n = time_more_columns(ctx.profile, layer_weights)
    if progress and n:
        print(f"device model: timed {n} layer weight shape(s) at the column counts the reference's graph lacks",
              file=sys.stderr, flush=True)
    cal = ctx.profile.calibration
    if cal is None:
        raise ProfileError(f"{ref}: the reference model's calibration is missing")
    vocab = n_vocab(info)
    dm = from_reference(device_key(devices, settings), list(ctx.profile.devices), cal, split_us=ctx.split_us,
                        stream=ctx.stream, sample_us=_sample_us(ref, settings.threads), vocab=vocab,
                        reference={"model": str(ref), "identity": info.identity(), "n_vocab": vocab,
                                   "calibration_s": cal.elapsed_s, "elapsed_s": 0.0},
                        matmuls={"ops": {d: {k: v for k, v in t.items() if k.startswith("MUL_MAT:")}
                                         for d, t in ctx.profile.ops.items()},
                                 "layouts": {lay: {k: v for k, v in t.items() if k.startswith("MUL_MAT:")}
                                             for lay, t in ctx.profile.layouts.items()}})
    dm.reference["elapsed_s"] = time.perf_counter() - t0
    path = dm.save()
    if progress:
        print(f"device model: {', '.join(devices)} characterised in {dm.reference['elapsed_s']:.0f} s -> {path}",
              file=sys.stderr, flush=True)
    return dm
