"""Plain / repacked ratio of a model's passes in one load that holds both layouts (patch 0006's dual layout),
the layouts alternating pass by pass: dualpair.py MODEL SIZES PAIRS (sizes comma-separated; 1: a decode after
32 cells). Output: dualpair.txt."""

import os
import statistics
import sys

from oallama import _core
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

path, sizes, pairs = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
kw = dict(n_ctx=1024, n_batch=max(sizes), n_ubatch=max(sizes), n_threads=2, n_threads_batch=2, verbose=False,
          n_gpu_layers=0, op_offload=False)
llm = Llama(path, devices=["CPU"], **kw)
names = [t.name for t in llm.tensor_placements() if t.buffer_type == "CPU_REPACK"]
llm.close()
print("load", os.getloadavg(), len(names), "repacked")
llm = Llama(path, devices=["CPU"], layouts=dict.fromkeys(names, "CPU_REPACK_DUAL"), dual_max_batch=1, **kw)
print(sorted({t.buffer_type for t in llm.tensor_placements()}))
toks = prompt_tokens(llm, 1024)
for n in sizes:
    past = 32 if n == 1 else 0
    prefix, batch = toks[:past], toks[past:past + n]
    res: dict[str, list[float]] = {"rep": [], "plain": []}
    for k in range(pairs):
        for what in ("rep", "plain") if k % 2 == 0 else ("plain", "rep"):
            _core.cpu_set_dual_max_batch(n + 1 if what == "rep" else 1)  # the repacked copy below the threshold
            if k == 0:
                timed_eval(llm, None, prefix, batch, [])  # warm-up
            res[what].append(timed_eval(llm, None, prefix, batch, []).wall_us / 1e3)
    r = [p / q for p, q in zip(res["plain"], res["rep"], strict=True)]
    print(n, "rep", [round(x, 1) for x in res["rep"]], "plain", [round(x, 1) for x in res["plain"]],
          "plain/rep", [round(x, 3) for x in r], "median", round(statistics.median(r), 3), flush=True)
llm.close()
print("load", os.getloadavg())
