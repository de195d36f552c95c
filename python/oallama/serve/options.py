"""The options of `oallama serve` (one dataclass, also its command-line flags) and their checks.

Nothing here imports the server's packages (FastAPI, uvicorn): `oallama --help` works without the
``serve`` extra, and a missing extra is a clear error when the command runs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OallamaError
from ..options import group, option
from ..runtime.planfile import ConfirmOptions
from ..runtime.rpc import RPC_TIMEOUT_S

API_KEY_ENV = "OALLAMA_API_KEY"
POOLING = ("none", "mean", "cls", "last")  # llama.cpp's pooling types (llama_pooling_type)
# llama_cpp.server settings that `oallama serve` sets from its own options (or must own)
OWNED_SETTINGS = {
    "model": "MODEL", "model_alias": "--alias", "host": "--host", "port": "--port", "api_key": "--api-key",
    "n_ctx": "--ctx", "n_threads": "--threads", "n_threads_batch": "--threads", "n_ubatch": "--ubatch",
    "chat_format": "--chat-format", "embedding": "--embedding", "verbose": "--verbose",
    "rpc_servers": "--devices / --rpc-local", "hf_model_repo_id": "MODEL (a local GGUF file)",
    "ssl_keyfile": "(not supported: put a TLS proxy in front)", "ssl_certfile": "(not supported: put a TLS proxy in front)",
}


class ServeError(OallamaError, RuntimeError):
    """The server cannot start or run: a missing `serve` extra, a port that cannot be bound, ..."""


class ServeOptionError(OallamaError, ValueError):
    """An `oallama serve` option (or llama_cpp.server setting) that cannot be used; names it."""


@dataclass
class ServeOptions:
    """What `oallama serve` serves, where, and how. Fields are the command's flags."""

    model: Path = option(positional=True, metavar="MODEL", help="GGUF model file")
    placement: str | None = option(None, help="placement or plan JSON file (oallama plan -o, oallama distribute -o)")
    gpu_budget: str | None = option(None, help="plan the placement for this accelerator budget ('50%', '2GiB')")
    strategy: str = option("optimal", help="planning strategy with --gpu-budget: layers, affinity or optimal")
    devices: list[str] | None = option(None, help="devices the model may use, e.g. CPU,RPC[127.0.0.1:50052]")
    device: str | None = option(None, help="the accelerator to plan for (default: the first GPU, else --rpc-local's)")
    rpc_local: bool = option(False, help="start a loopback rpc-server as a second device")
    rpc_threads: int = option(1, minimum=1, help="threads of that rpc-server")
    rpc_timeout: float = option(RPC_TIMEOUT_S, minimum=0, help="seconds an rpc-server may take to answer before it counts "
                                "as hung and its requests fail (0: wait forever)")
    plan_prompt: int = option(512, help="prompt tokens of the workload a --gpu-budget plan optimises for")
    plan_gen: int = option(128, help="generated tokens of that workload")
    profile: Path | None = option(None, help="profile JSON to plan with (default: measured once, then cached)")
    confirm: ConfirmOptions = group(ConfirmOptions)  # --gpu-budget with --strategy optimal: confirmed by measurement
    host: str = option("127.0.0.1", help="address to listen on; anything but loopback warns without an API key")
    port: int = option(8000, help="port to listen on (0: a free one, printed at start-up)")
    api_key: str | None = option(None, default_help=f"${API_KEY_ENV}, else none",
                                 help="require 'Authorization: Bearer KEY' on the API routes")
    alias: str | None = option(None, default_help="the file name without .gguf",
                               help="model name clients ask for (the 'model' field)")
    ctx: int = option(2048, help="context size in tokens (llama.cpp's n_ctx)")
    threads: int | None = option(None, minimum=1, default_help="llama-cpp-python's", help="CPU threads")
    ubatch: int = option(512, help="llama.cpp's n_ubatch")
    chat_format: str | None = option(None, default_help="the GGUF's chat template",
                                     help="llama-cpp-python chat format, e.g. chatml")
    embedding: bool = option(False, help="serve /v1/embeddings (loads the model with embeddings on)")
    pooling: str | None = option(None, choices=POOLING, default_help="the GGUF's",
                                 help="how --embedding pools token embeddings into one vector per input")
    queue: int = option(16, help="requests that may wait while one is served; more are refused with 429")
    shutdown_timeout: int = option(30, help="seconds SIGTERM waits for the request in flight")
    settings: str | None = option(None, metavar="JSON",
                                  help="further llama_cpp.server settings (its field names) as a JSON object or "
                                       "a .json/.yaml file, e.g. '{\"n_batch\": 256, \"flash_attn\": true}'")
    verbose: bool = option(False, help="show llama.cpp's log")

    def __post_init__(self) -> None:
        self.model = Path(self.model)
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
        for name, value, low in (("--ctx", self.ctx, 1), ("--ubatch", self.ubatch, 1), ("--queue", self.queue, 0),
                                 ("--rpc-threads", self.rpc_threads, 1), ("--plan-prompt", self.plan_prompt, 1),
                                 ("--plan-gen", self.plan_gen, 1), ("--rpc-timeout", self.rpc_timeout, 0)):
            if value < low:
                raise ServeOptionError(f"{name} {value}: must be at least {low}")
        if self.threads is not None and self.threads < 1:
            raise ServeOptionError(f"--threads {self.threads}: must be at least 1")
        if not 0 <= self.port <= 65535:
            raise ServeOptionError(f"--port {self.port}: not a TCP port (0-65535)")
        if self.shutdown_timeout <= 0:
            raise ServeOptionError(f"--shutdown-timeout {self.shutdown_timeout}: must be at least 1 s")
        if self.placement is not None and self.gpu_budget is not None:
            raise ServeOptionError("--placement and --gpu-budget: give one (a plan file, or a budget to plan for)")
        if self.api_key is not None and not self.api_key.strip():
            raise ServeOptionError("--api-key: empty")

    @property
    def model_alias(self) -> str:
        """The name clients use for the model."""
        return self.alias or self.model.name.removesuffix(".gguf")

    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    def extra_settings(self) -> dict[str, Any]:
        """--settings as a mapping (not yet checked against llama_cpp.server's setting names)."""
        return parse_settings(self.settings)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(opts: ServeOptions) -> str | None:
    """Warn (RuntimeWarning) about a server reachable from other machines without an API key;
    returns the warning's text, or None on loopback or with a key."""
    if opts.is_loopback() or opts.api_key:
        return None
    text = (f"serving on {opts.host} without an API key: anyone who can reach this address can use the model "
            f"(pass --api-key or set ${API_KEY_ENV})")
    warnings.warn(text, RuntimeWarning, stacklevel=2)
    return text


def parse_settings(value: str | None) -> dict[str, Any]:
    """--settings: a JSON object, or a .json/.yaml/.yml file holding one."""
    if value is None:
        return {}
    text = value.strip()
    source = "--settings"
    if not text.startswith(("{", "[")):
        path = Path(value)
        if not path.is_file():
            raise ServeOptionError(f"--settings {value!r}: neither a JSON object nor an existing file")
        source = f"--settings {path}"
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ServeOptionError(f"{source}: reading YAML needs PyYAML (pip install 'oallama[serve]')") from None
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise ServeOptionError(f"{source}: not valid YAML: {e}") from None
            return _check_mapping(doc, source)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ServeOptionError(f"{source}: not valid JSON: {e}") from None
    return _check_mapping(doc, source)


def _check_mapping(doc: Any, source: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ServeOptionError(f"{source}: expected an object of llama_cpp.server settings, got {type(doc).__name__}")
    owned = sorted(k for k in doc if k in OWNED_SETTINGS)
    if owned:
        raise ServeOptionError(f"{source}: {', '.join(owned)} {'is' if len(owned) == 1 else 'are'} set by "
                               + "; ".join(f"{k}: {OWNED_SETTINGS[k]}" for k in owned))
    return dict(doc)
