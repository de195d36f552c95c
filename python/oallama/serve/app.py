"""The OpenAI-compatible app of `oallama serve`: llama_cpp.server's own, over a placed model.

llama-cpp-python's server (``llama_cpp.server``, its ``[server]`` extra) provides the routes
(``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` with the GGUF's chat template,
streaming or not, ``/v1/embeddings``, ``/extras/tokenize``...) and the settings its users know
(`ModelSettings`, `ServerSettings`). oallama changes three things, none of them inside its code:

* the model loads through oallama's `Llama` (devices, a placement, or a plan for a budget):
  `PlacedLlamaProxy` runs llama_cpp.server's own loader with ``Llama`` bound to oallama's for that
  call, so every ModelSettings field works as it does there;
* `RequestGate` (gate.py) sits in front of the routes: clear 400/404/422 errors, a bounded queue,
  a drain on shutdown;
* two routes of its own: ``GET /health`` (no key needed) and ``GET /placement`` (weight -> device
  read back from the loaded model, per-device totals, the plan and its predicted TTFT/TPOT).

llama_cpp.server keeps its app state in module globals: one app per process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp
import llama_cpp.server.app as upstream_app
import llama_cpp.server.model as upstream_model
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from llama_cpp.server import types as api_types
from llama_cpp.server.model import LlamaProxy
from llama_cpp.server.settings import ModelSettings, ServerSettings
from pydantic import BaseModel, ValidationError
from starlette.middleware import Middleware

from ..errors import OallamaError
from ..runtime import planfile
from ..runtime.llama import Llama
from .gate import Admission, RequestGate
from .options import ServeError, ServeOptionError, ServeOptions

# the routes that use the model (llama_cpp.server takes its model lock for each), with their body
ROUTES: dict[str, type[BaseModel] | None] = {
    "/v1/models": None,
    "/v1/completions": api_types.CreateCompletionRequest,
    "/v1/engines/copilot-codex/completions": api_types.CreateCompletionRequest,
    "/v1/chat/completions": api_types.CreateChatCompletionRequest,
    "/v1/embeddings": api_types.CreateEmbeddingRequest,
    "/extras/tokenize": api_types.TokenizeInputRequest,
    "/extras/tokenize/count": api_types.TokenizeInputRequest,
    "/extras/detokenize": api_types.DetokenizeInputRequest,
}


# --- settings ---------------------------------------------------------------------------------


def build_settings(opts: ServeOptions) -> tuple[ServerSettings, ModelSettings, set[str]]:
    """llama_cpp.server's settings from the options; also the setting names --settings gave."""
    extra = opts.extra_settings()
    server_fields, model_fields = set(ServerSettings.model_fields), set(ModelSettings.model_fields)
    unknown = sorted(set(extra) - server_fields - model_fields)
    if unknown:
        raise ServeOptionError(f"--settings: unknown llama_cpp.server setting(s) {', '.join(unknown)}")
    model_kw: dict[str, Any] = {"logits_all": False}  # upstream's True keeps every token's logits: opt in
    model_kw.update({k: v for k, v in extra.items() if k in model_fields})
    model_kw.update(model=str(opts.model), model_alias=opts.model_alias, n_ctx=opts.ctx, n_ubatch=opts.ubatch,
                    chat_format=opts.chat_format, embedding=opts.embedding, verbose=opts.verbose)
    if opts.threads is not None:
        model_kw.update(n_threads=opts.threads, n_threads_batch=opts.threads)
    # the gate serialises requests; upstream's "interrupt a stream when another request waits" is off
    server_kw: dict[str, Any] = {"interrupt_requests": False}
    server_kw.update({k: v for k, v in extra.items() if k in server_fields})
    server_kw.update(host=opts.host, port=opts.port, api_key=opts.api_key)
    try:
        return ServerSettings(**server_kw), ModelSettings(**model_kw), set(extra)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ServeOptionError(f"--settings: {problems}") from None


def llama_kwargs(opts: ServeOptions, rpc_device: str | None = None) -> dict[str, Any]:
    """oallama Llama's keywords that llama_cpp.server's settings lack: the placement (devices=,
    placement=, gpu_budget=, ...) and the embeddings' pooling."""
    kw: dict[str, Any] = {}
    if opts.pooling is not None:
        kw["pooling_type"] = getattr(llama_cpp, f"LLAMA_POOLING_TYPE_{opts.pooling.upper()}")
    devices = list(opts.devices) if opts.devices else None
    if rpc_device is not None:
        devices = [*(devices or ["CPU"]), rpc_device]
    if opts.gpu_budget is None:
        if opts.placement is not None:
            kw["placement"] = opts.placement
        if devices is not None:
            kw["devices"] = devices
        return kw
    strategies = planfile.planner().strategies
    if opts.strategy not in strategies:
        raise ServeOptionError(f"--strategy {opts.strategy}: choose one of {', '.join(strategies)}")
    accelerator = opts.device or (devices[-1] if devices and len(devices) > 1 else None)
    kw.update(placement=opts.strategy, gpu_budget=opts.gpu_budget, device=accelerator,
              workload={"prompt": opts.plan_prompt, "gen": opts.plan_gen, "n_ubatch": opts.ubatch},
              profile=str(opts.profile) if opts.profile else None, confirm=opts.confirm)
    return kw


def unavailable(opts: ServeOptions, llm: Llama, settings: ModelSettings) -> tuple[str | None, str | None]:
    """Why this server cannot answer embeddings, and logprobs (None: it can)."""
    no_embeddings = None
    if not opts.embedding:
        no_embeddings = "embeddings are off on this server: start it with oallama serve --embedding"
    elif llama_cpp.llama_pooling_type(llm.ctx) == llama_cpp.LLAMA_POOLING_TYPE_NONE:
        no_embeddings = ("this model pools no embeddings (pooling type none: one vector per token, not per "
                         "input): start the server with --pooling mean (or cls, last)")
    no_logprobs = None
    if not settings.logits_all:
        no_logprobs = ("logprobs are off on this server: start it with --settings '{\"logits_all\": true}' "
                       "(llama.cpp then keeps every token's logits)")
    return no_embeddings, no_logprobs


def chat_report(llm: Llama, settings: ModelSettings) -> dict[str, Any]:
    """How chats are formatted: the chat format in use, whether the GGUF has a chat template, and
    a warning when llama-cpp-python fell back to guessing (a base model: its replies to chats are
    often empty or nonsense)."""
    has_template = "tokenizer.chat_template" in (llm.metadata or {})
    warning = None
    if settings.chat_format is None and getattr(llm, "chat_handler", None) is None and not has_template:
        warning = (f"{llm.model_path} has no chat template (a base model?): /v1/chat/completions formats chats as "
                   f"llama-cpp-python's fallback '{llm.chat_format}'; name the model's format with --chat-format "
                   "(e.g. chatml, gemma) or send plain prompts to /v1/completions")
    return {"format": llm.chat_format, "template": has_template, "warning": warning}


# --- loading ----------------------------------------------------------------------------------


class _LlamaCppWithLlama(types.ModuleType):
    """llama_cpp as llama_cpp.server's loader sees it while it loads for us: ``Llama`` is ours."""

    def __init__(self, factory: Any) -> None:
        super().__init__("llama_cpp")
        self.Llama = factory

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)


@contextlib.contextmanager
def _bound(module: types.ModuleType, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


# ModelSettings' defaults that would overrule a plan's own (n_gpu_layers 0, flash attention off, the
# KV cache's types): passed on only where the user gave them (the plan's sequences, n_seq_max and
# kv_unified, are not ModelSettings': llama_cpp.server never passes them)
_PLAN_SETTINGS = ("n_gpu_layers", "flash_attn", "type_k", "type_v")


def _placed_llama(ours: dict[str, Any], given: frozenset[str], *, model_path: str, **kwargs: Any) -> Llama:
    for k in _PLAN_SETTINGS:
        if k not in given:
            kwargs.pop(k, None)
    return Llama(model_path, **ours, **kwargs)


class PlacedLlamaProxy(LlamaProxy):
    """llama_cpp.server's model proxy, loading through oallama's `Llama` with a placement."""

    def __init__(self, models: list[ModelSettings], *, llama_kwargs: dict[str, Any],
                 given: frozenset[str] = frozenset()) -> None:
        self._llama_kwargs = llama_kwargs  # oallama's keywords (placement, ...) for every load
        self._given = given  # the model settings the user gave
        super().__init__(models)

    def load_llama_from_model_settings(self, settings: ModelSettings) -> llama_cpp.Llama:  # type: ignore[override]
        if settings.hf_model_repo_id is not None:
            raise ServeOptionError("hf_model_repo_id: oallama serve loads a local GGUF file (MODEL)")
        factory = functools.partial(_placed_llama, self._llama_kwargs, self._given)
        with _bound(upstream_model, "llama_cpp", _LlamaCppWithLlama(factory)):
            return LlamaProxy.load_llama_from_model_settings(settings)

    @property
    def model(self) -> Llama:
        llm = self._current_model
        if not isinstance(llm, Llama):
            raise ServeError("the server's model is not loaded")
        return llm


# --- placement report -------------------------------------------------------------------------


def placement_report(llm: Llama, alias: str) -> dict[str, Any]:
    """What GET /placement answers: where every weight is, read back from the loaded model, and
    the plan (strategy, budget, workload, predicted TTFT/TPOT) when the placement was planned."""
    tensors = llm.tensor_devices()  # a weight llama.cpp duplicates: the copy a placement names, once
    nbytes = {t.name: t.nbytes for t in llm.tensor_placements()}
    per_device: dict[str, dict[str, int]] = {}
    for name, dev in tensors.items():
        d = per_device.setdefault(dev, {"tensors": 0, "bytes": 0})
        d["tensors"] += 1
        d["bytes"] += nbytes[name]
    plan = llm.plan
    plan_info = None
    if plan is not None:
        plan_info = {k: plan.get(k) for k in ("schema", "strategy", "accelerator", "devices", "budget", "workload",
                                              "n_gpu_layers", "predicted", "placement")}
    return {"model": alias, "path": str(llm.model_path), "devices": per_device, "tensors": tensors,
            "offload_min_batch": llm.offload_policy(), "plan": plan_info}


def placement_lines(report: dict[str, Any]) -> list[str]:
    """The start-up log lines that say where the model was placed."""
    lines = []
    plan = report["plan"]
    if plan and plan.get("predicted"):
        pred, budget = plan["predicted"], plan.get("budget") or {}
        lines.append(f"plan '{plan.get('strategy')}' for a {budget.get('request', '?')} budget on "
                     f"{plan.get('accelerator')}: predicted TTFT {pred['ttft_ms']:.1f} ms, TPOT {pred['tpot_ms']:.2f} ms")
    for dev, d in report["devices"].items():
        lines.append(f"placed {d['tensors']} weights ({d['bytes'] / 2**20:.1f} MiB) on {dev}")
    return lines


# --- the app ----------------------------------------------------------------------------------


@dataclass
class ServedApp:
    """The app, its loaded model, its admission queue and its placement report."""

    app: FastAPI
    proxy: PlacedLlamaProxy
    admission: Admission
    report: dict[str, Any]
    alias: str

    @property
    def llm(self) -> Llama:
        return self.proxy.model

    def close(self) -> None:
        with contextlib.suppress(ServeError):
            self.llm.close()


def build_app(opts: ServeOptions, *, rpc_device: str | None = None) -> ServedApp:
    """Load the model with its placement and build llama_cpp.server's app around it."""
    if os.environ.get("CONFIG_FILE"):
        raise ServeOptionError("CONFIG_FILE is set: llama_cpp.server would take its settings from it instead of "
                               "oallama serve's options; unset it (use --settings for llama_cpp.server settings)")
    server_settings, model_settings, given = build_settings(opts)
    ours = llama_kwargs(opts, rpc_device)
    try:
        proxy = PlacedLlamaProxy([model_settings], llama_kwargs=ours, given=frozenset(given))
    except OallamaError:
        raise
    except (ValueError, RuntimeError) as e:
        raise ServeError(f"{opts.model}: cannot load the model: {e}") from None
    alias = opts.model_alias
    try:
        # create_app builds its proxy from the settings: hand it the one that holds our model
        with _bound(upstream_app, "LlamaProxy", lambda models: proxy):
            app = upstream_app.create_app(server_settings=server_settings, model_settings=[model_settings])
        report = placement_report(proxy.model, alias)
        report["chat"] = chat_report(proxy.model, model_settings)
        no_embeddings, no_logprobs = unavailable(opts, proxy.model, model_settings)
    except BaseException:
        proxy.free()
        raise
    admission = Admission(opts.queue)
    # innermost of the user middleware: CORS and request ids apply to the gate's answers too
    app.user_middleware.append(Middleware(RequestGate, admission=admission, routes=ROUTES, model_names=[alias],
                                          api_key=opts.api_key, no_embeddings=no_embeddings,
                                          no_logprobs=no_logprobs))

    @app.get("/health", tags=["oallama"], summary="Liveness and queue")
    async def health() -> JSONResponse:
        state = admission.snapshot()
        failed = proxy.model.failed_rpc_servers()  # the model cannot decode: say so, not "ok"
        status = "shutting_down" if admission.closing else "rpc_server_failed" if failed else "ok"
        body = {"status": status, "model": alias, **state, **({"failed_rpc_servers": failed} if failed else {})}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    # llama_cpp.server's model list, with how the model formats chats (a base model: says so)
    @app.get("/v1/models", tags=["OpenAI V1"], summary="Models", dependencies=[Depends(upstream_app.authenticate)])
    async def models() -> JSONResponse:
        chat = report["chat"]
        entry = {"id": alias, "object": "model", "owned_by": "me", "permissions": [], "chat_format": chat["format"],
                 "chat_template": chat["template"], **({"warning": chat["warning"]} if chat["warning"] else {})}
        return JSONResponse({"object": "list", "data": [entry]})

    # first, ahead of llama_cpp.server's own /v1/models (its router's routes are matched in order)
    app.router.routes.insert(0, app.router.routes.pop())

    @app.get("/placement", tags=["oallama"], summary="Where the model's weights are, and the plan",
             dependencies=[Depends(upstream_app.authenticate)])
    async def placement() -> JSONResponse:
        return JSONResponse(report)

    return ServedApp(app, proxy, admission, report, alias)
