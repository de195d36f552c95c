"""A mixture of experts' routing as its real graph does it: how many distinct experts a pass of
n tokens touches, per layer.

Why it matters: when ggml's scheduler streams a host expert tensor to the accelerator for a
MUL_MAT_ID, it reads the pass's routing ids and copies only the experts used
(ggml_backend_sched_compute_splits), so a streamed expert tensor costs its routed share. Uniform
routing gives 1 - (1 - k/E)^n of the tensor at n tokens (`schedmodel.expert_fraction`); a model's
tokens share experts more than that, and some experts are rarely chosen at all (qwen3moe-small,
16-token pass: 59% of the experts against 64% uniform; 91-94% against 100% at 512 tokens).

Measured by one prompt pass of n_tokens tokens through the model on the host with the routing
recorded (`_core.RouteRecorder`: llama.cpp's ffn_moe_topk ids per layer); a pass of n tokens
(a ubatch: n consecutive tokens) touches, on average over the windows of n consecutive tokens
of that pass, `distinct[layer][n]` experts. Part of the calibration (calibrate.py), which is
cached by the model's shapes; routing depends on its weights too, so a routing carries the
`fingerprint` of the model's router weights and a cached one of another model is measured again.
"""

from __future__ import annotations

import hashlib
import math
import mmap as mmap_mod
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ... import _core
from ...errors import OallamaError, ProfileError

_ROUTE = re.compile(r"^ffn_moe_topk-(\d+)$")  # llama.cpp's name of a layer's top-k expert ids
_ROUTER = re.compile(r"^blk\.\d+\.ffn_gate_inp\.weight$")  # a layer's router [n_embd, n_expert]


def fingerprint(path: str | Path) -> str:
    """sha256 over the bytes of the model's router weights (what a routing depends on beyond the
    shapes: another model of the same shapes routes otherwise)."""
    from ...model import gguf_file

    info = gguf_file.check_model(path)
    h = hashlib.sha256()
    with open(info.path, "rb") as f, mmap_mod.mmap(f.fileno(), 0, access=mmap_mod.ACCESS_READ) as m:
        for t in sorted(info.tensors, key=lambda t: t.name):
            if _ROUTER.match(t.name):
                start = info.data_offset + t.offset
                h.update(t.name.encode())
                h.update(m[start:start + t.nbytes])
    return h.hexdigest()


def window_sizes(n_tokens: int) -> list[int]:
    """The pass sizes a routing is summarised at: powers of two below n_tokens, and n_tokens."""
    sizes, n = [], 1
    while n < n_tokens:
        sizes.append(n)
        n *= 2
    return [*sizes, n_tokens]


def distinct_experts(ids: np.ndarray, n_expert: int, sizes: Sequence[int]) -> dict[int, float]:
    """ids [n_tokens, n_used] (one layer's routing in one pass) -> n -> the mean number of distinct
    experts over the windows of n consecutive tokens (every start position)."""
    n_tokens = ids.shape[0]
    hot = np.zeros((n_tokens + 1, n_expert), dtype=np.int32)  # [n_tokens + 1, n_expert]: routed counts so far
    np.add.at(hot[1:], (np.repeat(np.arange(n_tokens), ids.shape[1]), ids.ravel()), 1)
    np.cumsum(hot, axis=0, out=hot)
    out = {}
    for n in sizes:
        if 1 <= n <= n_tokens:
            out[n] = float(((hot[n:] - hot[:-n]) > 0).sum(axis=1).mean())
    return out


@dataclass
class Routing:
    n_expert: int
    n_used: int  # experts per token
    n_tokens: int  # tokens of the measured pass
    distinct: dict[int, dict[int, float]] = field(default_factory=dict)  # layer -> n -> mean distinct experts
    elapsed_s: float = 0.0
    model: str = ""  # `fingerprint` of the model measured

    @staticmethod
    def from_routes(routes: Sequence[Any], n_expert: int, elapsed_s: float = 0.0, model: str = "") -> Routing:
        """From one pass's recorded routes (`_core.Route`, one per layer)."""
        layers: dict[int, np.ndarray] = {}
        for r in routes:
            m = _ROUTE.match(r.name)
            if m is not None:
                layers[int(m[1])] = np.asarray(r.ids)
        if not layers:
            raise ProfileError("routing: the pass recorded no ffn_moe_topk ids (not a mixture of experts?)")
        # llama.cpp runs a prompt's last layer on its output tokens only: such a layer's few
        # tokens say nothing of a larger pass (`share` takes the other layers' mean for it)
        n_tokens = max(ids.shape[0] for ids in layers.values())
        n_used = next(iter(layers.values())).shape[1]
        layers = {il: ids for il, ids in layers.items() if ids.shape[0] == n_tokens}
        bad = [il for il, ids in layers.items() if ids.size and (ids.min() < 0 or ids.max() >= n_expert)]
        if bad:
            raise ProfileError(f"routing: layer {bad[0]} routed to an expert outside 0..{n_expert - 1} "
                               "(the model's expert_count metadata does not match its graph)")
        sizes = window_sizes(n_tokens)
        return Routing(n_expert, n_used, n_tokens,
                       {il: distinct_experts(ids, n_expert, sizes) for il, ids in sorted(layers.items())}, elapsed_s,
                       model)

    def share(self, layer: int | None, n_tokens: int) -> float:
        """The share of a layer's experts a pass of n_tokens touches: between measured pass sizes
        linear in log n; above the measured pass its share (the experts it leaves unused are the
        ones routing rarely reaches); a layer not measured: the mean over the layers."""
        if layer is not None and layer in self.distinct:
            curves = [self.distinct[layer]]
        else:
            curves = list(self.distinct.values())
        return statistics.fmean(_at(c, max(n_tokens, 1)) for c in curves) / self.n_expert

    def active(self, n_expert: int, n_used: int, layer: int | None, n_tokens: int) -> float | None:
        """Distinct experts of a MUL_MAT_ID over n_expert experts, n_used per token, in a pass of
        n_tokens; None when this routing is not of such experts (another model's)."""
        if (n_expert, n_used) != (self.n_expert, self.n_used):
            return None
        return self.share(layer, n_tokens) * self.n_expert

    def to_json(self) -> dict[str, Any]:
        return {"n_expert": self.n_expert, "n_used": self.n_used, "n_tokens": self.n_tokens,
                "elapsed_s": self.elapsed_s, "model": self.model,
                "distinct": {str(il): {str(n): d for n, d in c.items()} for il, c in self.distinct.items()}}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Routing:
        return Routing(int(doc["n_expert"]), int(doc["n_used"]), int(doc["n_tokens"]),
                       {int(il): {int(n): float(d) for n, d in c.items()} for il, c in doc["distinct"].items()},
                       float(doc.get("elapsed_s", 0.0)), str(doc.get("model", "")))


def _at(curve: dict[int, float], n: int) -> float:
    """The curve (n -> distinct experts) at n: linear in log n between its sizes, flat outside."""
    sizes = sorted(curve)
    if n <= sizes[0]:
        return curve[sizes[0]]
    if n >= sizes[-1]:
        return curve[sizes[-1]]
    hi = next(k for k in sizes if k >= n)
    lo = max(k for k in sizes if k <= n)
    if hi == lo:
        return curve[lo]
    t = (math.log(n) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return curve[lo] + t * (curve[hi] - curve[lo])


def measure(path: str | Path, n_expert: int, *, n_tokens: int, threads: int, mmap: bool = True,
            progress: bool = True) -> Routing:
    """One n_tokens-token prompt pass of `path` on the host (one ubatch) with its routing
    recorded: the fixed prompt every benchmark and calibration pass uses."""
    import time

    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    if progress:
        print(f"\rcalibrate: routing of a {n_tokens}-token pass".ljust(100), end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        llm = Llama(str(path), n_gpu_layers=0, n_ctx=n_tokens, n_batch=n_tokens, n_ubatch=n_tokens, n_threads=threads,
                    n_threads_batch=threads, use_mmap=mmap, op_offload=False, flash_attn=False, verbose=False)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"calibration: could not load {path} (routing load): {e}") from None
    try:
        tokens = prompt_tokens(llm, n_tokens)
        with _core.RouteRecorder(llm.native_context) as rec:
            llm.eval(tokens)
            routes = rec.routes()
    finally:
        llm.close()
    return Routing.from_routes(routes, n_expert, time.perf_counter() - t0, fingerprint(path))
