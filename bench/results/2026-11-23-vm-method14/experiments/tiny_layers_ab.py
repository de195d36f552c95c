# tiny-q8_0, loads with 0/1/2/4 layers (+ output) on the rpc-server, one server each; usage: python tiny_layers_ab.py tiny-q8_0.gguf tiny_fit75.plan.json 12
"""tiny decode, placements with 0/1/2/4 layers (+ output) on a loopback rpc-server, all loaded at once,
generations alternated round-robin: TPOT per placement (ms)."""

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "/tmp/exp")
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

M, PLAN = sys.argv[1], sys.argv[2]
base = json.loads(Path(PLAN).read_text())
RPC = base["accelerator"]


def plan(n_rpc_layers, output_rpc=True, port=46987):
    rpc = f"RPC[127.0.0.1:{port}]"
    p = json.loads(json.dumps(base).replace(RPC, rpc))
    for k in p["placement"]:
        if k.startswith("blk."):
            p["placement"][k] = rpc if int(k.split(".")[1]) >= 4 - n_rpc_layers else "CPU"
        elif k.startswith("output"):
            p["placement"][k] = rpc if output_rpc else "CPU"
    p["n_gpu_layers"] = n_rpc_layers + (1 if output_rpc else 0)
    p["kv_layers"] = n_rpc_layers
    f = f"/tmp/exp/p{n_rpc_layers}{'o' if output_rpc else ''}.json"
    Path(f).write_text(json.dumps(p))
    return f


cases = [(0, False), (0, True), (1, True), (2, True), (4, True), (1, False)]
llms = {}
srvs = []
for i, (nl, o) in enumerate(cases):
    srvs.append(start_server(port=46990 + i, threads=1))
    name = f"{nl}L{'+out' if o else ''}"
    llms[name] = Llama(
        M,
        placement=plan(nl, o, 46990 + i),
        n_ctx=256,
        n_batch=64,
        n_ubatch=64,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
        seed=1234,
    )
prompt = prompt_tokens(next(iter(llms.values())), 32)
tp = {k: [] for k in llms}
R = int(sys.argv[3]) if len(sys.argv) > 3 else 10
for r in range(R):
    for k, llm in llms.items() if r % 2 == 0 else reversed(llms.items()):
        tp[k].append(timed_generate(llm, prompt, 32, temperature=0.0).tpot_s * 1e3)
for k, v in tp.items():
    s = sorted(v)
    print(
        f"{k:8s} TPOT ms median {statistics.median(v):.3f}  min {s[0]:.3f}  p25 {s[len(s) // 4]:.3f}  p75 {s[3 * len(s) // 4]:.3f}  max {s[-1]:.3f}"
    )
print("load", os.getloadavg())
for one in llms.values():
    one.close()
[s.stop() for s in srvs]
