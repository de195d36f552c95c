"""Where oallama's native files live, and pointing llama-cpp-python at them.

oallama builds llama.cpp's shared libraries itself (pinned + patched) and installs them in
the package: ``oallama/lib/*.so``, tools in ``oallama/bin/``, vocab-only GGUFs in
``oallama/vocab/``. llama-cpp-python is installed without libraries of its own and loads ours
through ``LLAMA_CPP_LIB_PATH``, which must be set before ``llama_cpp`` is imported. Both
``oallama._core`` and llama-cpp-python then share one libllama/libggml in the process.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

from .errors import LibraryMismatchError


@functools.cache
def native_dir() -> Path:
    """Directory holding ``_core`` and, beside it, ``lib/``, ``bin/`` and ``vocab/``."""
    spec = importlib.util.find_spec("oallama._core")
    if spec is None or spec.origin is None:
        raise ImportError(
            "oallama._core is not built: run scripts/setup.sh (or `pip install -e .` after "
            "`python scripts/fetch_llama.py`)"
        )
    return Path(spec.origin).resolve().parent


def lib_dir() -> Path:
    return native_dir() / "lib"


def bin_dir() -> Path:
    return native_dir() / "bin"


def vocab_dir() -> Path:
    return native_dir() / "vocab"


def tool_path(name: str) -> Path:
    path = bin_dir() / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the native build did not produce '{name}'")
    return path


@functools.cache
def llama_cpp_stamp() -> dict[str, object]:
    """What upstream tree the libraries were built from (sdist sha256, commit, patches)."""
    return json.loads((native_dir() / "llama_cpp_stamp.json").read_text())


def describe_build() -> list[str]:
    """What the native libraries were built from: the llama.cpp commit and patches, one line per
    patch, and the backends built in (`oallama --version`, `oallama devices`)."""
    from . import _core

    stamp = llama_cpp_stamp()
    patches = [str(p[0]) for p in stamp.get("patches", [])]  # type: ignore[union-attr]
    backends = ["CPU", "RPC"] + (["CUDA"] if _core.have_cuda else []) + (["Vulkan"] if _core.have_vulkan else [])
    return [f"llama.cpp {str(stamp['llama_cpp_commit'])[:9]} + {len(patches)} patch(es)",
            *(f"  {p}" for p in patches), f"backends: {', '.join(backends)}"]


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def configure_llama_cpp() -> None:
    """Point llama-cpp-python at oallama's libraries; refuse to mix two llama.cpp builds."""
    ours = lib_dir()
    loaded = sys.modules.get("llama_cpp.llama_cpp")
    if loaded is not None:
        lib = getattr(loaded, "_lib", None)
        where = Path(getattr(lib, "_name", "") or "<unknown>").parent
        if not _same(where, ours):
            raise LibraryMismatchError(
                f"llama_cpp was imported before oallama and loaded its llama.cpp from {where}; "
                f"oallama needs its own build in {ours}. Import oallama before llama_cpp "
                f"(or set LLAMA_CPP_LIB_PATH={ours} before starting Python)."
            )
        return
    env = os.environ.get("LLAMA_CPP_LIB_PATH")
    if env and not _same(Path(env), ours):
        raise LibraryMismatchError(
            f"LLAMA_CPP_LIB_PATH={env} points at other llama.cpp libraries than oallama's ({ours}); "
            "unset it or point it at oallama's."
        )
    os.environ["LLAMA_CPP_LIB_PATH"] = str(ours)
