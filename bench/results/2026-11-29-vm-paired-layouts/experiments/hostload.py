"""The calibration's host load (n_batch = n_ubatch = NB), each pass timed alternately without the eval callback and
in split mode: hostload.py MODEL NB. Output: hostload.txt."""

import os
import sys

from oallama import _core
from oallama.planner.cost import attnspan
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

path, nb = sys.argv[1], int(sys.argv[2])
print("load", os.getloadavg())
llm = Llama(path, devices=["CPU"], n_ctx=512, n_batch=nb, n_ubatch=nb, n_threads=2, n_threads_batch=2,
            verbose=False, n_gpu_layers=0, op_offload=False)
toks = prompt_tokens(llm, 512)
for n, past in ((1, 32), (32, 0)):
    prefix, batch = toks[:past], toks[past:past + n]
    timed_eval(llm, None, prefix, batch, [])
    with _core.NodeTimer(llm.native_context) as timer:
        stops = attnspan.split_ends(timed_eval(llm, timer, prefix, batch, []).nodes)
        a, b = [], []
        for _ in range(4):
            a.append(timed_eval(llm, None, prefix, batch, []).wall_us / 1e3)
            r = timed_eval(llm, timer, prefix, batch, stops)
            b.append((r.wall_us / 1e3, r.nodes[stops[-1]].range_us / 1e3))
    print(n, past, "no timer", [round(x, 1) for x in a], "split mode (wall, split)",
          [(round(x, 1), round(y, 1)) for x, y in b], flush=True)
llm.close()
print("load", os.getloadavg())
