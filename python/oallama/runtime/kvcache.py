"""A context's attention settings as llama.cpp names them: flash attention (`-fa on|off|auto`) and
the KV cache's types (`-ctk`, `-ctv`).

llama-cpp-python's `Llama` takes flash attention as a bool and the cache types as ggml type ids;
`llama_kwargs` turns the names into them. `auto` is resolved before a load (the planner asks
llama.cpp's own resolution, `planner.context.resolve_flash_attn`): a load is always on or off.

    >>> check("on", "q8_0", "q8_0")
    >>> llama_kwargs(True, "q8_0", "q8_0")
    {'flash_attn': True, 'type_k': 8, 'type_v': 8}
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gguf import GGMLQuantizationType

from ..errors import PlanError

FLASH_ATTN = ("off", "on", "auto")
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ: the most sequences a context holds (-np)
# the cache types llama.cpp's -ctk / -ctv accept (common/arg.cpp's kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_PLAIN = ("f32", "f16", "bf16")


def flash_attn_code(value: str) -> int:
    """llama_flash_attn_type of a setting: -1 auto, 0 off, 1 on."""
    return {"auto": -1, "off": 0, "on": 1}[value]


def is_quantized(cache_type: str) -> bool:
    return cache_type not in _PLAIN


def check(flash_attn: str, type_k: str, type_v: str) -> None:
    """PlanError, naming the option, for a setting llama.cpp refuses: an unknown value, or a
    quantized V cache without flash attention (llama.cpp fails to create such a context)."""
    if flash_attn not in FLASH_ATTN:
        raise PlanError(f"--flash-attn {flash_attn!r}: choose one of {', '.join(FLASH_ATTN)}")
    for flag, t in (("--cache-type-k", type_k), ("--cache-type-v", type_v)):
        if t not in CACHE_TYPES:
            raise PlanError(f"{flag} {t!r}: llama.cpp's KV cache takes one of {', '.join(CACHE_TYPES)}")
    if flash_attn == "off" and is_quantized(type_v):
        raise PlanError(f"--cache-type-v {type_v} needs flash attention (llama.cpp refuses a quantized V cache "
                        "without it): give --flash-attn on or auto, or an f16 V cache")


def ggml_type_id(cache_type: str) -> int:
    """The ggml type id of a cache type name ("q8_0" -> 8), as llama_context_params takes it."""
    return int(GGMLQuantizationType[cache_type.upper()].value)


def cache_type_name(type_id: int) -> str:
    """The name of a ggml type id as -ctk / -ctv take it (8 -> "q8_0")."""
    name = GGMLQuantizationType(int(type_id)).name.lower()
    if name not in CACHE_TYPES:
        raise PlanError(f"KV cache type {name}: llama.cpp's KV cache takes one of {', '.join(CACHE_TYPES)}")
    return name


def workload_fields(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A workload's attention fields (flash_attn, cache_type_k, cache_type_v) and sequences
    (parallel, kv_unified: oallama.Llama's n_seq_max, kv_unified) from Llama's keywords, for those given."""
    out: dict[str, Any] = {}
    if kwargs.get("n_seq_max") is not None:
        out["parallel"] = kwargs["n_seq_max"]
    if kwargs.get("kv_unified") is not None:
        out["kv_unified"] = bool(kwargs["kv_unified"])
    if kwargs.get("flash_attn") is not None:
        out["flash_attn"] = "on" if kwargs["flash_attn"] else "off"
    for k in ("k", "v"):
        if kwargs.get(f"type_{k}") is not None:
            out[f"cache_type_{k}"] = cache_type_name(kwargs[f"type_{k}"])
    return out


def llama_kwargs(flash_attn: bool, type_k: str, type_v: str) -> dict[str, Any]:
    """llama_cpp.Llama's keywords for these settings (flash attention already resolved)."""
    return {"flash_attn": bool(flash_attn), "type_k": ggml_type_id(type_k), "type_v": ggml_type_id(type_v)}


def given_llama_kwargs(flash_attn: str | None, type_k: str | None, type_v: str | None) -> dict[str, Any]:
    """llama_cpp.Llama's keywords for the settings given (None: not given, left to a plan file or
    llama-cpp-python's default) on a load that is not planned: `auto` needs planning."""
    if flash_attn == "auto":
        raise PlanError("--flash-attn auto is resolved by planning: give --gpu-budget or --cpu-plan, or on/off")
    check(flash_attn or "off", type_k or "f16", type_v or "f16")
    out = llama_kwargs(flash_attn == "on", type_k or "f16", type_v or "f16")
    given = {"flash_attn": flash_attn, "type_k": type_k, "type_v": type_v}
    return {k: v for k, v in out.items() if given[k] is not None}


NO_FLASH_ATTN = MappingProxyType(llama_kwargs(False, "f16", "f16"))  # llama-cpp-python's defaults, said
