"""A model's real passes through llama.cpp, timed: the building blocks of calibration's loads
(calibrate.py) and its two whole-pass measurements, weights streamed and weights scattered.

  timed_eval      one eval as the generation loop runs it, with the scheduler's eval callback
                  (`_core.NodeTimer`) node by node or at chosen stops;
  decode_walls    consecutive 1-token passes after a prompt, their wall times;
  measure_stream  every host weight's op streamed to the accelerator in a decode pass;
  measure_scatter weight matmuls alternating between host and accelerator in a decode pass;
  measure_layouts the host's passes with its weights repacked (a default load) and in plain memory.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import _core
from ...errors import OallamaError, ProfileError
from ...runtime.kvcache import NO_FLASH_ATTN
from ...runtime.place import HOST_LAYOUT_NAMES
from ..graph import class_key

VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"})
MATMUL_OPS = frozenset({"MUL_MAT", "MUL_MAT_ID"})
PLAIN, REPACK, DUAL = HOST_LAYOUT_NAMES  # host weight layouts (ggml buffer types)


@dataclass
class Run:
    wall_us: float  # the eval call, until the device finished (llama_synchronize)
    nodes: list[_core.NodeTime]


def sync(llm: Any) -> None:
    """Wait for the context's queued work: llama.cpp's decode returns once the graph is handed
    over (an rpc-server may still be computing); sampling would wait here."""
    import llama_cpp

    llama_cpp.llama_synchronize(llm._ctx.ctx)


def timed_eval(llm: Any, timer: _core.NodeTimer | None, prefix: list[int], toks: list[int],
               stops: list[int], outputs: int = 1) -> Run:
    """One eval of `toks` after `prefix`, as the generation loop runs it: a prompt's pass
    follows a pass of another size (its graph is built anew), a decode pass follows one of its
    own size (llama.cpp reuses that graph). outputs: rows of logits the pass computes (its last
    tokens'), as a decode pass of that many sequences does (the context must reserve them:
    `decode_load_kwargs`); the output matmul is most of such a pass (the 8B's at 4 columns: 29 ms
    where 1 took 9.6)."""
    # the pass before the timed one stops where the timed one does: a decode pass reuses that pass's graph, and a
    # backend reuses its work by the graph's id only where a whole split ran as one (patch 0009: an rpc-server
    # recomputes the graph it holds instead of receiving it again, as in a generation)
    if timer is not None:
        timer.reset(stops)
    n_past = len(prefix)
    if llm.n_tokens >= n_past and list(llm.input_ids[:n_past]) == list(prefix):
        llm.n_tokens = n_past  # the prefix's KV cells are still there: evaluate on from them
    else:
        llm.reset()
        llm.eval(prefix)
    # a 1-token pass: the graph the timed one follows; before a decode pass, of another token, as in a
    # generation (the same token again would leave exactly the experts it reads in the caches)
    lead = prefix[-1] if len(toks) == 1 and prefix and prefix[-1] != toks[0] else toks[0]
    llm.eval([lead])
    llm.n_tokens -= 1  # ... and forgotten (the next eval drops its KV cells)
    sync(llm)
    if timer is not None:
        timer.reset(stops)
    t0 = time.perf_counter()
    if outputs > 1:
        _eval_outputs(llm, toks, n_past, outputs)
    else:
        llm.eval(toks)
    sync(llm)
    wall = (time.perf_counter() - t0) * 1e6
    return Run(wall, timer.times() if timer is not None else [])


def decode_load_kwargs(decode: int) -> dict[str, Any]:
    """oallama.Llama's keywords for a load that runs `timed_eval` with `decode` outputs: that many
    sequences (and so rows of logits) reserved, over one shared KV stream (the calibration's passes
    keep their one sequence's whole context)."""
    return {"n_seq_max": decode, "kv_unified": True} if decode > 1 else {}


def _eval_outputs(llm: Any, toks: list[int], n_past: int, outputs: int) -> None:
    """Decode `toks` at n_past.. of sequence 0 with logits for the last `outputs` tokens, past
    llama_cpp's eval (which asks for the last one's only); llama_cpp's own state stays at n_past,
    so its next eval drops these cells."""
    import llama_cpp

    from ...runtime.generate import SeqBatch

    # the cells from n_past on (the lead pass's), as llama_cpp's eval drops them before its decode
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, n_past, -1)
    with contextlib.closing(SeqBatch(len(toks))) as batch:
        try:
            batch.decode(llm, [(t, n_past + i, 0, i >= len(toks) - outputs) for i, t in enumerate(toks)])
        except RuntimeError as e:  # llama_cpp's "llama_decode returned N"
            raise ProfileError(f"calibration: a {len(toks)}-token pass with {outputs} outputs: {e}") from None


def weight_nbytes(node: _core.NodeTime) -> int:
    """Bytes of a weight matmul's weight (its first source), from its ggml type and shape."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[node.weight_type.upper()]]
    except KeyError:
        return 0
    return math.prod(node.src_ne[0]) // block * size


def decode_walls(llm: Any, tokens: list[int], n_prefill: int, reps: int) -> list[float]:
    """Consecutive 1-token decode passes after an n_prefill-token prompt, as a generation runs
    them: each one's wall time until the device finished (us). The first one (it rebuilds the
    graph after the prompt's) is not kept; callers take the mean, as a TPOT averages its passes
    (on a busy machine a streamed pass over loopback TCP took 1.1 or 2.1 s, the same pass).
    A prompt already evaluated is decoded on from, not evaluated again: lavapipe corrupted the heap
    evaluating gemma3's 32-token prompt again after decode passes with every weight streamed."""
    prefix = tokens[:n_prefill]
    if llm.n_tokens >= n_prefill and list(llm.input_ids[:n_prefill]) == list(prefix):
        llm.n_tokens = n_prefill  # the prefix's KV cells are still there
    else:
        llm.reset()
        llm.eval(prefix)
    walls = []
    for k in range(2 * max(reps, 2) + 1):
        t0 = time.perf_counter()
        llm.eval(tokens[n_prefill + k:n_prefill + k + 1])
        sync(llm)
        walls.append((time.perf_counter() - t0) * 1e6)
    return walls[1:]


def measure_stream(path: str | Path, acc: str, *, n_ctx: int, n_prefill: int, threads: int, mmap: bool,
                    reps: int, refused: Collection[tuple[str, tuple[int, ...]]] = (),
                    attention: Mapping[str, Any] = NO_FLASH_ATTN) -> dict[str, Any] | None:
    """Decode passes (1 token after n_prefill) with every layer's weights on the host and each
    one's op streamed to `acc` at any batch (patch 0001), as a FlexGen-like plan runs: their mean
    wall time and the weights each streamed. None when no weight could stream (all repacked).
    refused: (type, shape) of weights whose matmul `acc` refused when profiled: not streamed (lavapipe
    takes a 262144-row tied output matrix's op, and corrupts the heap copying the weight).

    Two loads: the weight matmuls are read from a plain one (a streamed op reads the weight's copy,
    which is no model weight), and the policy is set on the other before its first pass: a
    scheduler reserve after a prompt whose ops ran on Vulkan0 corrupted the heap (lavapipe)."""
    from ...runtime.generate import prompt_tokens

    with _stream_load(path, acc, n_ctx, n_prefill, threads, mmap, attention) as llm:
        tokens = prompt_tokens(llm, n_ctx)
        prefix, batch = tokens[:n_prefill], tokens[n_prefill:n_prefill + 1]
        with _core.NodeTimer(llm.native_context) as timer:
            base = {r.index: r for r in timed_eval(llm, timer, prefix, batch, []).nodes
                    if r.weight_type and r.op in MATMUL_OPS}
    with _stream_load(path, acc, n_ctx, n_prefill, threads, mmap, attention) as llm:
        _core.set_offload_policy(llm.native_context, {t.name: 1 for t in llm.tensor_placements()
                                                      if t.is_host and (t.type, t.shape) not in refused})
        with _core.NodeTimer(llm.native_context) as timer:
            nodes = timed_eval(llm, timer, prefix, batch, []).nodes  # also the warm-up
        streamed = [base[r.index] for r in nodes if r.index in base and r.device == acc]
        if not streamed:
            return None
        walls = decode_walls(llm, tokens, n_prefill, reps)
    return {"n_tokens": 1, "n_past": n_prefill, "wall_us": statistics.fmean(walls), "samples_us": walls,
            "n_weights": len(streamed), "weight_bytes": sum(weight_nbytes(r) for r in streamed)}


@contextlib.contextmanager
def _stream_load(path: str | Path, acc: str, n_ctx: int, n_prefill: int, threads: int,
                 mmap: bool, attention: Mapping[str, Any]) -> Iterator[Any]:
    """Every layer on the host, op offload on (measure_stream's load); closed on exit."""
    from ...runtime.llama import Llama

    try:
        llm = Llama(str(path), devices=[acc], n_ctx=n_ctx, n_batch=n_prefill, n_ubatch=n_prefill, n_threads=threads,
                    n_threads_batch=threads, use_mmap=mmap, verbose=False, n_gpu_layers=0, op_offload=True,
                    **attention)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"calibration: could not load {path} (streamed load): {e}") from None
    try:
        yield llm
    finally:
        llm.close()


def measure_scatter(path: str | Path, info: Any, acc: str, *, n_gpu_layers: int, n_ctx: int, n_prefill: int,
                     threads: int, mmap: bool, reps: int,
                     attention: Mapping[str, Any] = NO_FLASH_ATTN) -> dict[str, Any] | None:
    """Decode passes (1 token after n_prefill) with the offloaded layers' weight matmuls
    alternating between the host and `acc` (file order; op offload off, so a host weight's op
    stays on the host): their mean wall time, and the placement as llama.cpp made it (which
    weights landed on `acc`, the KV layers) for the model to cost. None when nothing scatters."""
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama
    from ..graph import layer_of

    n_layer = int(info.hparam("block_count", 0))
    first = n_layer - max(n_gpu_layers - 1, 0)  # llama.cpp offloads the last n_gpu_layers - 1 layers
    layer = {t.name: layer_of(t.name) for t in info.tensors}
    mats = [t.name for t in info.tensors if len([d for d in t.shape if d > 1]) >= 2
            and layer[t.name] is not None and layer[t.name] >= first]
    placement = {w: (acc if k % 2 == 0 else "CPU") for k, w in enumerate(mats)}
    if len(mats) < 4:
        return None
    try:
        llm = Llama(str(path), devices=[acc], placement=placement, n_ctx=n_ctx, n_batch=n_prefill,
                    n_ubatch=n_prefill, n_threads=threads, n_threads_batch=threads, use_mmap=mmap, verbose=False,
                    n_gpu_layers=n_gpu_layers, op_offload=False, **attention)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"calibration: could not load {path} (scattered load): {e}") from None
    try:
        on_acc = sorted(t.name for t in llm.tensor_placements() if t.device == acc)
        walls = decode_walls(llm, prompt_tokens(llm, n_ctx), n_prefill, reps)
    finally:
        llm.close()
    return {"n_tokens": 1, "n_past": n_prefill, "wall_us": statistics.fmean(walls), "samples_us": walls,
            "on_acc": on_acc, "kv_layers": min(max(n_gpu_layers - 1, 0), n_layer)}


DUAL_MARGIN = 1 << 30  # bytes of host memory left free beyond a dual load's second copy of its repacked weights


def measure_layouts(path: str | Path, *, sizes: list[int], n_ctx: int, n_prefill: int, threads: int, mmap: bool,
                    reps: int, attention: Mapping[str, Any] = NO_FLASH_ATTN, decode: int = 1,
                    repacked: Mapping[str, int] | None = None) -> dict[str, Any] | None:
    """Host-only passes of each size in `sizes` (1: decode after n_prefill tokens, the mean of its
    passes; `decode` > 1: a decode pass of that many sequences after n_prefill tokens, its outputs
    as many, the median; another n > 1: a prompt of n tokens, the median) with the weights a default
    load repacks (ggml's CPU kernels' layout) in both layouts: repacked and in plain memory. The
    one-op profile times each weight in both layouts, but its plain times missed the real graph's
    (the full 8B's decode: plain 1.38x repacked, measured; 1.09x, profiled;
    bench/results/2026-11-24-vm-layout-scale), and by shape more still (its attention matrices 1.67x
    slower plain in the real graph, 1.11x in the profile; its FFN gate 1.70x against 1.89x;
    bench/results/2026-11-25-vm-8b-layouts). So each pass size also times one pass node by node in
    both layouts: per weight matmul shape (`graph.class_key`), its nodes' summed times in each
    and their count (`shapes`). The plan costs each plain weight at its shape's ratio of those times
    and the all-plain pass at the ratio of the walls (`context.plain_times`). Paired (below), every
    pair times one pass node by node in each layout and each shape keeps its median (and each pair's,
    `<layout>_each_us`): a shape's node ratio moved by up to 0.3 between pairs on the full Qwen3-8B,
    and one pair's set the walls' correction at 1.62 where four gave a median of 1.045
    (bench/results/2026-11-29-vm-paired-layouts/experiments/nodepairs.txt).

    `repacked` (the weights a default load repacks: name -> bytes, as found), with a mapped model and host memory
    for a second copy of them: one load holds them in the dual layout (patch 0006) and the two layouts
    alternate pass by pass, each pair in the same minute ("paired"). Otherwise two loads one after the
    other, a default one and one with those weights plain; the VM drifts 1.4x between minutes, and so
    the full 8B's 32-token ratio came out 0.92 from two loads where alternated passes gave 0.82, its
    decode's 1.27 against 1.10 (bench/results/2026-11-29-vm-paired-layouts). None when a default load
    repacks nothing."""
    from ...runtime import devices as devmod

    kw: dict[str, Any] = dict(n_ctx=n_ctx, n_batch=max(sizes), n_ubatch=max(sizes), n_threads=threads,
                              n_threads_batch=threads, use_mmap=mmap, verbose=False, n_gpu_layers=0,
                              op_offload=False, **attention, **decode_load_kwargs(decode))
    avail = devmod.host_available_bytes()
    if repacked and mmap and avail is not None and avail >= 2 * sum(repacked.values()) + DUAL_MARGIN:
        return _paired_layouts(path, dict(repacked), sizes, n_prefill, reps, decode, kw)
    return _layouts_two_loads(path, sizes, n_prefill, reps, decode, kw)


def _layout_pass(tokens: list[int], n: int, n_prefill: int, decode: int) -> tuple[list[int], list[int], int]:
    """(prefix, batch, outputs) of `measure_layouts`' pass of n tokens."""
    if n == 1 or n == decode:
        return tokens[:n_prefill], tokens[n_prefill:n_prefill + n], n if n == decode else 1
    return [], tokens[:n], 1


def _layout_walls(llm: Any, tokens: list[int], n: int, n_prefill: int, decode: int, reps: int,
                  warm: bool = True) -> list[float]:
    """Wall times of `measure_layouts`' pass of n tokens (us): a decode's the mean of consecutive passes
    (`decode_walls`), one value; another pass's each of `reps`, after a warm-up when `warm`."""
    prefix, batch, outputs = _layout_pass(tokens, n, n_prefill, decode)
    if n == 1:
        return [statistics.fmean(decode_walls(llm, tokens, n_prefill, reps))]
    if warm:
        timed_eval(llm, None, prefix, batch, [], outputs)  # warm-up (graph build, allocation)
    return [timed_eval(llm, None, prefix, batch, [], outputs).wall_us for _ in range(reps)]


def _layout_nodes(llm: Any, tokens: list[int], n: int, n_prefill: int, decode: int) -> dict[str, tuple[float, int]]:
    """One pass of n tokens node by node: its weight matmul shapes' summed times (`_matmul_shapes`)."""
    prefix, batch, outputs = _layout_pass(tokens, n, n_prefill, decode)
    with _core.NodeTimer(llm.native_context) as timer:
        return _matmul_shapes(timed_eval(llm, timer, prefix, batch, [], outputs).nodes)


def _record(size: dict[str, Any], what: str, us: float, shapes: Mapping[str, tuple[float, int]]) -> None:
    size[f"{what}_us"] = us
    for key, (t, count) in shapes.items():
        size.setdefault("shapes", {}).setdefault(key, {})[f"{what}_us"] = t
        size["shapes"][key]["nodes"] = count


def _paired_layouts(path: str | Path, repacked: dict[str, int], sizes: list[int], n_prefill: int, reps: int,
                    decode: int, kw: dict[str, Any]) -> dict[str, Any]:
    """`measure_layouts` in one dual load: a pass of n tokens runs the repacked copies where the dual
    threshold is above n (`_core.cpu_set_dual_max_batch`, process-wide, read at each matmul) and the
    plain bytes where it is 1; the layouts alternate default, plain, plain, default, ... . The threshold is
    left where the last pass set it: a dual load sets its own when it loads (`runtime.llama.Llama`), so a
    model with dual layouts must not be open in the process while this runs."""
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    out: dict[str, Any] = {"n_past": n_prefill, "sizes": {}, "n_weights": len(repacked),
                           "weight_bytes": sum(repacked.values()), "paired": True}
    try:
        llm = Llama(str(path), devices=["CPU"], layouts=dict.fromkeys(repacked, DUAL), dual_max_batch=1, **kw)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise ProfileError(f"calibration: could not load {path} (dual layouts load): {e}") from None
    try:
        tokens = prompt_tokens(llm, kw["n_ctx"])
        for n in sizes:
            walls: dict[str, list[float]] = {"default": [], "plain": []}
            nodes: dict[str, list[dict[str, tuple[float, int]]]] = {"default": [], "plain": []}  # one per pass
            for k in range(reps):
                for what in ("default", "plain") if k % 2 == 0 else ("plain", "default"):
                    _core.cpu_set_dual_max_batch(n + 1 if what == "default" else 1)
                    walls[what] += _layout_walls(llm, tokens, n, n_prefill, decode, 1, warm=k == 0)
                    nodes[what].append(_layout_nodes(llm, tokens, n, n_prefill, decode))
            size = out["sizes"].setdefault(str(n), {})
            for what, us in walls.items():
                _record(size, what, statistics.median(us), _median_shapes(nodes[what]))
                for key, sh in size["shapes"].items():  # each pair's, for re-prediction and diagnosis
                    sh[f"{what}_each_us"] = [p[key][0] for p in nodes[what] if key in p]
            size["ratios"] = [p / d for d, p in zip(walls["default"], walls["plain"], strict=True) if d > 0]
    finally:
        llm.close()
    return out


def _layouts_two_loads(path: str | Path, sizes: list[int], n_prefill: int, reps: int, decode: int,
                       kw: dict[str, Any]) -> dict[str, Any] | None:
    """`measure_layouts` in a default load and then one with the weights it repacked plain."""
    from ...runtime.generate import prompt_tokens
    from ...runtime.llama import Llama

    out: dict[str, Any] = {"n_past": n_prefill, "sizes": {}}
    layouts: dict[str, str] = {}
    for what in ("default", "plain"):
        try:
            llm = Llama(str(path), devices=["CPU"], layouts=layouts or None, **kw)
        except (OallamaError, ValueError, RuntimeError) as e:
            raise ProfileError(f"calibration: could not load {path} ({what} layouts load): {e}") from None
        try:
            if what == "default":
                placed = [t for t in llm.tensor_placements() if t.buffer_type == REPACK]
                if not placed:
                    return None
                layouts = {t.name: PLAIN for t in placed}
                out.update(n_weights=len(placed), weight_bytes=sum(t.nbytes for t in placed))
            tokens = prompt_tokens(llm, kw["n_ctx"])
            for n in sizes:
                size = out["sizes"].setdefault(str(n), {})
                us = statistics.median(_layout_walls(llm, tokens, n, n_prefill, decode, reps))
                _record(size, what, us, _layout_nodes(llm, tokens, n, n_prefill, decode))
        finally:
            llm.close()
    return out


def _median_shapes(passes: list[dict[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    """Per weight matmul shape, the median of its summed times over several passes (`_matmul_shapes`' each)."""
    keys = dict.fromkeys(k for p in passes for k in p)
    return {k: (statistics.median(p[k][0] for p in passes if k in p), max(p[k][1] for p in passes if k in p))
            for k in keys}


def _matmul_shapes(nodes: list[_core.NodeTime]) -> dict[str, tuple[float, int]]:
    """Weight matmul shape class -> (its nodes' summed times, us; how many) of a pass timed node by node."""
    out: dict[str, tuple[float, int]] = {}
    for r in nodes:
        if r.op in MATMUL_OPS and r.weight_type and r.range_us >= 0:
            key = class_key(r.op, r.weight_type, r.src_ne[0])
            t, count = out.get(key, (0.0, 0))
            out[key] = (t + r.range_us, count + 1)
    return out


def layers_that_fit(info: Any, acc: Any, n_layer: int) -> int:
    """n_gpu_layers for the accelerator load: all of them, or as many as half its free memory holds."""
    free = int(getattr(acc, "memory_free", 0) or 0)
    if free <= 0:
        return n_layer + 1
    per_layer = max(info.weight_bytes // max(n_layer + 1, 1), 1)
    return max(1, min(n_layer + 1, int(free * 0.5 // per_layer)))
