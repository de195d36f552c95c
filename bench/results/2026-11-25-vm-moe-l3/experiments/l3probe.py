"""Is a small MoE's host decode spread the machine's last-level cache? One process, for DURATION
seconds, alternates: a host-only decode of MODEL (mean of GEN 1-token passes after a 64-token
prompt, other tokens each time), a read of an L3-sized buffer (SMALL MiB, summed with numpy: GB/s)
and a read of a DRAM-sized one (1 GiB), a [256, 256] f32 matmul (compute speed), plus this VM's steal time between samples. One JSON line
per sample.

usage: python l3probe.py MODEL GEN DURATION_S SMALL_MIB   -> JSON lines on stdout
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from oallama.planner.realpass import decode_walls
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama


def read_gbs(buf: np.ndarray, reps: int) -> float:
    """Median GB/s of reading `buf`: one int64 summed per 64-byte line (the sum itself is no limit:
    a contiguous int64 sum ran at the same ~18.5 GB/s from L3 and from DRAM), so each pass brings
    in every line once."""
    rates = []
    lines = buf[::8]
    for _ in range(reps):
        t0 = time.perf_counter()
        lines.sum()
        rates.append(buf.nbytes / (time.perf_counter() - t0) / 1e9)
    return float(np.median(rates))


def matmul_gflops(a: np.ndarray, reps: int) -> float:
    """Median GFLOP/s of a [256, 256] f32 matmul (in L2: the core's compute speed, not memory's)."""
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ a
        rates.append(2 * a.shape[0] ** 3 / (time.perf_counter() - t0) / 1e9)
    return float(np.median(rates))


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])  # cpu  user nice system idle iowait irq softirq steal


if __name__ == "__main__":
    model, gen, duration, small_mib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    small = np.ones(small_mib << 17, dtype=np.int64)  # SMALL MiB
    big = np.ones(1 << 27, dtype=np.int64)  # 1 GiB
    sq = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    llm = Llama(model, devices=["CPU"], n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1,
                verbose=False)
    tokens = prompt_tokens(llm, 512)
    decode_walls(llm, tokens, 64, gen)  # warm-up
    t_start, k = time.monotonic(), 0
    while time.monotonic() - t_start < duration:
        s0 = steal_ticks()
        rot = tokens[(k * 37) % 400:] + tokens[:(k * 37) % 400]  # other tokens each sample: other experts
        walls = decode_walls(llm, rot, 64, gen)
        rec = {"t_s": round(time.monotonic() - t_start, 2), "tpot_ms": sum(walls) / len(walls) / 1e3,
               "l3_gbs": read_gbs(small, 5), "dram_gbs": read_gbs(big, 2),
               "matmul_gflops": matmul_gflops(sq, 20),
               "steal_ticks": steal_ticks() - s0, "load_avg": os.getloadavg()[0]}
        print(json.dumps(rec), flush=True)
        k += 1
    llm.close()
