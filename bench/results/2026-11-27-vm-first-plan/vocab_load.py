"""A model's metadata-only load (vocab_only) and its free, timed twice, then one whole load of the file:
`python vocab_load.py MODEL.gguf` (output at 122c440, the 8B shape: vocab_load.txt)."""

from __future__ import annotations

import sys
import time

import oallama  # noqa: F401  (points llama-cpp-python at oallama's llama.cpp)

t = time.perf_counter()
import llama_cpp  # noqa: E402

print("import", round(time.perf_counter() - t, 3))
llama_cpp.llama_backend_init()
path = sys.argv[1].encode()
for vocab_only in (True, True, False):
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = vocab_only
    t = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(path, params)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    llama_cpp.llama_model_free(model)
    print("vocab_only", vocab_only, "load", round(t_load, 3), "free", round(time.perf_counter() - t, 3))
