"""The drop-in `Llama`: llama-cpp-python's Llama plus per-tensor placement.

Every constructor argument and method of `llama_cpp.Llama` works unchanged. New keywords:

    devices=    ggml device names the model may use, e.g. ["CPU", "CUDA0"] or
                ["CPU", "RPC[127.0.0.1:50052]"]; None keeps llama.cpp's default (all local GPUs)
    placement=  weight name -> device name; or the path of a plan file (`oallama plan -o`); or a
                strategy, "layers" | "affinity" | "optimal", planned here for gpu_budget= (without
                gpu_budget= and device=: a CPU-only plan of host weight layouts)
    gpu_budget= accelerator memory for the strategy: "12GiB" or "50%" of the weights
    host_budget= host memory for weights ("20GiB", "150%"): dual layouts may fill what they leave
    device=     the accelerator to plan for (default: the first GPU, else the first RPC device)
    workload=   oallama.planner.plan.Workload (or a mapping of its fields) to optimise for
                (default: prompt 512, generate 128, e2e)
    profile=    a Profile or profile JSON to plan with (default: measured once, then cached)
    confirm=    placement="optimal" only: True (default), False, or a planfile.ConfirmOptions (or mapping of
                its fields): the shortlisted plans -- the planner's best, llama.cpp's own placements for
                the budget -- loaded with this Llama's settings and run on the workload in turn; the
                measured fastest is loaded (llama.cpp's unless another measured faster). Cached.
    layouts=    host weight -> layout: "CPU" (plain), "CPU_REPACK" or "CPU_REPACK_DUAL" (both; matmuls
                below dual_max_batch= columns use the repacked copy). With layouts, llama.cpp's own
                repacking is off: weights not named are plain. A plan file may carry them.
    rpc_timeout= seconds any one send/receive to an rpc-server may take (process-wide; default
                devices.RPC_TIMEOUT_S, 0: wait forever). A server that dies, hangs or drops the
                connection raises RpcServerError naming it, from the load or the decode it broke;
                close this Llama then, and the next load connects afresh.
    load_progress= called with the load's progress (0..1) as llama.cpp reads weights; returning
                False cancels the load (ModelFileError).

    >>> llm = Llama("m.gguf", gpu_budget="50%", placement="optimal")   # profile, plan, load
    >>> llm.plan["predicted"]["tpot_ms"]

    >>> llm = Llama("m.gguf", devices=["CPU", "CUDA0"], placement={"output.weight": "CUDA0"})
    >>> llm.tensor_devices()["output.weight"]        # read back from the loaded model
    'CUDA0'

Weights the placement does not name follow `place.DEFAULT_RULE`. Without logits_all, embedding or a
draft model, the context reserves one row of logits per sequence (`outputs_reserved`), as llama-server
and oallama's plans do, not llama.cpp's default of one per token. n_seq_max= / kv_unified= set
llama.cpp's sequences (a plan for -np N sets them: a KV stream of n_ctx / N cells per sequence).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import llama_cpp
import llama_cpp.llama_cpp as _C

from .. import _core
from ..errors import (
    ClosedError,
    ModelFileError,
    OallamaError,
    PlacementError,
    PlanError,
    RpcServerError,
    UnknownDeviceError,
)
from ..model import gguf_file
from . import devices as devmod
from . import kvcache, place, planfile


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
        self.use_extra_bufts = spec.use_extra_bufts
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
        if not self.use_extra_bufts:
            params.use_extra_bufts = False


_params_hook_lock = threading.RLock()


class _LoadProgress:
    """llama_model_params.progress_callback calling a Python function; an exception it raises
    cancels the load and is re-raised by the caller (`error`)."""

    def __init__(self, fn: Callable[[float], bool | None]) -> None:
        self.error: BaseException | None = None

        def call(progress: float, _user_data: ctypes.c_void_p) -> bool:
            try:
                return fn(float(progress)) is not False
            except BaseException as e:  # ctypes would swallow it: re-raised after the load
                self.error = e
                return False

        self.callback = _C.llama_progress_callback(call)  # alive as long as this object

    def apply(self, params: _C.llama_model_params) -> None:
        params.progress_callback = self.callback
        params.progress_callback_user_data = None


@contextlib.contextmanager
def _model_params_hook(*hooks: _NativeLoadParams | _LoadProgress | None,
                       context: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Have llama_cpp.Llama.__init__ build its llama_model_params with our fields set, and its
    llama_context_params with the fields of `context` (n_outputs_max, n_seq_max, kv_unified).

    Llama.__init__ starts from llama_model_default_params() and llama_context_default_params() and
    never touches `devices`, `tensor_buft_overrides`, the progress callback, `n_outputs_max` or
    (without embedding) the sequences; wrapping those calls is the least intrusive way in.
    """
    active = [h for h in hooks if h is not None]
    if not active and not context:
        yield
        return
    with _params_hook_lock:
        original, original_ctx = _C.llama_model_default_params, _C.llama_context_default_params

        def patched() -> _C.llama_model_params:
            params = original()
            for h in active:
                h.apply(params)
            return params

        def patched_ctx() -> _C.llama_context_params:
            params = original_ctx()
            for k, v in (context or {}).items():
                setattr(params, k, v)
            return params

        _C.llama_model_default_params = patched
        if context:
            _C.llama_context_default_params = patched_ctx
        try:
            yield
        finally:
            _C.llama_model_default_params, _C.llama_context_default_params = original, original_ctx


def context_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The llama_context_params fields oallama sets that llama_cpp.Llama takes no keyword for:
    n_outputs_max (`outputs_reserved`), and n_seq_max / kv_unified, popped from kwargs (a plan for
    several sequences: one KV stream of n_ctx / n_seq_max cells each; llama_cpp's own generation
    uses the first)."""
    out: dict[str, Any] = {}
    n_seq_max, unified = kwargs.pop("n_seq_max", None), kwargs.pop("kv_unified", None)
    if n_seq_max is not None:
        if not isinstance(n_seq_max, int) or isinstance(n_seq_max, bool) or not 1 <= n_seq_max <= kvcache.MAX_SEQ:
            raise PlanError(f"n_seq_max={n_seq_max!r}: llama.cpp holds 1 to {kvcache.MAX_SEQ} sequences")
        out["n_seq_max"] = n_seq_max
    if unified is not None:
        out["kv_unified"] = bool(unified)
    if n := outputs_reserved(kwargs):  # per sequence, as llama-server reserves one per slot
        out["n_outputs_max"], out["n_outputs_max_per_seq"] = n * (n_seq_max or 1), n
    return out


def outputs_reserved(kwargs: Mapping[str, Any]) -> int:
    """The outputs (rows of logits) per ubatch a Llama with these keywords reserves compute memory
    for: 1 where it reads only the last token's logits (llama-cpp-python without logits_all,
    embedding or a draft model), as llama-server reserves one per slot; else 0 (llama.cpp's
    default: n_batch). llama.cpp's default would hold n_ubatch rows of the vocabulary in the
    output's compute buffer: 512 MiB at ubatch 512 for a 262144-token vocabulary."""
    wants_all = kwargs.get("logits_all") or kwargs.get("embedding") or kwargs.get("draft_model") is not None
    return 0 if wants_all else 1


def _rpc_error(failed: Sequence[str], doing: str, model_path: str) -> RpcServerError:
    then = ("the load was undone" if doing == "loading"
            else "close this model; the next load connects afresh")
    return RpcServerError(f"rpc-server {', '.join(failed)} failed while {doing} {model_path}: it died, hung past "
                          f"the rpc timeout or dropped the connection; {then}")


def _check_decodes(ctx: Any, endpoints: Sequence[str], model_path: str) -> None:
    """Make every decode of llama_cpp's context `ctx` (eval, generate, embed, the server's) raise
    RpcServerError when one of `endpoints` failed during it. The hook holds the context, never the
    Llama: a cycle through oallama's native handles (which the GC cannot see into) would keep a
    closed Llama alive."""
    decode = type(ctx).decode  # llama_cpp's: RuntimeError on a non-zero return

    def checked(batch: Any) -> None:
        try:
            decode(ctx, batch)
        except RuntimeError:
            if failed := devmod.failed_rpc_endpoints(endpoints):
                raise _rpc_error(failed, "decoding", model_path)  # noqa: B904 - keeps llama_decode's code
            raise
        _C.llama_synchronize(ctx.ctx)  # the servers' queued work has run (or failed)
        if failed := devmod.failed_rpc_endpoints(endpoints):
            raise _rpc_error(failed, "decoding", model_path)

    ctx.decode = checked


def _rpc_endpoints(spec: place.LoadSpec) -> list[str]:
    """Endpoints of the rpc-servers a load uses (its devices and override targets), in order."""
    names = [*(spec.devices or []), *(dev for _, dev in spec.overrides), *spec.assignment.values()]
    return list(dict.fromkeys(ep for n in names if (ep := devmod.rpc_endpoint(n)) is not None))


def _plan_devices(req: planfile.LoadRequest) -> list[str] | None:
    """A plan's devices, less the rpc-servers it puts nothing on: every weight and KV layer on the
    host, nothing streamed. An attached rpc-server costs each pass its synchronisations (a hand-over
    to its dispatcher thread at every llama_synchronize and logits read: 0.5-0.7 ms a token on a
    2-core VM) even when it runs nothing; local GPUs stay (llama.cpp's default device list)."""
    devices = list(req.devices or [])
    targets = {*(req.assignment or {}).values(), *(d for _, d in req.raw_overrides or ())}
    on_host = all(_is_host(d) for d in targets)
    streams = any(b < planfile.NEVER for b in (req.offload_policy or {}).values())
    if on_host and not streams and not req.n_gpu_layers:
        devices = [d for d in devices if devmod.rpc_endpoint(d) is None]
    return devices or None


def _is_host(name: str) -> bool:
    """Whether a device name is host memory, without probing an rpc-server; a name that does not
    resolve is not (the load reports it, naming the plan)."""
    if devmod.rpc_endpoint(name) is not None:
        return False
    try:
        return devmod.resolve(name).is_host
    except OallamaError:
        return False


def _trim(shape: Sequence[int]) -> tuple[int, ...]:
    """ggml's 4-d ne without trailing 1s: (4096, 1024, 1, 1) -> (4096, 1024)."""
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


# llama_cpp.Llama arguments a confirmation's candidate loads take from the load they confirm for
_CONFIRM_LOAD_KWARGS = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "flash_attn", "use_mmap",
                        "op_offload", "type_k", "type_v")


def _resolve(placement: Mapping[str, str] | str | Path | None, model: gguf_file.GGUFInfo,
             devices: Sequence[str] | None, gpu_budget: str | int | None, kwargs: dict[str, Any],
             device: str | None, workload: Any, profile: Any,
             host_budget: str | int | None = None, confirm: Any = None) -> planfile.LoadRequest:
    if gpu_budget is not None and placement is None:
        placement = "optimal"
    is_file = isinstance(placement, Path) or (isinstance(placement, str) and
                                              (bool(Path(placement).suffix) or Path(placement).exists()))
    if isinstance(placement, str) and not is_file:  # a strategy: ask the installed planner
        planner = planfile.planner()
        if placement not in planner.strategies:
            raise PlanError(f"placement '{placement}': not a plan file and not a strategy "
                            f"({', '.join(planner.strategies)})")
        acc = device or next((d for d in devices or [] if not devmod.resolve(d).is_host), None)
        if gpu_budget is None:
            if acc is not None:
                raise PlanError(f"placement='{placement}' on {acc} needs gpu_budget= (bytes such as '12GiB' or a "
                                "share such as '50%'); without device= and gpu_budget= the plan is CPU-only")
        elif acc is None:
            found = devmod.default_accelerator()
            if found is None:
                raise PlanError("no accelerator to plan for: pass device='CUDA0' or 'RPC[host:port]' "
                                "(oallama.runtime.rpc.start_server() starts a local one), or no gpu_budget= "
                                "for a CPU-only plan")
            acc = found.name
        load = {k: kwargs[k] for k in _CONFIRM_LOAD_KWARGS if kwargs.get(k) is not None}
        if workload is None or isinstance(workload, Mapping):  # planned with the attention it will load with
            workload = {**kvcache.workload_fields(kwargs), **(workload or {})}
        doc = planner(model.path, placement, gpu_budget, device=acc, workload=workload, profile=profile,
                      threads=kwargs.get("n_threads"), op_offload=kwargs.get("op_offload") is not False,
                      n_ubatch=int(kwargs.get("n_ubatch", 512)), progress=bool(kwargs.get("verbose", True)),
                      host_budget=host_budget, confirm=planfile.ConfirmOptions.of(confirm), load=load)
        return planfile.operator_plan_request(doc)
    if gpu_budget is not None or host_budget is not None:
        raise PlanError("gpu_budget= and host_budget= go with placement='layers'|'affinity'|'optimal', not with a "
                        "fixed placement")
    if confirm is not None:
        raise PlanError("confirm= goes with placement='optimal' (a strategy planned here), not with a fixed placement")
    if placement is None or isinstance(placement, Mapping):
        return planfile.LoadRequest(dict(placement) if placement is not None else None)
    if isinstance(placement, str | Path):
        return planfile.read(placement, model)
    raise PlanError(f"placement must be a mapping, a plan file or a strategy name, not {type(placement).__name__}")


class Llama(llama_cpp.Llama):
    """llama_cpp.Llama with `devices=`, `placement=` and `gpu_budget=` (see module docstring)."""

    def __init__(self, model_path: str, *args: Any, devices: Sequence[str] | None = None,
                 placement: Mapping[str, str] | str | Path | None = None, gpu_budget: str | int | None = None,
                 device: str | None = None, workload: Any = None, profile: Any = None,
                 layouts: Mapping[str, str] | None = None, dual_max_batch: int | None = None,
                 host_budget: str | int | None = None, confirm: Any = None, rpc_timeout: float | None = None,
                 load_progress: Callable[[float], bool | None] | None = None, **kwargs: Any) -> None:
        self._rpc_endpoints: list[str] = []
        if rpc_timeout is not None:
            devmod.set_rpc_timeout(rpc_timeout)
        self.model_info = gguf_file.check_model(model_path, vocab_only=bool(kwargs.get("vocab_only")))
        req = _resolve(placement, self.model_info, devices, gpu_budget, kwargs, device, workload, profile,
                       host_budget, confirm)
        if devices is None and req.devices is not None:
            devices = _plan_devices(req)
        if req.n_gpu_layers is not None:
            if "n_gpu_layers" in kwargs and kwargs["n_gpu_layers"] != req.n_gpu_layers:
                raise PlanError(f"n_gpu_layers={kwargs['n_gpu_layers']} conflicts with the plan's "
                                f"n_gpu_layers={req.n_gpu_layers}")
            kwargs["n_gpu_layers"] = req.n_gpu_layers
        for k, v in (req.llama_kwargs or {}).items():
            if kwargs.get(k) is not None and kwargs[k] != v:  # None: not given (llama_cpp's server passes it)
                raise PlanError(f"{k}={kwargs[k]!r} conflicts with the plan's {k}={v!r}")
            kwargs[k] = v
        if kwargs.get("op_offload") is False and req.offload_policy:
            if any(b < planfile.NEVER for b in req.offload_policy.values()):
                raise PlanError("the plan streams host weights to the accelerator, which needs op_offload=True")
            req.offload_policy = None  # "never stream" everywhere is what op_offload=False does anyway
        if layouts is not None:
            if req.layouts:
                raise PlanError("layouts= conflicts with the layouts of the plan; give one of them")
            req.layouts, req.dual_max_batch = dict(layouts), dual_max_batch
        if req.layouts and "CPU_REPACK_DUAL" in req.layouts.values() and kwargs.get("use_mmap") is False:
            # llama.cpp reads host buffers in place without mmap, which would skip the repacked copy
            raise PlacementError("dual layouts (CPU_REPACK_DUAL) need use_mmap=True")
        self.plan: dict[str, Any] | None = req.plan
        self.load_spec: place.LoadSpec | None = None
        named = [*(devices or []), *(req.assignment or {}).values()]
        if stale := devmod.failed_rpc_endpoints(dict.fromkeys(filter(None, map(devmod.rpc_endpoint, named)))):
            # before any connection is probed or anything allocated
            raise RpcServerError(f"the connection to rpc-server {', '.join(stale)} failed earlier and a model "
                                 f"loaded on it is still open: close that model first ({model_path} not loaded)")
        self._native_load_params: _NativeLoadParams | None = None
        if devices is not None or req.assignment is not None or req.raw_overrides or req.layouts:
            try:
                self.load_spec = place.build_load_spec(self.model_info, req.assignment, devices,
                                                       req.raw_overrides or (), int(kwargs.get("n_gpu_layers", 0)),
                                                       req.layouts, int(req.dual_max_batch or 0))
            except (UnknownDeviceError, RpcServerError, PlacementError) as e:
                if not isinstance(placement, str | Path) or not Path(placement).is_file():
                    raise
                raise type(e)(f"{placement}: {e}") from None  # a plan file's device that is not here
            self._native_load_params = _NativeLoadParams(self.load_spec)
            self._rpc_endpoints = _rpc_endpoints(self.load_spec)
            if self.load_spec.dual_max_batch > 0:
                _core.cpu_set_dual_max_batch(self.load_spec.dual_max_batch)  # process-wide (patch 0006)
        progress = _LoadProgress(load_progress) if load_progress is not None else None
        with _model_params_hook(self._native_load_params, progress, context=context_fields(kwargs)):
            try:
                super().__init__(model_path, *args, **kwargs)
            except jinja2.TemplateError as e:  # llama_cpp compiles the GGUF's chat templates
                raise ModelFileError(f"{model_path}: a chat template in the model (tokenizer.chat_template) is "
                                     f"not valid Jinja: {e}") from None
            except ValueError as e:
                if failed := devmod.failed_rpc_endpoints(self._rpc_endpoints):  # a server lost mid-load
                    self.close()  # frees what was loaded, and with it the failed connection
                    raise _rpc_error(failed, "loading", model_path) from None
                # llama_cpp's "Failed to load model from file: PATH": llama.cpp refused a file that
                # oallama's header checks let through (its reason is in llama.cpp's log)
                if isinstance(e, OallamaError) or not str(e).startswith("Failed to load model"):
                    raise
                if progress is not None and progress.error is not None:
                    raise progress.error from None
                if progress is not None:
                    raise ModelFileError(f"{model_path}: the load was cancelled (load_progress returned False)") \
                        from None
                raise ModelFileError(f"{model_path}: llama.cpp refused the model (its log, with verbose=True, "
                                     f"says why): {e}") from None
        # typed handles, taken once from llama-cpp-python's owners (Llama._model / Llama._ctx, its
        # _internals wrappers): they keep the owners alive and raise ClosedError after close()
        self._native_model: _core.Model | None = _core.Model(self._model)
        self._native_context: _core.Context | None = _core.Context(self._ctx)
        if self._rpc_endpoints:
            devmod.hold_rpc(self._rpc_endpoints)  # its connection serves the next model's load too
            self._rpc_held = True
            _C.llama_synchronize(self._ctx.ctx)  # the servers' queued work has run (or failed)
            if failed := devmod.failed_rpc_endpoints(self._rpc_endpoints):
                self.close()
                raise _rpc_error(failed, "loading", model_path)
            _check_decodes(self._ctx, self._rpc_endpoints, model_path)
        # every context gets one more scheduler reserve before its first decode (setting a policy
        # makes it): llama.cpp's context as created ran tiny's prompts on Vulkan0 (lavapipe) 1.29-1.41x
        # slower than after it, so plans with and without a policy ran in two states and the
        # calibration timed the slower one (bench/results/2026-11-24-vm-vulkan-reserve/); on a
        # loopback rpc-server and on qwen3moe-small it changed nothing measurable. A vocabulary-only
        # model has no graph to reserve (llama_sched_reserve aborts on it)
        try:
            if req.offload_policy:
                _core.set_offload_policy(self.native_context, req.offload_policy)
            elif not kwargs.get("vocab_only"):
                _core.reserve(self.native_context)
        except RuntimeError as e:
            self.close()
            if req.offload_policy:
                raise PlanError(str(e)) from None
            raise PlacementError(f"{model_path}: llama.cpp could not reserve the compute buffers: {e}") from None

    def failed_rpc_servers(self) -> list[str]:
        """Endpoints of this model's rpc-servers whose connection failed: non-empty, the model
        cannot decode any more (close it and load again)."""
        return devmod.failed_rpc_endpoints(self._rpc_endpoints)

    def close(self) -> None:
        # our checks can refuse a model before llama_cpp.Llama.__init__ ran: nothing to free then
        if hasattr(self, "_stack"):
            super().close()
        if getattr(self, "_rpc_held", False):
            devmod.release_rpc(self._rpc_endpoints)
            self._rpc_held = False

    @property
    def native_context(self) -> _core.Context:
        """The loaded llama_context as oallama's native layer takes it (oallama._core.Context);
        using it after close() raises ClosedError."""
        ctx = getattr(self, "_native_context", None)
        if ctx is None:  # pragma: no cover - refused loads raise from __init__ before any caller has self
            raise ClosedError(f"this Llama ({self.model_path}) has no context: it was not loaded")
        return ctx

    @property
    def native_model(self) -> _core.Model:
        """The loaded llama_model as oallama._core.Model; using it after close() raises ClosedError."""
        model = getattr(self, "_native_model", None)
        if model is None:  # pragma: no cover - as native_context
            raise ClosedError(f"this Llama ({self.model_path}) has no model: it was not loaded")
        return model

    def offload_policy(self) -> dict[str, int]:
        """Per-weight op offload thresholds in effect (weight -> min batch), read from the scheduler."""
        return dict(_core.get_offload_policy(self.native_context))

    # --- readback ---------------------------------------------------------------------------

    def tensor_placements(self) -> list[TensorPlacement]:
        """Every weight tensor of the loaded model with its device and buffer type, read from
        the model's own buffers. A tied weight that llama.cpp duplicates appears twice."""
        return [
            TensorPlacement(t.name, t.device, t.buffer_type, t.type, _trim(t.ne), t.nbytes, t.is_host)
            for t in _core.model_tensors(self.native_model)
        ]

    def tensor_devices(self) -> dict[str, str]:
        """weight name -> device name, read back from the loaded model: the first copy of a name, but
        of a tied embedding the last, its output copy, which is what a placement names (place.explicit)."""
        out: dict[str, str] = {}
        for t in self.tensor_placements():
            if t.name == place.TIED:
                out[t.name] = t.device
            else:
                out.setdefault(t.name, t.device)
        return out

    def bytes_per_device(self) -> dict[str, int]:
        """Weight bytes held on each device (bytes)."""
        return self._bytes_by(lambda t: t.device)

    def bytes_per_buffer_type(self) -> dict[str, int]:
        """Weight bytes in each buffer type (bytes): the memory a weight sits in, which sets the rate a
        streamed weight's copy leaves at (pinned "CUDA_Host", pageable "CPU_Mapped" / "CPU", repacked
        "CPU_REPACK")."""
        return self._bytes_by(lambda t: t.buffer_type)

    def _bytes_by(self, key: Callable[[TensorPlacement], str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensor_placements():
            out[key(t)] = out.get(key(t), 0) + t.nbytes
        return out
