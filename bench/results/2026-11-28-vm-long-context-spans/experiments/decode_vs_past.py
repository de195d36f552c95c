"""A decode step's wall time (ms) against the KV cells before it, flash attention off / on (f16) / on
(q8_0), 1 thread: whole passes timed as bench_attention.py times them (median of 16 steps).

    python decode_vs_past.py MODEL 32,256,1024,2048   (T=threads, default 1)
"""

import os
import statistics
import sys
import time

from oallama import Llama
from oallama.runtime import kvcache
from oallama.runtime.generate import prompt_tokens

model, pasts = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
threads = int(os.environ.get("T", "1"))
for fa, ct in (("off", "f16"), ("on", "f16"), ("on", "q8_0")):
    kw = kvcache.llama_kwargs(flash_attn=(fa == "on"), type_k=ct, type_v=ct)
    llm = Llama(model, n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False, **kw)
    toks = prompt_tokens(llm, 4096)
    llm.eval(toks[:64])  # warm-up
    row = []
    for past in pasts:
        llm.reset()
        llm.eval(toks[:past])
        ts = []
        for k in range(16):
            t0 = time.perf_counter()
            llm.eval(toks[past + k:past + k + 1])
            ts.append((time.perf_counter() - t0) * 1e3)
        row.append(f"{past}:{statistics.median(ts):.2f}({min(ts):.2f}-{max(ts):.2f})")
    llm.close()
    print(fa, ct, " ".join(row), flush=True)
