"""Is the walls' correction (`context._beyond`'s g) noise or a property of node-by-node timing? One dual load, the
layouts alternating; each pair times the n-token pass whole and node by node in both layouts: per pair, the walls'
plain / repacked ratio, the one the repacked shapes' node times give (1 + their plain - repacked time over the
default wall), and each shape's ratio of node times. nodepairs.py MODEL N PAIRS. Output: nodepairs.txt."""

import os
import statistics
import sys

from oallama import _core
from oallama.planner.cost.realpass import _matmul_shapes, timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

path, n, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = dict(n_ctx=512, n_batch=max(n, 32), n_ubatch=max(n, 32), n_threads=2, n_threads_batch=2, verbose=False,
          n_gpu_layers=0, op_offload=False)
llm = Llama(path, devices=["CPU"], **kw)
names = [t.name for t in llm.tensor_placements() if t.buffer_type == "CPU_REPACK"]
llm.close()
print("load", os.getloadavg(), len(names), "repacked", flush=True)
llm = Llama(path, devices=["CPU"], layouts=dict.fromkeys(names, "CPU_REPACK_DUAL"), dual_max_batch=1, **kw)
toks = prompt_tokens(llm, 512)
prefix, batch = (toks[:32], toks[32:33]) if n == 1 else ([], toks[:n])
timed_eval(llm, None, prefix, batch, [])  # warm-up
walls, implied = [], []
for k in range(pairs):
    got = {}
    for what in ("rep", "plain") if k % 2 == 0 else ("plain", "rep"):
        _core.cpu_set_dual_max_batch(n + 1 if what == "rep" else 1)
        wall = timed_eval(llm, None, prefix, batch, []).wall_us
        with _core.NodeTimer(llm.native_context) as timer:
            shapes = _matmul_shapes(timed_eval(llm, timer, prefix, batch, []).nodes)
        got[what] = (wall, shapes)
    (wr, sr), (wp, sp) = got["rep"], got["plain"]
    keys = [k2 for k2 in sr if k2.startswith("MUL_MAT:q4_K")]
    diff = sum(sp[k2][0] - sr[k2][0] for k2 in keys)
    walls.append(wp / wr)
    implied.append(1 + diff / wr)
    print(k, f"walls {wp / wr:.3f} nodes-implied {1 + diff / wr:.3f}",
          {k2.split(":", 2)[2]: round(sp[k2][0] / sr[k2][0], 3) for k2 in keys}, flush=True)
print("median walls", round(statistics.median(walls), 3), "implied", round(statistics.median(implied), 3),
      "g", round(statistics.median(w / i for w, i in zip(walls, implied, strict=True)), 3))
llm.close()
print("load", os.getloadavg())
