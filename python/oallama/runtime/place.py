"""Placement: a weight-name -> device map, turned into what llama.cpp's loader takes.

llama.cpp places weights through `llama_model_params.tensor_buft_overrides`: a list of
{regex, buffer type}, first match wins, `std::regex_search` on the tensor name, and one regex
compiled per tensor per override while loading. So the map is compiled into few, exact
patterns: per device, one anchored pattern per group of tensors that share a layer set, e.g.

    ^blk\\.(?:[0-1]|7)\\.(?:ffn_down|ffn_up)\\.weight$   -> CUDA0
    ^(?:output\\.weight|token_embd\\.weight)$          -> CUDA0

Every pattern lists exact names, so no pattern can catch a tensor meant for another device
(``blk.1.`` never matches ``blk.10.``) and their order does not matter. A 64-layer model needs
at most (devices x distinct tensor kinds) patterns, far below llama.cpp's 4096.

The rule for weights a placement does not name (DEFAULT_RULE) is llama.cpp's own: they go where
`n_gpu_layers` puts their layer, which with oallama's and llama-cpp-python's default of 0 is
host memory.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import PlacementError
from ..model.gguf_file import GGUFInfo
from . import devices as devmod

DEFAULT_RULE = (
    "weights the placement does not name stay where llama.cpp puts them by n_gpu_layers "
    "(default 0: host memory, CPU)"
)
MAX_OVERRIDES = 4096  # llama_max_tensor_buft_overrides() of the pinned llama.cpp
# host weight layouts a placement may name (ggml buffer types of the CPU): plain memory, ggml's
# repacked layout, and both (patch 0006). A load with layouts turns llama.cpp's repacking off
# (use_extra_bufts = false) and overrides every weight that is not plain.
PLAIN_LAYOUT, HOST_LAYOUT_NAMES = "CPU", ("CPU", "CPU_REPACK", "CPU_REPACK_DUAL")
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")
_ECMA_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}/])")


def _escape(text: str) -> str:
    """Escape for std::regex (ECMAScript grammar)."""
    return _ECMA_SPECIAL.sub(r"\\\1", text)


def _alternation(items: Iterable[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else "(?:" + "|".join(items) + ")"


def _digit_range(a: int, b: int) -> str:
    return str(a) if a == b else f"[{a}-{b}]"


def _range_regex(lo: int, hi: int) -> list[str]:
    """Alternatives matching exactly the decimal integers lo..hi (no leading zeros): 0..23 ->
    [0-9], 1[0-9], 2[0-3]. Each is a prefix, one digit range, then free digits."""
    out: list[str] = []
    while lo <= hi:
        s = str(lo)
        k = 0  # free trailing digits: lo..lo + 10^k - 1 is one aligned block of numbers as long as s
        while (lo != 0 and lo % 10 ** (k + 1) == 0 and lo + 10 ** (k + 1) - 1 <= hi
               and len(str(lo + 10 ** (k + 1) - 1)) == len(s)):
            k += 1
        if k >= len(s):
            out.append(s)
            lo += 1
            continue
        step = 10**k
        d = (lo // step) % 10  # the digit before the free ones may run on to `last`
        last = min(9, d + (hi - lo + 1) // step - 1)
        while last > d and len(str(lo + (last - d + 1) * step - 1)) != len(s):
            last -= 1
        out.append(s[: len(s) - k - 1] + _digit_range(d, last) + "[0-9]" * k)
        lo += (last - d + 1) * step
    return out


def _layer_alternation(layers: Iterable[int]) -> str:
    """An ECMAScript group matching exactly these layer numbers, runs as digit ranges (48 layers
    in a few characters: (?:[0-9]|[1-3][0-9]|4[0-7]))."""
    nums = sorted(set(layers))
    parts: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is None or n != prev + 1:
            parts += _range_regex(start, prev)
            if n is not None:
                start = n
        if n is not None:
            prev = n
    return _alternation(parts)


def compile_patterns(assignment: Mapping[str, str]) -> list[tuple[str, str]]:
    """weight name -> device  ==>  [(anchored ECMAScript regex, device)], compact and exact."""
    layered: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    plain: dict[str, list[str]] = defaultdict(list)
    for name, dev in assignment.items():
        m = _LAYER_NAME.match(name)
        if m:
            layered[dev][m[2]].add(int(m[1]))
        else:
            plain[dev].append(name)
    out: list[tuple[str, str]] = []
    for dev in sorted(set(layered) | set(plain)):
        groups: dict[tuple[int, ...], list[str]] = defaultdict(list)
        for suffix, layers in layered[dev].items():
            groups[tuple(sorted(layers))].append(suffix)
        for layers, suffixes in sorted(groups.items()):
            out.append((rf"^blk\.{_layer_alternation(layers)}\.{_alternation(map(_escape, sorted(suffixes)))}$",
                        dev))
        if plain[dev]:
            out.append((f"^{_alternation(_escape(n) for n in sorted(plain[dev]))}$", dev))
    if len(out) > MAX_OVERRIDES:
        raise PlacementError(f"placement needs {len(out)} override patterns; llama.cpp takes at most {MAX_OVERRIDES}")
    return out


@dataclass(frozen=True)
class LoadSpec:
    """What oallama hands llama.cpp's loader for one model."""

    assignment: dict[str, str]  # weight name -> oallama device name (the request)
    devices: list[str] | None  # accelerators for llama_model_params.devices; None: llama.cpp's default
    overrides: list[tuple[str, str]]  # (pattern, device name or host layout name)
    buffer_types: dict[str, str] = field(default_factory=dict)  # device -> its buffer type name
    layouts: dict[str, str] = field(default_factory=dict)  # host weight -> layout (HOST_LAYOUT_NAMES)
    dual_max_batch: int = 0  # CPU_REPACK_DUAL weights: the repacked copy below this batch

    @property
    def use_extra_bufts(self) -> bool:
        """llama.cpp's repacking of host weights: off when the placement chooses layouts itself."""
        return not self.layouts

    def ot_arguments(self) -> list[str]:
        """`-ot` arguments reproducing this placement in stock llama-server / llama-cli."""
        args: list[str] = []
        for pattern, dev in self.overrides:
            args += ["-ot", f"{pattern}={self.buffer_types.get(dev, dev)}"]
        return args


def layer_weights(names: Iterable[str], n_gpu_layers: int, n_layer: int) -> set[str]:
    """What llama.cpp's n_gpu_layers puts on the GPU. It counts the output layer first: with
    n_gpu_layers = k >= 1 the output layer (every non-layer weight but the input embedding,
    which always stays on the CPU) and the last k - 1 repeating layers go to the GPU."""
    first = n_layer + 1 - n_gpu_layers  # llama-model.cpp: i_gpu_start
    out = set()
    for name in names:
        m = re.match(r"^blk\.(\d+)\.", name)
        if m:
            if int(m[1]) >= first:
                out.add(name)
        elif n_gpu_layers >= 1 and not name.startswith("token_embd"):
            out.add(name)
    return out


TIED = "token_embd.weight"  # a model without output.weight multiplies by this one for its logits


def tied_output(names: Iterable[str]) -> bool:
    """The model (all its weight names) has no output matrix of its own: llama.cpp loads its input
    embedding twice, the second copy in the output layer, where n_gpu_layers >= 1 puts it on the GPU."""
    ns = set(names)
    return TIED in ns and "output.weight" not in ns


def explicit(assignment: Mapping[str, str], n_gpu_layers: int, n_layer: int,
             resolve: Callable[[str], devmod.Device] = devmod.resolve, tied: bool | None = None,
             output_device: str | None = None) -> dict[str, str]:
    """The entries of `assignment` that need an override: all but the host weights that llama.cpp's
    n_gpu_layers keeps on the host anyway. Those are left to llama.cpp, so they keep the host
    layout it picks (repacked for the CPU's kernels, or a GPU's pinned host memory), which is the
    layout the profile times; an override to the CPU would force plain memory.

    tied: the model's output is its input embedding (`tied_output`; None: read from the
    assignment's names). llama.cpp loads that embedding twice, and n_gpu_layers >= 1 puts the
    output copy where it puts the output layer (`output_device`, the accelerator of a one-accelerator
    load). A tied embedding placed there is left to n_gpu_layers, as `-ngl` loads it: the output
    copy on the accelerator, the input copy (a lookup of a few rows) on the host, the bytes once.
    One placed on the host is named, so that both copies stay there (a 178 MB copy for Gemma 3 270M).
    """
    on_gpu = layer_weights(assignment, n_gpu_layers, n_layer)
    host = {d: resolve(d).is_host for d in set(assignment.values())}  # once per device: an rpc-server's is a probe
    out = {w: d for w, d in assignment.items() if w in on_gpu or not host[d]}
    if n_gpu_layers >= 1 and TIED in assignment and (tied_output(assignment) if tied is None else tied):
        dev = assignment[TIED]
        if resolve(dev).is_host:
            out[TIED] = dev
        elif output_device is not None and resolve(dev).name == resolve(output_device).name:
            del out[TIED]
    return out


def layout_overrides(layouts: Mapping[str, str], assignment: Mapping[str, str],
                     resolve: Callable[[str], devmod.Device] = devmod.resolve) -> list[tuple[str, str]]:
    """(pattern, layout) for every weight whose layout is not plain (the load turns repacking off);
    refuses unknown layouts and weights the assignment puts on an accelerator."""
    for w, lay in layouts.items():
        if lay not in HOST_LAYOUT_NAMES:
            raise PlacementError(f"layout of '{w}' is {lay!r}: choose one of {', '.join(HOST_LAYOUT_NAMES)}")
        dev = assignment.get(w)
        if dev is not None and not resolve(dev).is_host:
            raise PlacementError(f"'{w}' has a host layout ({lay}) but the placement puts it on {dev}")
    return compile_patterns({w: lay for w, lay in layouts.items() if lay != PLAIN_LAYOUT})


def _check_names(assignment: Mapping[str, str], model: GGUFInfo) -> None:
    names = {t.name for t in model.tensors}
    unknown = [n for n in assignment if n not in names]
    if unknown:
        hint = difflib.get_close_matches(unknown[0], names, n=1)
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise PlacementError(
            f"placement names tensor '{unknown[0]}'{more} that {model.path.name} does not have"
            + (f"; did you mean '{hint[0]}'?" if hint else "")
        )


def build_load_spec(model: GGUFInfo, placement: Mapping[str, str] | None,
                    devices: Sequence[str] | None, raw_overrides: Sequence[tuple[str, str]] = (),
                    n_gpu_layers: int = 0, layouts: Mapping[str, str] | None = None,
                    dual_max_batch: int = 0) -> LoadSpec:
    """Validate a placement against the model and the devices; compile it for the loader (only
    the entries `explicit` keeps: llama.cpp's own n_gpu_layers placement does the rest).
    raw_overrides: (regex, device) patterns used as they are (e.g. llama.cpp's own fit's);
    layouts: host weight -> layout (HOST_LAYOUT_NAMES), see layout_overrides."""
    # each device name resolved (and an rpc-server probed) once per load, not once per weight: an
    # rpc-server accepts one connection at a time, and a burst of probes waits on SYN retries
    resolve = functools.cache(devmod.resolve)
    requested = [resolve(d) for d in devices] if devices is not None else None
    assignment: dict[str, str] = {}
    for name, dev in (placement or {}).items():
        if not isinstance(name, str) or not isinstance(dev, str):
            raise PlacementError(f"placement entries must be str -> str, got {name!r} -> {dev!r}")
        assignment[name] = resolve(dev).name
    _check_names(assignment, model)

    used = [resolve(d) for d in dict.fromkeys(assignment.values())]
    accel: list[devmod.Device] | None
    if requested is not None:
        allowed = {d.name for d in requested}
        stray = [d.name for d in used if d.name not in allowed and not d.is_host]
        if stray:
            raise PlacementError(f"placement uses device {stray[0]}, which is not in devices={list(devices or [])}")
        accel = [d for d in requested if not d.is_host]
    elif any(d.kind == "rpc" for d in used):
        # llama.cpp's default list holds local GPUs only; an explicit list must add the RPC ones
        local = [d for d in devmod.list_devices() if d.kind in ("gpu", "igpu")]
        accel = [d for d in used if d.kind == "rpc"] + local
    else:
        accel = None  # llama.cpp's default device selection (all local GPUs)
    names = list(dict.fromkeys(d.name for d in accel)) if accel is not None else None
    buft = {d.name: d.buffer_type for d in [*(accel or []), *used]}
    raw = [(pat, resolve(dev).name) for pat, dev in raw_overrides]
    n_layer = int(model.hparam("block_count", 0) or 0)
    lays = dict(layouts or {})
    _check_names(lays, model)
    if any(lay == "CPU_REPACK_DUAL" for lay in lays.values()) and dual_max_batch < 1:
        raise PlacementError("dual layouts (CPU_REPACK_DUAL) need dual_max_batch >= 1 (the batch from which the "
                             "plain copy is used)")
    lay_ov = layout_overrides(lays, assignment, resolve)
    buft.update({lay: lay for _, lay in lay_ov})
    tied = tied_output(t.name for t in model.tensors)
    output_device = names[-1] if names is not None and len(names) == 1 else None
    return LoadSpec(assignment, names, lay_ov + raw + compile_patterns(
        explicit(assignment, n_gpu_layers, n_layer, resolve, tied, output_device)),
                    buft, lays, dual_max_batch)
