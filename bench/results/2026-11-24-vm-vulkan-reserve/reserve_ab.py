"""A/B: one more scheduler reserve after llama.cpp creates a context, on CPU + Vulkan0 (lavapipe).

Stock llama-cpp-python loads (no oallama runtime, which now always reserves): each process loads
the model, optionally calls _core.reserve once before the first pass, then times prompt passes
(one ubatch, a fresh KV cache each) and decode passes. Processes alternate A, B, A, B, ...

usage: GGML_VK_VISIBLE_DEVICES=0 python reserve_ab.py MODEL N_GPU_LAYERS N_TOKENS ROUNDS
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def one(path: str, ngl: int, n: int, reserve: bool) -> dict:
    import llama_cpp

    from oallama import _core  # first: it points llama_cpp at oallama's patched libllama

    llm = llama_cpp.Llama(
        path,
        n_gpu_layers=ngl,
        n_ctx=256,
        n_batch=n,
        n_ubatch=n,
        n_threads=1,
        n_threads_batch=1,
        flash_attn=False,
        verbose=False,
    )
    if reserve:
        _core.reserve(_core.Context(llm._ctx))
    toks = [1 + (7 * k) % 200 for k in range(n + 40)]
    ctx = llm._ctx.ctx
    prompt, decode = [], []
    for _ in range(4):
        llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        llm.eval(toks[:n])
        llama_cpp.llama_synchronize(ctx)
        prompt.append((time.perf_counter() - t0) * 1e3)
    for k in range(9):
        t0 = time.perf_counter()
        llm.eval(toks[n + k : n + k + 1])
        llama_cpp.llama_synchronize(ctx)
        decode.append((time.perf_counter() - t0) * 1e3)
    llm.close()
    return {
        "reserve": reserve,
        "prompt_ms": statistics.median(prompt[1:]),
        "decode_ms": statistics.median(decode[1:]),
    }


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")))
        sys.exit(0)
    path, ngl, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    out = []
    for r in range(rounds):
        for reserve in (False, True):
            p = subprocess.run(
                [sys.executable, __file__, "--one", path, str(ngl), str(n), "1" if reserve else "0"],
                capture_output=True,
                text=True,
                check=True,
                env=os.environ,
            )
            rec = json.loads(p.stdout.strip().splitlines()[-1])
            rec.update(round=r, load_avg=os.getloadavg()[0])
            out.append(rec)
            print(json.dumps(rec), flush=True)
    for key in ("prompt_ms", "decode_ms"):
        a = statistics.median(x[key] for x in out if not x["reserve"])
        b = statistics.median(x[key] for x in out if x["reserve"])
        print(
            f"# {os.path.basename(path)} ngl={ngl} n={n} {key}: stock {a:.2f}, reserved {b:.2f}, "
            f"stock/reserved {a / b:.3f}"
        )
