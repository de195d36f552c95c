set -e
cd /tmp/srvtime
export CCACHE_DISABLE=1
PY=/work/main/.venv/bin/python
PB=$($PY -c "import pybind11; print(pybind11.get_cmake_dir())")
cmake -S /work/main -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DOALLAMA_SERVER=OFF -DOALLAMA_FETCH=OFF -Dpybind11_DIR=$PB -DPython_EXECUTABLE=$PY -DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER= > cfg1.log 2>&1
s=$(date +%s); cmake --build b -j2 > b1.log 2>&1; e=$(date +%s); echo "without server: $((e-s)) s" > times.txt
cmake -S /work/main -B b -DOALLAMA_SERVER=ON > cfg2.log 2>&1
s=$(date +%s); cmake --build b -j2 > b2.log 2>&1; e=$(date +%s); echo "server tools added: $((e-s)) s" >> times.txt
uptime >> times.txt
