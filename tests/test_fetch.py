"""scripts/fetch_llama.py where pip is not importable (`pip install .`'s isolated build
environment, which runs it at configure time): the sdist comes from the package index's simple
page, is checked against the PIN's sha256, and a wrong or missing file is a clear error that
leaves nothing behind under the sdist's name.

A local HTTP server stands in for the index; it serves the sdist the set-up step cached."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_llama", ROOT / "scripts" / "fetch_llama.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fetch = _fetch_module()
PIN = fetch.read_pin()
CACHED = fetch.CACHE_DIR / PIN["sdist"]


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(simple index URL, the directory it serves)."""
    root = tmp_path / "www"
    (root / "simple" / "llama-cpp-python").mkdir(parents=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", root
    finally:
        server.shutdown()
        server.server_close()


def _publish(root: Path, payload: Path | bytes) -> None:
    files = root / "files"
    files.mkdir(exist_ok=True)
    target = files / PIN["sdist"]
    if isinstance(payload, Path):
        target.symlink_to(payload)
    else:
        target.write_bytes(payload)
    (root / "simple" / "llama-cpp-python" / "index.html").write_text(
        f'<html><body><a href="../../files/{PIN["sdist"]}#sha256=00">{PIN["sdist"]}</a></body></html>')


@pytest.fixture
def no_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, index: tuple[str, Path]) -> Path:
    real = importlib.util.find_spec
    monkeypatch.setattr(fetch.importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real(name, *a))
    monkeypatch.setattr(fetch, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("PIP_INDEX_URL", index[0])
    monkeypatch.delenv("OALLAMA_SDIST_URL", raising=False)
    return tmp_path / "cache"


@pytest.mark.skipif(not CACHED.exists(), reason=f"{CACHED} is not cached (scripts/setup.sh fetches it)")
def test_sdist_from_the_index_when_pip_is_not_importable(no_pip: Path, index: tuple[str, Path]) -> None:
    _publish(index[1], CACHED)
    got = fetch.download_sdist(PIN)
    assert got == no_pip / PIN["sdist"] and fetch.sha256_of(got) == PIN["sha256"]
    assert not list(no_pip.glob("*.part"))


def test_a_file_that_is_not_the_pinned_sdist_is_refused(no_pip: Path, index: tuple[str, Path]) -> None:
    _publish(index[1], b"not llama.cpp")
    with pytest.raises(fetch.FetchError, match="does not match PIN"):
        fetch.download_sdist(PIN)
    assert not (no_pip / PIN["sdist"]).exists()  # kept aside as *.sha256-mismatch, never used


def test_an_index_without_the_sdist_is_a_clear_error(no_pip: Path, index: tuple[str, Path]) -> None:
    (index[1] / "simple" / "llama-cpp-python" / "index.html").write_text("<html></html>")
    with pytest.raises(fetch.FetchError, match=f"lists no {PIN['sdist']}"):
        fetch.download_sdist(PIN)
    shutil.rmtree(index[1] / "simple")
    with pytest.raises(fetch.FetchError, match="could not download"):
        fetch.download_sdist(PIN)
    assert not list(no_pip.iterdir())
