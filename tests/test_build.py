"""The package's relation to its native build: one llama.cpp per process, clear build errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oallama
from oallama import _core, _libs

ROOT = Path(__file__).resolve().parent.parent


def test_llama_cpp_uses_oallamas_libraries() -> None:
    import llama_cpp.llama_cpp as C

    assert Path(C._lib._name).resolve().parent == _libs.lib_dir().resolve()
    assert os.environ["LLAMA_CPP_LIB_PATH"] == str(_libs.lib_dir())
    # one libllama in the process: _core (DT_NEEDED) and llama_cpp (dlopen) share it
    maps = Path("/proc/self/maps").read_text()
    assert len({line.split()[-1] for line in maps.splitlines() if line.endswith("/libllama.so")}) == 1


def test_build_records_the_pinned_upstream() -> None:
    pin = dict(line.split("=", 1) for line in (ROOT / "third_party/llama.cpp/PIN").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    stamp = _libs.llama_cpp_stamp()
    assert stamp["llama_cpp_commit"] == pin["llama_cpp_commit"] == _core.llama_cpp_commit
    assert stamp["sdist_sha256"] == pin["sha256"]
    for tool in ("rpc-server", "llama-quantize"):
        assert os.access(_libs.tool_path(tool), os.X_OK)



def test_cpu_backend_is_built_without_amx() -> None:
    """ggml's AMX path, which -march=native turns on for an AMX-INT8 CPU, segfaults on every pass of
    more than one token (ggml-org/llama.cpp#20824; every prompt on the project's Xeon VM): CMakeLists.txt
    builds ggml-cpu without it, and its system info says so (the other native instructions stay)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    assert info.startswith("CPU :"), info
    assert "AMX_INT8 = 1" not in info, f"ggml-cpu was built with AMX: {info}"

def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_llama_cpp_imported_first_with_other_libraries_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other-lib"
    shutil.copytree(_libs.lib_dir(), other)
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(other)}
    res = _run("import llama_cpp\nimport oallama", env)
    assert res.returncode != 0
    assert "LibraryMismatchError" in res.stderr and str(other) in res.stderr and "Import oallama before" in res.stderr


def test_foreign_lib_path_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(tmp_path)}
    res = _run("import oallama", env)
    assert res.returncode != 0 and "points at other llama.cpp libraries" in res.stderr


def test_oallama_first_then_llama_cpp_is_fine() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    res = _run("import oallama, llama_cpp; print(llama_cpp.llama_cpp._lib._name)", env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(_libs.lib_dir()))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cuda_requested_without_a_cuda_compiler_fails_clearly(tmp_path: Path) -> None:
    cmd = ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "b"), "-DOALLAMA_CUDA=ON",
           "-DCMAKE_CUDA_COMPILER=/nonexistent/nvcc"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "OALLAMA_CUDA/OALLAMA_KERNELS=ON but no CUDA compiler" in res.stderr
    assert "/nonexistent/nvcc" in res.stderr


def test_version() -> None:
    from importlib.metadata import version

    from packaging.version import Version

    # one version: the installed distribution's metadata (what the build read from _version.py), the
    # package's attribute and the CLI's --version agree, and it is a PEP 440 version
    assert oallama.__version__ == version("oallama")
    assert str(Version(oallama.__version__)) == oallama.__version__
    res = subprocess.run([sys.executable, "-m", "oallama", "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"oallama {oallama.__version__}"
    # ... and what the libraries were built from: the pinned commit, every patch, the backends
    stamp = _libs.llama_cpp_stamp()
    assert lines[1].startswith(f"llama.cpp {str(stamp['llama_cpp_commit'])[:9]} + {len(stamp['patches'])} patch")
    assert [ln.strip() for ln in lines[2:-1]] == [p[0] for p in stamp["patches"]]
    assert lines[-1].startswith("backends: CPU, RPC") and ("Vulkan" in lines[-1]) == bool(_core.have_vulkan)
