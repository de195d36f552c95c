"""Type stub of oallama._core, the pybind11 module built from csrc/ (see csrc/oallama.h).

Native handles cross as integer addresses (llama_model*, llama_context*, ggml_backend_dev_t);
C++ errors arrive as RuntimeError and the Python wrappers re-raise oallama.errors types.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

llama_cpp_commit: str  # the pinned llama.cpp commit the libraries were built from
have_cuda: bool  # built with OALLAMA_CUDA=ON

def backend_init() -> None: ...

# --- devices (devices.cpp) ------------------------------------------------------------------
def devices_list(query_rpc_memory: bool = False) -> list[dict[str, Any]]:
    """name, ggml_name, description, backend, kind, buffer_type, memory_free, memory_total (bytes)"""
def device_memory(name: str) -> tuple[int, int]: ...
def device_address(name: str) -> int: ...
def device_name(name: str) -> str: ...
def buffer_type_address(name: str) -> int: ...
def rpc_add_server(endpoint: str) -> list[str]:
    """Register a reachable rpc-server (probe it first: ggml-rpc aborts on refusal)."""

# --- model (model.cpp) -----------------------------------------------------------------------
def model_tensors(model: int) -> list[dict[str, Any]]:
    """name, type, shape (4 ints), nbytes, buffer_type, device, is_host of every weight."""
def arch_is_supported(arch: str) -> bool: ...

# --- graphs and the scheduler (graph.cpp) -----------------------------------------------------
class Session:
    """A metadata-only model (no weight read) and a context."""

    def __init__(self, path: str, devices: Sequence[str] | None = None,
                 overrides: Sequence[tuple[str, str]] = ..., n_gpu_layers: int = 0, n_ctx: int = 4096,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int = 4, flash_attn: bool = False,
                 op_offload: bool = True, verbose: bool = False) -> None: ...
    def close(self) -> None: ...
    def context(self) -> int: ...
    def model(self) -> int: ...

def graph(context: int, n_tokens: int, n_outputs: int = 1) -> dict[str, Any]:
    """backends, nodes, leafs (dicts: name, op, type, ne, nbytes, srcs, view_src, weight,
    weight_slot, backend, pinned, host_buffer, supported_on, caller_pinned, is_view, is_input,
    is_output), n_splits, n_copies."""
def memory(context: int) -> list[dict[str, Any]]:
    """buffer_type, device, model, context, compute (bytes) per buffer type."""
def set_offload_policy(context: int, min_batch: Mapping[str, int]) -> None: ...
def get_offload_policy(context: int) -> dict[str, int]: ...

# --- profiling (profile.cpp) -----------------------------------------------------------------
def profile_mul_mat(device: str, type: str, k: int, m: int, ns: Sequence[int], n_threads: int, warmup: int = 2,
                    repeats: int = 5, use_extra_bufts: bool = True) -> list[dict[str, Any]]:
    """One dict per n: samples_us (list of us), buffer_type."""
def profile_copy(device: str, bytes: int, host_to_device: bool, warmup: int = 2,
                 repeats: int = 5) -> dict[str, Any]: ...
def profile_launch(device: str, n_threads: int, warmup: int = 2, repeats: int = 5) -> dict[str, Any]: ...

# --- llama.cpp's automatic fit (fit.cpp; absent when built with OALLAMA_TOOLS=OFF) ---------
def fit_params(path: str, devices: Sequence[str], margins: Sequence[int], n_ctx: int, n_batch: int = 512,
               n_ubatch: int = 512, flash_attn: bool = False) -> dict[str, Any]:
    """fits, n_gpu_layers, n_ctx, overrides [(regex, device)]."""

# --- quantization (quant.cpp, bindings.cpp) ---------------------------------------------------
def quant_compute_types(hparams: dict[str, Any], names: Sequence[str], shapes: Sequence[Sequence[int]],
                        ftype: int) -> list[int]:
    """ggml type id llama-quantize gives each tensor for a llama_ftype (-1: keep source type)."""
def quantize_rows(type: int, rows: npt.NDArray[np.float32]) -> bytes: ...
def type_name(arg0: int) -> str: ...
