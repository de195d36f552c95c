"""Type stub of oallama._core, the pybind11 module built from csrc/ (see csrc/oallama.h and the
header comment of csrc/bindings.cpp).

Native handles cross as typed objects, never as integer addresses: `Session` owns a metadata-only
model + context; `Context` / `Model` borrow a llama_context / llama_model from the object that
owns it (a Session, or llama-cpp-python's `Llama._ctx` / `Llama._model`), keep that owner alive and
raise oallama.errors.ClosedError once it has been closed. Results are read-only classes (no
constructor, no setter). The only integers handed out are `device_address` and
`buffer_type_address`, for llama-cpp-python's ctypes `llama_model_params`. Other C++ errors arrive
as RuntimeError and the Python wrappers re-raise oallama.errors types.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

llama_cpp_commit: str  # the pinned llama.cpp commit the libraries were built from
have_cuda: bool  # built with OALLAMA_CUDA=ON
have_vulkan: bool  # built with OALLAMA_VULKAN=ON

def backend_init() -> None: ...

# --- result structs (read-only; fields as in csrc/oallama.h) -----------------------------------
class Device:
    """oallama_device_info: a device ggml knows in this process."""

    @property
    def name(self) -> str: ...
    @property
    def ggml_name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def kind(self) -> str:
        """cpu | gpu | igpu | accel | rpc | other"""
    @property
    def buffer_type(self) -> str: ...
    @property
    def host_buffer_type(self) -> str:
        """its pinned host buffer type ("CUDA_Host", "Vulkan_Host"); "" if none"""
    @property
    def memory_free(self) -> int:
        """bytes; 0 when not queried"""
    @property
    def memory_total(self) -> int:
        """bytes; 0 when not queried"""

class TensorInfo:
    """oallama_tensor_info: a weight of a loaded model and where it lives."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str:
        """ggml type name"""
    @property
    def ne(self) -> tuple[int, int, int, int]:
        """elements per dimension"""
    @property
    def nbytes(self) -> int:
        """bytes"""
    @property
    def buffer_type(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def is_host(self) -> bool: ...

class GraphTensor:
    """oallama_graph_tensor: a node or leaf of a scheduled graph."""

    @property
    def name(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def type(self) -> str:
        """ggml type name"""
    @property
    def ne(self) -> tuple[int, int, int, int]: ...
    @property
    def nbytes(self) -> int:
        """bytes"""
    @property
    def srcs(self) -> tuple[int, ...]:
        """node index i >= 0, or leaf -1-j"""
    @property
    def view_src(self) -> int | None: ...
    @property
    def weight(self) -> str: ...
    @property
    def weight_slot(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def pinned(self) -> str: ...
    @property
    def host_buffer(self) -> bool: ...
    @property
    def supported_on(self) -> tuple[str, ...]: ...
    @property
    def caller_pinned(self) -> bool: ...
    @property
    def is_view(self) -> bool: ...
    @property
    def is_input(self) -> bool: ...
    @property
    def is_output(self) -> bool: ...

class Graph:
    """oallama_graph: one ubatch's graph as the context's scheduler splits it."""

    @property
    def backends(self) -> list[str]:
        """by priority, the CPU last"""
    @property
    def nodes(self) -> list[GraphTensor]: ...
    @property
    def leafs(self) -> list[GraphTensor]: ...
    @property
    def n_splits(self) -> int: ...
    @property
    def n_copies(self) -> int: ...

class MemoryUse:
    """oallama_memory_use: llama.cpp's memory use of a context in one buffer type (bytes)."""

    @property
    def buffer_type(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def model(self) -> int: ...
    @property
    def context(self) -> int: ...
    @property
    def compute(self) -> int: ...

class Timing:
    """oallama_timing: one measurement."""

    @property
    def samples_us(self) -> list[float]:
        """us, one per repeat, after warm-up"""
    @property
    def buffer_type(self) -> str: ...

class NodeTime:
    """oallama_node_time: one scheduled node of a timed decode."""

    @property
    def index(self) -> int:
        """position in execution order"""
    @property
    def name(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def ne(self) -> list[int]: ...
    @property
    def nbytes(self) -> int:
        """bytes of the result"""
    @property
    def src_ne(self) -> list[list[int]]:
        """shapes of its sources"""
    @property
    def src_bytes(self) -> int:
        """bytes of all its sources"""
    @property
    def weight_type(self) -> str:
        """ggml type of its first source if a model weight, else ''"""
    @property
    def device(self) -> str:
        """device the scheduler ran it on"""
    @property
    def start_us(self) -> float:
        """us (steady clock) when the scheduler reached it"""
    @property
    def done_us(self) -> float:
        """us when its range finished, synchronised; -1: not a stop"""
    @property
    def range_us(self) -> float:
        """us from its range's start to done_us; -1: not a stop"""

class NodeTimer:
    """Times a context's real graph (the scheduler's eval callback), node by node or in ranges."""

    def __init__(self, context: Context) -> None: ...
    def reset(self, stop_at: list[int] = ...) -> None: ...
    def times(self) -> list[NodeTime]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> NodeTimer: ...
    def __exit__(self, *args: object) -> None: ...

class Route:
    """oallama_route: one layer's routing in one pass."""

    @property
    def name(self) -> str: ...
    @property
    def n_used(self) -> int: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def ids(self) -> npt.NDArray[np.int32]:
        """[n_tokens, n_used]: the experts each token was routed to"""

class RouteRecorder:
    """Records a mixture of experts' routing in a context's real graph (ffn_moe_topk nodes)."""

    def __init__(self, context: Context) -> None: ...
    def reset(self) -> None: ...
    def routes(self) -> list[Route]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> RouteRecorder: ...
    def __exit__(self, *args: object) -> None: ...

class PollNode:
    """oallama_poll_node: one node of a CPU graph between two polling points (patch 0008)."""

    @property
    def name(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def rows(self) -> int:
        """output rows (ne[0])"""
    @property
    def n_chunks(self) -> int:
        """MUL_MAT chunks thread 0 reported (0: not a chunked matmul)"""
    @property
    def us(self) -> float:
        """us from the previous polling point to this node's end, serving excluded"""

class PollHook:
    """Polling points in the CPU backend (patch 0008): after every node, and inside the MUL_MATs
    named in pieces; source.poll_source()'s pending check decides when serve() runs."""

    def __init__(self, source: Any, serve: Callable[[], None] | None, pieces: dict[str, int] = ...,
                 every_node: bool = True, record: bool = False) -> None: ...
    def stats(self) -> dict[str, float]: ...
    def take_nodes(self) -> list[PollNode]: ...
    def mark(self) -> None: ...
    def check(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> PollHook: ...
    def __exit__(self, *args: object) -> None: ...

class FitResult:
    """oallama_fit_result: llama.cpp's automatic fit."""

    @property
    def fits(self) -> bool: ...
    @property
    def n_gpu_layers(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def overrides(self) -> list[tuple[str, str]]:
        """[(regex, device name)]"""

# --- handles ---------------------------------------------------------------------------------
class Context:
    """A llama_context borrowed from its owner: Context(llm._ctx) (a llama_cpp._internals.LlamaContext;
    anything else is a TypeError) or Session.context()."""

    def __init__(self, owner: Any) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def owner(self) -> Any: ...

class Model:
    """A llama_model borrowed from its owner: Model(llm._model) (a llama_cpp._internals.LlamaModel)
    or Session.model()."""

    def __init__(self, owner: Any) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def owner(self) -> Any: ...

# --- devices (devices.cpp) ------------------------------------------------------------------
def devices_list(query_rpc_memory: bool = False) -> list[Device]: ...
def device_memory(name: str) -> tuple[int, int]: ...
def device_address(name: str) -> int:
    """ggml_backend_dev_t for ctypes (llama_model_params.devices)."""
def buffer_type_address(name: str) -> int:
    """ggml_backend_buffer_type_t of a device or a CPU layout, for ctypes (tensor_buft_overrides)."""
def cpu_layouts() -> list[str]:
    """Host weight buffer types of this build: 'CPU' (plain), 'CPU_REPACK', 'CPU_REPACK_DUAL' (patch 0006)."""
def cpu_set_dual_max_batch(max_batch: int) -> None:
    """CPU_REPACK_DUAL: matmuls of fewer columns use the repacked copy (process-wide)."""
def device_name(name: str) -> str: ...
def rpc_add_server(endpoint: str) -> list[str]:
    """Register a reachable rpc-server (probe it first: a refused connection raises RuntimeError)."""
def rpc_set_timeout(seconds: float) -> None:
    """Bound every later send/receive to any rpc-server (process-wide; 0: wait forever)."""
def rpc_failed(endpoint: str) -> bool:
    """True once the open connection to this rpc-server failed (died, hung past the timeout, dropped)."""

# --- model (model.cpp) -----------------------------------------------------------------------
def model_tensors(model: Model) -> list[TensorInfo]: ...
def arch_is_supported(arch: str) -> bool: ...

# --- graphs and the scheduler (graph.cpp) -----------------------------------------------------
class Session:
    """A metadata-only model (no weight read) and a context."""

    def __init__(self, path: str, devices: Sequence[str] | None = None,
                 overrides: Sequence[tuple[str, str]] = ..., n_gpu_layers: int = 0, n_ctx: int = 4096,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int = 4, flash_attn: int = 0,
                 op_offload: bool = True, verbose: bool = False, type_k: str = "f16", type_v: str = "f16",
                 swa_full: bool = True, n_seq_max: int = 1, kv_unified: bool = False) -> None:
        """flash_attn: -1 auto (llama.cpp resolves it per layer's device), 0 off, 1 on; type_k / type_v: the
        KV cache's ggml types ("f16", "q8_0", ...); swa_full: a sliding-window layer's cache holds the
        whole context (llama-cpp-python's default) rather than its window; n_seq_max: parallel
        sequences (-np), each with a KV stream of n_ctx / n_seq_max cells unless kv_unified."""
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def context(self) -> Context: ...
    def model(self) -> Model: ...

def graph(context: Context, n_tokens: int, n_outputs: int = 1, n_seqs: int = 1) -> Graph:
    """n_seqs: the sequences the ubatch's tokens belong to (n_tokens / n_seqs each)."""
def memory(context: Context) -> list[MemoryUse]: ...
def set_offload_policy(context: Context, min_batch: Mapping[str, int]) -> None: ...
def get_offload_policy(context: Context) -> dict[str, int]: ...
def reserve(context: Context) -> None:
    """Reserve the scheduler and compute buffers once more (before the context's first decode)."""

# --- profiling (profile.cpp) -----------------------------------------------------------------
def profile_mul_mat(device: str, type: str, k: int, m: int, ns: Sequence[int], n_threads: int, warmup: int = 2,
                    repeats: int = 5, use_extra_bufts: bool = True, host_of: str = "",
                    layout: str = "", long_us: float = 0.0) -> list[Timing]:
    """One Timing per n in ns (CPU: the weight in host_of's pinned host buffer type when named; in the
    buffer type `layout` names when given). A column count whose first run takes long_us or more
    (0: none) is warmed up once and timed at most 3 times."""
def profile_copy(device: str, bytes: int, host_to_device: bool, warmup: int = 2, repeats: int = 5) -> Timing: ...
def profile_launch(device: str, n_threads: int, warmup: int = 2, repeats: int = 5, wait: bool = True) -> Timing: ...
def profile_mul_mat_id(device: str, type: str, k: int, m: int, n_expert: int, n_expert_used: int, ns: Sequence[int],
                       n_active: Sequence[int] = ..., n_threads: int = 1, warmup: int = 2, repeats: int = 5,
                       use_extra_bufts: bool = True, host_of: str = "", layout: str = "",
                       long_us: float = 0.0) -> list[Timing]:
    """MUL_MAT_ID of experts [k, m, n_expert]: one Timing per n in ns, routed to n_active[i] distinct experts
    (default min(n_expert, n * n_expert_used)); long_us: as profile_mul_mat's."""

# --- llama.cpp's automatic fit (fit.cpp; absent when built with OALLAMA_TOOLS=OFF) ---------
def fit_params(path: str, devices: Sequence[str], margins: Sequence[int], n_ctx: int, n_batch: int = 512,
               n_ubatch: int = 512, flash_attn: int = 0, type_k: str = "f16", type_v: str = "f16",
               n_seq_max: int = 1, kv_unified: bool = False) -> FitResult: ...

# --- quantization (quant.cpp, bindings.cpp) ---------------------------------------------------
def quant_compute_types(hparams: dict[str, Any], names: Sequence[str], shapes: Sequence[Sequence[int]],
                        ftype: int) -> list[int]:
    """ggml type id llama-quantize gives each tensor for a llama_ftype (-1: keep source type)."""
def quantize_rows(type: int, rows: npt.NDArray[np.float32]) -> bytes: ...
def type_name(arg0: int) -> str: ...
def pareto_walk(stages: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
                                       npt.NDArray[np.int64], npt.NDArray[np.float64], int, npt.NDArray[np.int64],
                                       npt.NDArray[np.float64]]],
                base: int, t0: float, cap: int, limit: float, max_entries: int,
                max_seconds: float, lambdas: Sequence[float] = ...,
                beam: bool = False, levels: Sequence[int] = ...) -> tuple[float, int, npt.NDArray[np.int64], int] | None:
    """Least-time path through a layered graph of placement decisions within `cap` bytes: stages of
    (src, dst, bytes fixed, bytes streamed, us, states before, least bytes after per state, rest
    bound [levels, len(lambdas), states after]); returns (us, bytes, edge per stage, largest front)
    or None; ValueError when a front exceeds max_entries or max_seconds pass. lambdas: the prices
    (us per byte) of the rest bound's rows (default [0]); beam: keep the max_entries entries of
    least bound per stage instead (a heuristic path); levels: the largest streamed sizes of the
    rows (ascending from 0; default: one, streaming unbounded)."""
def pareto_bounds(stages: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
                                         npt.NDArray[np.int64], npt.NDArray[np.float64], int, int]],
                  lambdas: Sequence[float], levels: Sequence[int] = ...) -> list[npt.NDArray[np.float64]]:
    """Per stage (and one more, zeros), [levels, len(lambdas), states] the least (us + lambda *
    bytes fixed) of any rest of the graph streaming no weight above each level; stages of (src,
    dst, bytes fixed, bytes streamed, us, states before, states after)."""
