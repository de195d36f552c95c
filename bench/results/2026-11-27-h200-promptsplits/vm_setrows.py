#!/usr/bin/env python3
"""A prompt's KV writes on the host, node by node: the V cache's element-wise write (flash attention off:
the cache is transposed, a SET_ROWS into rows of one element) beside the K cache's row write, per
context size, prompt length and thread count (median of 3 passes after a warm-up).

    python vm_setrows.py MODEL.gguf > vm_setrows.txt     # the reference model (llama3-8b q4_k_m, 2 layers)
"""
import os
import platform
import statistics
import sys

from oallama import Llama, _core
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens


def main() -> int:
    path = sys.argv[1]
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {os.path.basename(path)}")
    for th in (1, 2):
        for n_ctx in (512, 1024, 2048, 4096, 8192, 16384):
            llm = Llama(path, n_ctx=n_ctx, n_batch=256, n_ubatch=256, n_threads=th, n_threads_batch=th,
                        verbose=False, flash_attn=False, n_gpu_layers=0)
            toks = prompt_tokens(llm, 256)
            for n in (32, 128, 256):
                timed_eval(llm, None, [], toks[:n], [])
                v, k = [], []
                with _core.NodeTimer(llm.native_context) as t:
                    for _ in range(3):
                        for r in timed_eval(llm, t, [], toks[:n], []).nodes:
                            if r.op == "SET_ROWS":
                                (v if r.ne[0] == 1 else k).append(r.range_us)
                elems = n * llm._model.n_embd() // 4  # the reference's K/V width: 8 heads of 128 = n_embd / 4
                print(f"threads {th} n_ctx {n_ctx:5d} tokens {n:3d}: V {statistics.median(v):7.0f} us  "
                      f"K {statistics.median(k):5.0f} us  V per element {statistics.median(v) / elems * 1e3:.2f} ns",
                      flush=True)
            llm.close()
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
