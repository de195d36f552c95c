"""The README's install command from a clean clone, in a fresh virtual environment: pip builds
oallama (fetching and patching the pinned llama.cpp at configure time) and llama-cpp-python's
bindings, and the installed `oallama` runs the main job on a synthetic model.

Slow (a whole native build: about 7 minutes on 2 cores); the clone is of this checkout's HEAD,
so uncommitted changes are not in it. The sdist that the set-up step cached is reused
(OALLAMA_FETCH_CACHE), as are pip's own caches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = 'CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" pip install .'


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.slow
def test_pip_install_from_a_clean_clone(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    clone, venv = tmp_path / "clone", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OALLAMA_", "LLAMA_CPP_", "CMAKE_"))}
    env["OALLAMA_FETCH_CACHE"] = str(ROOT / "third_party" / "llama.cpp" / ".cache")
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(os.cpu_count() or 2)
    env["OALLAMA_CACHE"] = str(tmp_path / "cache")  # profiles stay in the test's directory
    _run(["git", "clone", "-q", str(ROOT), str(clone)], tmp_path, env, 300)
    assert not (clone / "third_party" / "llama.cpp" / "src").exists()  # nothing upstream in the clone
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 300)
    py = venv / "bin" / "python"
    t0 = time.monotonic()
    # the README's command, as a new user types it in the clone
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "."], clone,
         {**env, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}, 3600)
    print(f"{INSTALL}: {time.monotonic() - t0:.0f} s")
    oallama = str(venv / "bin" / "oallama")
    out = tmp_path / "run"
    out.mkdir()  # outside the clone: the installed package, not the source tree, is imported
    version = _run([oallama, "--version"], out, env, 120)
    assert version.splitlines()[1].startswith("llama.cpp ") and "backends: CPU, RPC" in version
    _run([oallama, "synth", "--preset", "tiny", "--type", "q8_0", "-o", "tiny.gguf", "--quiet"], out, env, 300)
    ran = _run([oallama, "run", "tiny.gguf", "--rpc-local", "--gpu-budget", "50%", "--strategy", "layers"], out, env, 600)
    assert "TTFT" in ran and "read back from the loaded model" in ran
    # llama-cpp-python on its own, as its users' scripts import it: oallama's .pth points it at our libraries
    first = _run([str(py), "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"], out, env, 120)
    assert "CPU" in first
