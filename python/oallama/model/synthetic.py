"""`oallama synth`: synthetic GGUF models with the shapes of real ones (no model hub here).

``write_model(path, "llama3-8b", "q4_k_m")`` writes a file that real llama.cpp loads and runs:
a real architecture's tensor shapes and hyper-parameters, a real tokenizer and chat template
(see oallama.model.presets), and random but well-scaled weights, deterministic per seed.

* Which ggml type each tensor gets is llama.cpp's own decision: ``_core.quant_compute_types``
  runs llama-quantize's type selection (Q4_K_M puts Q6_K on output and on some attn_v /
  ffn_down layers, ...). Nothing here hard-codes a mix.
* Values are written as quantized blocks generated directly with numpy (random quants, chosen
  scales) for the bulk types f32/f16/bf16/q8_0/q4_0/q4_K/q6_K, streamed a few MB at a time, so
  an 8B-shaped Q4_K_M file (4.9 GB) takes ~20 s on 2 cores, disk-bound, and never exists in
  f32. Any other type llama.cpp may choose goes through ggml's own quantizer
  (``_core.quantize_rows``) on f32 rows.
* Scales: a weight of ne = [n_in, n_out] has std 1/sqrt(n_in) (variance preserving), norms ~1,
  biases small; embeddings and q/k are a bit louder so that deep stacks still depend on their
  input, and the output matrix is shaped so that greedy decoding is robust (see the constants
  below for what was measured).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType

from ..errors import ModelFileError
from ..options import add_arguments, from_args, option
from . import presets as _presets
from . import presets_arch as _presets_arch
from . import presets_moe as _presets_moe
from .presets import Preset

# every preset oallama can write: the dense ones, the mixtures of experts, the other tensor sets
PRESETS: dict[str, Preset] = {**_presets.PRESETS, **_presets_moe.MOE_PRESETS, **_presets_arch.ARCH_PRESETS}


def _tensor_layout(p: Preset, n_layer: int) -> list[_presets.TensorSpec]:
    if p.moe is not None:
        return _presets_moe.tensor_layout(p, n_layer)
    if p.arch in _presets_arch.ARCHS:
        return _presets_arch.tensor_layout(p, n_layer)
    return _presets.tensor_layout(p, n_layer)


def _arch_kvs(p: Preset, n_layer: int) -> list[tuple[str, Any, Any]]:
    extra = (_presets_moe.arch_kvs(p) if p.moe is not None else
             _presets_arch.arch_kvs(p) if p.arch in _presets_arch.ARCHS else [])
    return _presets.arch_kvs(p, n_layer) + extra

__all__ = [
    "FILE_TYPES",
    "PRESETS",
    "PlannedTensor",
    "random_blocks",
    "register",
    "tensor_plan",
    "write_model",
]

# --types accepted -> llama_ftype (general.file_type; LLAMA_FTYPE_MOSTLY_* in llama.h)
FILE_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q8_0": 7,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
    "mxfp4_moe": 38,  # experts MXFP4, every other weight Q8_0 (gpt-oss's own release)
}

# bump when the values written for a given (preset, type, seed) change
GENERATOR_VERSION = 1

# --- value scales ---------------------------------------------------------------------------
# Weights of ne = [n_in, n_out] have std 1/sqrt(n_in): outputs keep the scale of the (normed,
# ~unit per element) inputs, so every layer adds ~1 per element to the residual stream.
#
# Deep random transformers lose their input: attention averages over the context, and after
# 32-64 layers the final hidden state barely depends on the current token (greedy decoding
# then loops on 1-2 tokens). Two knobs keep the token in play, measured on llama3-8b (32
# layers) greedy: (1, 1) -> 4 distinct tokens in 24 steps, (4, 1.5) -> 24 distinct.
EMBD_STD = 4.0  # token_embd std: the token's share of the residual stays visible at the top
QK_GAIN = 1.5  # extra gain on q and k projections: attention scores std ~QK_GAIN^2, sharper
# output.weight: std OUTPUT_GAIN/sqrt(n_embd), logits have std ~OUTPUT_GAIN
OUTPUT_GAIN = 1.0
# Greedy robustness. Scaling output.weight uniformly cannot help: logit noise from a device's
# rounding scales with the logits. What helps is a heavy upper tail: each output row (each
# token) gets a log-normal gain exp(OUTPUT_ROW_SPREAD * z), z ~ N(0, 1), so the top logit
# stands clear of the runner-up. Measured through llama_cpp, greedy from a fixed prompt, as
# the relative gap (top1 - top2)/|top1| per step (tests/test_synthetic.py::test_logit_gap):
#   tiny q8_0 256 steps, spread 0: median 0.055, 9% of steps < 1e-2, 185 distinct tokens
#                        spread 0.5: median 0.108, 3% < 1e-2, 60 distinct
#                        spread 1.0: median 0.233, 0% < 1e-2, 11 distinct (loops)
#   spread 0.5, q4_k_m: llama3-8b 2 layers 0.157 / 0% (64 steps); 32 layers 0.098 / 6%;
#                       qwq-32b 1 layer 0.150 / 3%
# 0.5 doubles the typical gap and cuts near-ties ~3x while the text still depends on the
# context; more spread makes a few tokens win everywhere. Near-ties cannot be ruled out for
# random weights: compare logits with a tolerance, greedy tokens only as a smoke test.
OUTPUT_ROW_SPREAD = 0.5
# Tied embeddings (minicpm3) get no spread: token_embd is also the output matrix, and a token
# with a large gain would predict itself forever (its embedding, in the residual stream, scores
# ~gain^2 against its own row). For the same reason their embeddings are small (preset
# embd_std). minicpm3-4b q4_k_m: median gap 0.034 / 16% < 1e-2 (2 layers), 0.056 / 9% (62).
TIED_ROW_SPREAD = 0.0
# rows of control / unused / user-defined tokens (EOS, EOT, <|im_start|>, [PAD..]) are scaled
# down so greedy decoding never picks them: generation runs as long as asked, never stops early
SPECIAL_ROW_SCALE = 0.1
NORM_JITTER = 0.05  # norm weights: 1 +- uniform(NORM_JITTER)
BIAS_STD = 0.02
SINK_STD = 0.5  # gpt-oss attention sinks: one logit per head, joins each row's softmax

_F32, _F16, _BF16 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16
_Q8_0, _Q4_0 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0
_Q4_K, _Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K

# block layouts (ggml-common.h); numpy structured dtypes are packed (no padding)
_DT_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])  # 34 B / 32 weights: d * qs
_DT_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])  # 18 B / 32 weights: d * (nibble - 8)
# 144 B / 256 weights in 8 sub-blocks of 32: d * sc[j] * nibble - dmin * m[j]; sc/m 6-bit, packed
_DT_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
# 210 B / 256 weights in 16 sub-blocks of 16: d * sc[j] * (q6 - 32), q6 = ql nibble | qh 2 bits
_DT_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])

# rms of the integer part of a random block, to turn a target std into a block scale
_RMS_Q8 = math.sqrt((256**2 - 1) / 12 + 0.25)  # int8 uniform in [-128, 127]: 73.90
_RMS_Q4_0 = math.sqrt((16**2 - 1) / 12 + 0.25)  # nibble - 8 in [-8, 7]: 4.637
_RMS_Q4_K = math.sqrt((16**2 - 1) / 12)  # nibble - 7.5: 4.610 (zero mean, see _blocks_q4_k)
_RMS_Q6 = math.sqrt((64**2 - 1) / 12 + 0.25)  # q6 - 32 in [-32, 31]: 18.48

_CHUNK_BYTES = 4 << 20  # bytes of output generated per step


def _type_name(t: int) -> str:
    return GGMLQuantizationType(t).name.lower().replace("_k", "_K")


def _raw(bitgen: np.random.BitGenerator, n: int) -> np.ndarray:
    """n random bytes (SFC64 gives ~2 GB/s through random_raw; Generator.bytes ~0.15 GB/s)."""
    return bitgen.random_raw((n + 7) // 8).view(np.uint8)[:n]


def _uniform(bitgen: np.random.BitGenerator, n: int, std: np.ndarray | float) -> np.ndarray:
    """n f32 values, uniform with mean 0 and the given std (broadcast over the last axis)."""
    u = _raw(bitgen, 2 * n).view(np.int16).astype(np.float32) * np.float32(1 / 32768)  # [-1, 1)
    return u * (np.asarray(std, np.float32) * np.float32(math.sqrt(3)))


def _blocks_q8_0(bg: np.random.BitGenerator, std: np.ndarray) -> np.ndarray:
    nb = std.size
    raw = _raw(bg, nb * 33)
    blk = np.empty(nb, _DT_Q8_0)
    blk["qs"] = raw[: nb * 32].view(np.int8).reshape(nb, 32)
    sign = np.where(raw[nb * 32 :] & 1, -1.0, 1.0)  # random sign: int8's -0.5 mean cancels
    blk["d"] = (std * sign / _RMS_Q8).astype(np.float16)
    return blk.view(np.uint8)


def _blocks_q4_0(bg: np.random.BitGenerator, std: np.ndarray) -> np.ndarray:
    nb = std.size
    raw = _raw(bg, nb * 17)
    blk = np.empty(nb, _DT_Q4_0)
    blk["qs"] = raw[: nb * 16].reshape(nb, 16)
    sign = np.where(raw[nb * 16 :] & 1, -1.0, 1.0)
    blk["d"] = (std * sign / _RMS_Q4_0).astype(np.float16)
    return blk.view(np.uint8)


def _blocks_q4_k(bg: np.random.BitGenerator, std: np.ndarray) -> np.ndarray:
    nb = std.size
    raw = _raw(bg, nb * (128 + 8))
    blk = np.empty(nb, _DT_Q4_K)
    blk["qs"] = raw[: nb * 128].reshape(nb, 128)
    # sub-block scales in [32, 63] (6 bits, like ggml's quantizer produces), mins equal to them
    # and dmin = 7.5 d: w = d*sc*q - 7.5*d*sc = d*sc*(q - 7.5), zero mean for uniform nibbles
    sc = 32 + (raw[nb * 128 :].reshape(nb, 8) & 31)
    m = sc
    scales = np.empty((nb, 12), np.uint8)
    # get_scale_min_k4(): j < 4 in the low 6 bits of [j] / [j+4]; j >= 4 split over the low /
    # high nibble of [j+4] and the top 2 bits of [j-4] / [j]
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    blk["scales"] = scales
    rms_sc = np.sqrt(np.mean(sc.astype(np.float32) ** 2, axis=1))
    d = (std / (_RMS_Q4_K * rms_sc)).astype(np.float16)
    blk["d"] = d
    blk["dmin"] = (d.astype(np.float32) * 7.5).astype(np.float16)
    return blk.view(np.uint8)


def _blocks_q6_k(bg: np.random.BitGenerator, std: np.ndarray) -> np.ndarray:
    nb = std.size
    raw = _raw(bg, nb * (192 + 16))
    blk = np.empty(nb, _DT_Q6_K)
    blk["ql"] = raw[: nb * 128].reshape(nb, 128)
    blk["qh"] = raw[nb * 128 : nb * 192].reshape(nb, 64)
    sbits = raw[nb * 192 :].reshape(nb, 16)
    mag = 64 + (sbits & 63).astype(np.int16)  # |scale| in [64, 127], random sign: zero mean
    blk["scales"] = np.where(sbits & 64, -mag, mag).astype(np.int8)
    rms_sc = np.sqrt(np.mean(mag.astype(np.float32) ** 2, axis=1))
    blk["d"] = (std / (_RMS_Q6 * rms_sc)).astype(np.float16)
    return blk.view(np.uint8)


_BLOCK_GEN = {_Q8_0: _blocks_q8_0, _Q4_0: _blocks_q4_0, _Q4_K: _blocks_q4_k, _Q6_K: _blocks_q6_k}


def _encode(type_id: int, rows: np.ndarray) -> np.ndarray:
    """f32 rows [n_rows, n_per_row] -> that type's bytes [n_rows, row_bytes]."""
    n_rows = rows.shape[0]
    if type_id == _F32:
        out = rows.astype(np.float32)
    elif type_id == _F16:
        out = rows.astype(np.float16)
    elif type_id == _BF16:
        bits = rows.astype(np.float32).view(np.uint32)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    else:
        from .. import _core  # ggml's own quantizer for everything else

        return np.frombuffer(_core.quantize_rows(int(type_id), np.ascontiguousarray(rows, np.float32)),
                             np.uint8).reshape(n_rows, -1)
    return out.view(np.uint8).reshape(n_rows, -1)


def random_blocks(type_id: int, row_std: np.ndarray, n_per_row: int,
                  bitgen: np.random.BitGenerator) -> np.ndarray:
    """Random weights of ggml type `type_id` with mean 0 and std row_std[i] in row i.

    Returns the rows' bytes, uint8 [len(row_std), row_bytes]. Bulk types are generated as
    blocks directly; others are quantized from uniform f32 rows by ggml.
    """
    row_std = np.asarray(row_std, np.float32)
    n_rows = row_std.size
    blck, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    if n_per_row % blck:
        raise ValueError(f"rows of {n_per_row} are not a multiple of {_type_name(type_id)}'s block of {blck}")
    gen = _BLOCK_GEN.get(GGMLQuantizationType(type_id))
    if gen is not None:
        nb = n_per_row // blck
        return gen(bitgen, np.repeat(row_std, nb)).reshape(n_rows, nb * tsize)
    rows = _uniform(bitgen, n_rows * n_per_row, np.repeat(row_std, n_per_row)).reshape(n_rows, n_per_row)
    return _encode(type_id, rows)


# --------------------------------------------------------------------------------------------
# the plan: tensors and their types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # ggml order
    type_id: int  # ggml type
    kind: str  # how the values are drawn (TensorSpec.kind)

    @property
    def nbytes(self) -> int:
        blck, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        return math.prod(self.shape) // blck * tsize


def _preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


def _ftype(qtype: str) -> int:
    try:
        return FILE_TYPES[qtype.lower()]
    except KeyError:
        raise ValueError(f"unknown type {qtype!r}; valid types: {', '.join(FILE_TYPES)}") from None


def tensor_plan(preset: str, qtype: str, n_layer: int | None = None) -> list[PlannedTensor]:
    """Every tensor of the model with the ggml type llama-quantize would give it for `qtype`."""
    from .. import _core

    p, ftype = _preset(preset), _ftype(qtype)
    nl = _n_layer(p, n_layer)
    specs = _tensor_layout(p, nl)
    # llama.cpp's own choice (llama_tensor_get_type via llama_quant_compute_types). Every ftype
    # in FILE_TYPES has a default type (f16 included: 2-d weights -> f16); -1 means "kept as
    # is" (norms, biases, other 1-d tensors), which we store as f32 like the converter does.
    types = _core.quant_compute_types(_presets.quant_hparams(p, nl), [s.name for s in specs],
                                      [list(s.shape) for s in specs], ftype)
    return [PlannedTensor(s.name, s.shape, int(_F32) if t < 0 else int(t), s.kind)
            for s, t in zip(specs, types, strict=True)]


def _n_layer(p: Preset, n_layer: int | None) -> int:
    if n_layer is None:
        return p.n_layer
    if not 1 <= int(n_layer) <= 512:  # LLAMA_MAX_LAYERS
        raise ValueError(f"n_layer must be in [1, 512], got {n_layer}")
    return int(n_layer)


# --------------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------------


def _bitgen(seed: int, name: str, *stream: int) -> np.random.BitGenerator:
    """An independent stream per (seed, tensor, purpose, chunk): values do not depend on which
    other tensors exist (a 2-layer model has the same blk.0 as the full one)."""
    return np.random.SFC64(np.random.SeedSequence([seed, zlib.crc32(name.encode()), *stream]))


def _row_gains(seed: int, token_types: np.ndarray, spread: float) -> np.ndarray:
    """Per-token gain of the output rows [n_vocab]: log-normal spread, specials damped."""
    z = np.random.Generator(_bitgen(seed, "output.weight", 1)).standard_normal(token_types.size)
    g = np.exp(spread * z - spread**2)  # E[g^2] = 1
    special = np.isin(token_types, [TokenType.CONTROL, TokenType.UNUSED, TokenType.USER_DEFINED,
                                    TokenType.UNKNOWN])
    g[special] *= SPECIAL_ROW_SCALE
    return g.astype(np.float32)


def _small_values(t: PlannedTensor, p: Preset, seed: int) -> np.ndarray:
    """f32 values of norms, biases and rope factors (1-d, a few thousand elements)."""
    n = math.prod(t.shape)
    if t.kind in ("norm", "output_norm"):
        mean = p.output_norm if t.kind == "output_norm" else 1.0
        return mean * (1.0 + _uniform(_bitgen(seed, t.name, 0), n, NORM_JITTER / math.sqrt(3)))
    if t.kind == "bias":
        return _uniform(_bitgen(seed, t.name, 0), n, BIAS_STD)
    if t.kind == "sinks":
        return _uniform(_bitgen(seed, t.name, 0), n, SINK_STD)
    # longrope frequency divisors, shaped like MiniCPM3's: ~1 for short contexts, growing
    # towards the low frequencies for long ones
    if t.kind == "rope_short":
        return np.linspace(1.0, 1.25, n, dtype=np.float32)
    if t.kind == "rope_long":
        return np.geomspace(1.0, 32.0, n).astype(np.float32)
    raise AssertionError(t.kind)


def _row_std(t: PlannedTensor, p: Preset, gains: np.ndarray | None) -> np.ndarray:
    n_in, n_rows = t.shape[0], math.prod(t.shape[1:])
    if t.kind == "embd":
        std = np.full(n_rows, EMBD_STD if p.embd_std is None else p.embd_std, np.float32)
        return std * gains if gains is not None else std  # tied: also the output matrix
    if t.kind == "output":
        assert gains is not None
        return (OUTPUT_GAIN / math.sqrt(n_in)) * gains
    if t.kind in ("linear", "qk", "q_mla"):
        g = {"linear": 1.0, "qk": QK_GAIN, "q_mla": QK_GAIN**2}[t.kind]
        return np.full(n_rows, g / math.sqrt(n_in), np.float32)
    raise AssertionError(t.kind)


def _tensor_data(t: PlannedTensor, p: Preset, seed: int, token_types: np.ndarray) -> Iterator[np.ndarray]:
    """The tensor's bytes, a few MB at a time."""
    if t.kind in ("norm", "output_norm", "bias", "sinks", "rope_short", "rope_long"):
        vals = _small_values(t, p, seed).reshape(-1, t.shape[0])
        yield _encode(t.type_id, vals).reshape(-1)
        return
    gains = None
    if t.kind == "output":
        gains = _row_gains(seed, token_types, OUTPUT_ROW_SPREAD)
    elif t.kind == "embd" and p.tied_output:
        gains = _row_gains(seed, token_types, TIED_ROW_SPREAD)
    std = _row_std(t, p, gains)
    n_per_row = t.shape[0]
    row_bytes = t.nbytes // std.size
    step = max(1, _CHUNK_BYTES // row_bytes)
    for k, r0 in enumerate(range(0, std.size, step)):
        yield random_blocks(t.type_id, std[r0 : r0 + step], n_per_row, _bitgen(seed, t.name, 0, k)).reshape(-1)


# --------------------------------------------------------------------------------------------
# the file
# --------------------------------------------------------------------------------------------

class _Progress:
    def __init__(self, enabled: bool, n: int, total_bytes: int) -> None:
        self.enabled, self.n, self.total = enabled, n, total_bytes
        self.t0 = self.last = time.perf_counter()
        self.tty = enabled and sys.stderr.isatty()

    def update(self, i: int, name: str, done: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9) / 1e6
        msg = (f"synth: tensor {i}/{self.n} {name:<28.28} {done / 1e6:9.1f}/{self.total / 1e6:.1f} MB "
               f"{rate:7.1f} MB/s")
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + msg, end=end, file=sys.stderr, flush=True)


def write_model(path: str | os.PathLike[str], preset: str = "tiny", qtype: str = "q8_0", *, seed: int = 0,
                n_layer: int | None = None, progress: bool = True, shape_only: bool = False) -> Path:
    """Write a synthetic GGUF of `preset`'s shape, quantized like llama-quantize's `qtype`.

    Same arguments -> byte-identical file. `n_layer` overrides the layer count (real per-layer
    shapes, fewer layers). The file appears atomically: it is written beside `path` under a
    temporary name and renamed at the end.

    shape_only: leave every tensor's data zero, as a sparse file (instant, no disk used). The
    file is complete and loads; llama.cpp's metadata-only loads (inspect, plan) never read the
    data, so a 32B-shaped model can be planned for without writing 20 GB. Not for inference.
    """
    p = _preset(preset)
    ftype = _ftype(qtype)
    if not 0 <= int(seed) < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    seed = int(seed)
    nl = _n_layer(p, n_layer)
    plan = tensor_plan(preset, qtype, nl)
    tok = _presets.build_tokenizer(p)

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = GGUFWriter(tmp, p.arch)
    w.add_type("model")
    w.add_name(f"oallama synthetic {p.name}")
    w.add_file_type(ftype)
    w.add_quantization_version(2)  # GGML_QNT_VERSION
    for key, val, vt in _arch_kvs(p, nl):
        w.add_key_value(key, val, vt)
    for key, kv in tok.kvs.items():  # GGUFWriter wants arrays as sequences (~0.5 s for 400k items)
        val = kv.value.tolist() if isinstance(kv.value, np.ndarray) else kv.value
        w.add_key_value(key, val, kv.type, kv.sub_type)
    w.add_string("oallama.synthetic.preset", p.name)
    w.add_string("oallama.synthetic.type", qtype.lower())
    w.add_uint64("oallama.synthetic.seed", seed)
    w.add_uint32("oallama.synthetic.generator_version", GENERATOR_VERSION)
    if shape_only:  # the planner never runs such a file (gguf_file.GGUFInfo.shape_only)
        w.add_bool("oallama.synthetic.shape_only", True)
    for t in plan:
        # add_tensor_info takes numpy order (outermost first) and element counts
        w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.nbytes,
                          raw_dtype=GGMLQuantizationType(t.type_id))

    total = sum(t.nbytes for t in plan)
    prog = _Progress(progress, len(plan), total)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        f = w.fout[0]
        align = w.data_alignment
        done = 0
        if shape_only:
            f.flush()
            start = f.tell() + (-f.tell() % align)
            end = start + sum(-(-t.nbytes // align) * align for t in plan)
            os.truncate(tmp, end)  # zeros, as a hole
            plan = []
        for i, t in enumerate(plan, 1):
            f.write(b"\0" * (-f.tell() % align))  # tensor data starts aligned (GGUFWriter does the same)
            n = 0
            for chunk in _tensor_data(t, p, seed, tok.token_types):
                f.write(chunk.data)
                n += chunk.size
                prog.update(i, t.name, done + n)
            if n != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {n} bytes, expected {t.nbytes}")
            done += n
        if plan:
            f.write(b"\0" * (-f.tell() % align))
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    prog.update(len(plan), "done", total, final=True)
    return path


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


@dataclass
class SynthOptions:
    """Everything `oallama synth` takes (its flags are generated from these fields)."""

    output: Path = option(short="-o", help="the .gguf to write")
    preset: str = option("tiny", short="-p", choices=list(PRESETS), help="model shape")
    qtype: str = option("q8_0", flag="--type", short="-t", choices=list(FILE_TYPES),
                        help="file type, as llama-quantize names it")
    seed: int = option(0, minimum=0, help="random seed")
    layers: int | None = option(None, minimum=1, metavar="N", help="override the layer count",
                                default_help="the preset's")
    quiet: bool = option(False, short="-q", help="no progress on stderr")
    shape_only: bool = option(False, help="zero (sparse) tensor data: instant; for inspect/plan at full size, "
                              "not for inference")


def _cmd_synth(args: argparse.Namespace) -> int:
    o = from_args(SynthOptions, args)
    t0 = time.perf_counter()
    try:
        path = write_model(o.output, o.preset, o.qtype, seed=o.seed, n_layer=o.layers, progress=not o.quiet,
                           shape_only=o.shape_only)
    except (ValueError, OSError) as e:  # a bad option (layers, seed) or a place that cannot be written
        what = f"{e.strerror} ({e.filename})" if isinstance(e, OSError) and e.strerror else str(e)
        raise ModelFileError(f"{o.output}: cannot write the model: {what}") from None
    dt = time.perf_counter() - t0
    from .gguf_file import read

    info = read(path)
    size = path.stat().st_size
    print(f"wrote {path}: {o.preset} {o.qtype} seed {o.seed}, {info.hparam('block_count')} layers, "
          f"{len(info.tensors)} tensors, {size / 1e9:.3f} GB in {dt:.2f} s ({size / 1e6 / max(dt, 1e-9):.0f} MB/s)")
    return 0


def register(subparsers: Any) -> None:
    """Add `oallama synth` to the CLI."""
    lines = [f"  {name:<14} {p.arch:<9} {p.description}" for name, p in PRESETS.items()]
    ap = subparsers.add_parser(
        "synth",
        help="write a synthetic GGUF with a real model's shapes and tokenizer",
        description="Write a synthetic GGUF that llama.cpp loads and runs: a real architecture's "
        "shapes, tokenizer and chat template, random well-scaled weights (deterministic per seed), "
        "quantized with llama-quantize's own per-tensor type mix.",
        epilog="presets:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(ap, SynthOptions)
    ap.set_defaults(func=_cmd_synth)
