"""A host-only decode in a fresh process, with the page faults it took: TPOT (the mean of GEN-1 decode
passes after a PROMPT-token prompt, after one discarded warm-up generation) and this process's minor /
major page faults (getrusage) during the warm-up and during the timed generation.

usage: python faults.py MODEL PROMPT GEN MMAP(0|1)   -> one JSON line
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from oallama.planner.realpass import decode_walls
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama


def faults() -> tuple[int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_majflt


if __name__ == "__main__":
    model, prompt, gen, mmap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    load_avg = os.getloadavg()[0]
    t0 = time.perf_counter()
    llm = Llama(model, devices=["CPU"], n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1,
                use_mmap=mmap, verbose=False)
    load_s = time.perf_counter() - t0
    tokens = prompt_tokens(llm, 256)
    f0 = faults()
    decode_walls(llm, tokens, prompt, gen // 2)  # warm-up generation
    f1 = faults()
    walls = decode_walls(llm, tokens[prompt:] + tokens[:prompt], prompt, gen // 2)  # other tokens: other experts
    f2 = faults()
    llm.close()
    print(json.dumps({"mmap": mmap, "load_avg": load_avg, "load_s": load_s, "tpot_ms": sum(walls) / len(walls) / 1e3,
                      "warmup_faults": [f1[0] - f0[0], f1[1] - f0[1]], "timed_faults": [f2[0] - f1[0], f2[1] - f1[1]]}))
