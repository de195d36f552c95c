import json
import os
from pathlib import Path

os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
import sys
import time

import numpy as np

from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.llama import Llama

M = sys.argv[1]
n = 32
dur = float(sys.argv[2])
llm = Llama(
    M,
    n_ctx=512,
    n_batch=n,
    n_ubatch=n,
    n_threads=1,
    n_threads_batch=1,
    n_gpu_layers=0,
    verbose=False,
    op_offload=False,
    flash_attn=False,
)
toks = llm.tokenize(b"The quick brown fox " * 80)[:400]
a = np.random.rand(256, 256).astype(np.float32)
big = np.random.rand(8 * 2**20).astype(np.float32)
dst = np.empty_like(big)


def comp():
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    return (time.perf_counter() - t0) * 1e3


def mem():
    t0 = time.perf_counter()
    for _ in range(3):
        np.copyto(dst, big)
    return (time.perf_counter() - t0) * 1e3


t_end = time.time() + dur
rows = []
while time.time() < t_end:
    c = comp()
    m = mem()
    p = timed_eval(llm, None, [], toks[:n], []).wall_us / 1e3
    d = timed_eval(llm, None, toks[:n], toks[n : n + 1], []).wall_us / 1e3
    rows.append((c, m, p, d))
    time.sleep(0.5)
Path("corr.json").write_text(
    json.dumps(rows)
)  # per sample: [compute ms, memory-copy ms, 32-token prompt ms, decode ms]
r = np.array(rows)
print(len(rows), "medians", np.median(r, 0).round(2), "min", r.min(0).round(2), "max", r.max(0).round(2))
print("corr\n", np.corrcoef(r.T).round(2))
