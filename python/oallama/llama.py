"""The drop-in `Llama`: llama-cpp-python's Llama plus per-tensor placement.

Every constructor argument and method of `llama_cpp.Llama` works unchanged. New keywords:

    devices=   ggml device names the model may use, e.g. ["CPU", "CUDA0"] or
               ["CPU", "RPC[127.0.0.1:50052]"]; None keeps llama.cpp's default (all local GPUs)
    placement= weight name -> device name, or the path of a placement/plan JSON file

    >>> llm = Llama("m.gguf", devices=["CPU", "CUDA0"], placement={"output.weight": "CUDA0"})
    >>> llm.tensor_devices()["output.weight"]        # read back from the loaded model
    'CUDA0'

Weights the placement does not name follow `place.DEFAULT_RULE`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as _C

from . import _core, gguf_file, place
from . import devices as devmod
from .errors import PlanError


class _BuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override (llama.h); llama-cpp-python types the field void*
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class TensorPlacement:
    """Where one weight of a loaded model lives, as the model reports it."""

    name: str
    device: str  # oallama device name
    buffer_type: str  # e.g. "CPU", "CPU_REPACK", "CUDA0", "RPC0[127.0.0.1:50052]"
    type: str  # ggml type name
    shape: tuple[int, ...]
    nbytes: int  # bytes
    is_host: bool


class _NativeLoadParams:
    """ctypes arrays for llama_model_params.{devices,tensor_buft_overrides}, alive with the model."""

    def __init__(self, spec: place.LoadSpec) -> None:
        self._patterns = [p.encode() for p, _ in spec.overrides]
        n = len(spec.overrides)
        self.overrides = (_BuftOverride * (n + 1))()
        for i, ((_, dev), pat) in enumerate(zip(spec.overrides, self._patterns, strict=True)):
            self.overrides[i].pattern = pat
            self.overrides[i].buft = devmod.buffer_type_address(dev)
        self.overrides[n].pattern = None  # {NULL, NULL} terminator
        self.overrides[n].buft = None
        self.devices = None
        if spec.devices is not None:
            addrs = [devmod.device_address(d) for d in spec.devices]
            self.devices = (ctypes.c_void_p * (len(addrs) + 1))(*addrs, None)

    def apply(self, params: _C.llama_model_params) -> None:
        if len(self._patterns):
            params.tensor_buft_overrides = ctypes.cast(self.overrides, ctypes.c_void_p)
        if self.devices is not None:
            params.devices = ctypes.cast(self.devices, ctypes.c_void_p)


_params_hook_lock = threading.RLock()


@contextlib.contextmanager
def _model_params_hook(native: _NativeLoadParams | None) -> Iterator[None]:
    """Have llama_cpp.Llama.__init__ build its llama_model_params with our fields set.

    Llama.__init__ starts from llama_model_default_params() and never touches `devices` or
    `tensor_buft_overrides`; wrapping that one call is the least intrusive way in.
    """
    if native is None:
        yield
        return
    with _params_hook_lock:
        original = _C.llama_model_default_params

        def patched() -> _C.llama_model_params:
            params = original()
            native.apply(params)
            return params

        _C.llama_model_default_params = patched
        try:
            yield
        finally:
            _C.llama_model_default_params = original


def _resolve_placement(placement: Mapping[str, str] | str | Path | None,
                       model: gguf_file.GGUFInfo) -> tuple[dict[str, str] | None, list[str] | None]:
    """placement argument -> (weight->device map, devices named by a plan file)."""
    if placement is None or isinstance(placement, Mapping):
        return (dict(placement) if placement is not None else None), None
    if isinstance(placement, str | Path):
        doc = place.read_placement_file(placement)
        identity = doc.get("model", {}).get("identity") if isinstance(doc.get("model"), dict) else None
        if identity is not None and identity != model.identity():
            raise PlanError(
                f"{placement}: plan was made for model '{doc['model'].get('name', '?')}' "
                f"(identity {identity[:12]}), not {model.path.name} ({model.identity()[:12]})"
            )
        return dict(doc["placement"]), doc.get("devices")
    raise PlanError(f"placement must be a mapping or a plan file path, not {type(placement).__name__}")


def _trim(shape: Sequence[int]) -> tuple[int, ...]:
    """ggml's 4-d ne without trailing 1s: (4096, 1024, 1, 1) -> (4096, 1024)."""
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


class Llama(llama_cpp.Llama):
    """llama_cpp.Llama with `devices=` and `placement=` (see module docstring)."""

    def __init__(self, model_path: str, *args: Any, devices: Sequence[str] | None = None,
                 placement: Mapping[str, str] | str | Path | None = None, **kwargs: Any) -> None:
        self.model_info = gguf_file.check_model(model_path)
        assignment, plan_devices = _resolve_placement(placement, self.model_info)
        if devices is None and plan_devices is not None:
            devices = plan_devices
        self.load_spec: place.LoadSpec | None = None
        self._native_load_params: _NativeLoadParams | None = None
        if devices is not None or assignment is not None:
            self.load_spec = place.build_load_spec(self.model_info, assignment, devices)
            self._native_load_params = _NativeLoadParams(self.load_spec)
        with _model_params_hook(self._native_load_params):
            super().__init__(model_path, *args, **kwargs)

    # --- readback ---------------------------------------------------------------------------

    def _model_address(self) -> int:
        model = getattr(getattr(self, "_model", None), "model", None)
        if model is None:
            raise RuntimeError("this Llama is closed: its model has been freed")
        return int(ctypes.cast(model, ctypes.c_void_p).value or 0)

    def tensor_placements(self) -> list[TensorPlacement]:
        """Every weight tensor of the loaded model with its device and buffer type, read from
        the model's own buffers. A tied weight that llama.cpp duplicates appears twice."""
        return [
            TensorPlacement(t["name"], t["device"], t["buffer_type"], t["type"], _trim(t["shape"]),
                            t["nbytes"], t["is_host"])
            for t in _core.model_tensors(self._model_address())
        ]

    def tensor_devices(self) -> dict[str, str]:
        """weight name -> device name, read back from the loaded model (first copy of a name)."""
        out: dict[str, str] = {}
        for t in self.tensor_placements():
            out.setdefault(t.name, t.device)
        return out

    def bytes_per_device(self) -> dict[str, int]:
        """Weight bytes held on each device (bytes)."""
        out: dict[str, int] = {}
        for t in self.tensor_placements():
            out[t.device] = out.get(t.device, 0) + t.nbytes
        return out
