#!/usr/bin/env bash
# Idempotent setup: .venv, dependencies, pinned llama.cpp (fetch + patch), build, editable install.
# Re-running reuses the venv, the fetched tree and the build directory (and ccache when present);
# when nothing that feeds the build changed, it skips the build altogether.
#   OALLAMA_CUDA=ON scripts/setup.sh     also build ggml-cuda (needs nvcc)
#   OALLAMA_VULKAN=ON scripts/setup.sh   also build ggml-vulkan (installs Debian's Vulkan packages as root);
#                                        on Mesa's software GPU set GGML_VK_VISIBLE_DEVICES=0 to see it
#   PYTHON=python3.12 scripts/setup.sh   choose the interpreter for .venv
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PY=${PYTHON:-python3}
step() { printf '\n==> %s\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

want_deps="scikit-build-core>=0.10 pybind11>=2.12 cmake>=3.21 ninja numpy>=1.26 gguf==0.19.0 highspy>=1.7 matplotlib>=3.7 psutil>=5.9 pytest>=8 ruff>=0.6 import-linter>=2.1 torch==2.13.0 uvicorn>=0.30 fastapi>=0.100.0 pydantic-settings>=2.0.1 sse-starlette>=3.7 starlette-context>=0.3.6,<0.4 PyYAML>=5.1 openai>=1.0 hypothesis>=6"
deps_stamp=.venv/.oallama-deps
if [ ! -f "$deps_stamp" ] || [ "$(cat "$deps_stamp")" != "$want_deps" ]; then
    step "installing Python dependencies"
    # shellcheck disable=SC2086
    python -m pip install -q --disable-pip-version-check $want_deps
    echo "$want_deps" > "$deps_stamp"
fi

if [ "${OALLAMA_VULKAN:-OFF}" = ON ]; then
    vk_pkgs="libvulkan-dev glslc spirv-headers mesa-vulkan-drivers"
    # shellcheck disable=SC2086
    if ! dpkg -s $vk_pkgs >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            step "installing Vulkan build packages: $vk_pkgs"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $vk_pkgs >/dev/null
        elif ! command -v glslc >/dev/null; then
            echo "setup: OALLAMA_VULKAN=ON needs: apt-get install $vk_pkgs (or your system's Vulkan SDK)" >&2
            exit 1
        fi
    fi
fi

# (the build's configure step does this too; here it feeds the up-to-date check below)
step "fetching the pinned llama.cpp"
python scripts/fetch_llama.py

# Everything that feeds the native build; unchanged inputs and an importable _core skip it.
build_inputs() {
    cat CMakeLists.txt pyproject.toml third_party/llama.cpp/src/.oallama-stamp
    find csrc -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name CMakeLists.txt \) \
        | sort | xargs cat
    echo "cuda=${OALLAMA_CUDA:-OFF} vulkan=${OALLAMA_VULKAN:-OFF} kernels=${OALLAMA_KERNELS:-OFF} tools=${OALLAMA_TOOLS:-ON}"
}
build_stamp=.venv/.oallama-build
want_build=$(build_inputs | sha256sum | cut -d' ' -f1)
if [ -f "$build_stamp" ] && [ "$(cat "$build_stamp")" = "$want_build" ] \
   && python -c "import oallama._core" 2>/dev/null; then
    step "native build is up to date"
else
    step "building oallama (llama.cpp + _core); a clean build takes ~10 min on 2 cores"
    start=$(date +%s)
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
    # the README's install command (CMAKE_ARGS: llama-cpp-python's bindings without its own
    # llama.cpp), editable and without build isolation so that the build directory is reused
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" \
        python -m pip install --disable-pip-version-check --no-build-isolation -v -e . \
        2>&1 | grep -E --line-buffered '^\s*\[[0-9]+/[0-9]+\]|error|Error|warning: unused|Successfully' || true
    python -c "import oallama._core" || { echo "setup: the build failed (see above)"; exit 1; }
    echo "$want_build" > "$build_stamp"
    echo "setup: native build took $(( $(date +%s) - start )) s"
fi
step "ready: source .venv/bin/activate  (python -m oallama --help)"
