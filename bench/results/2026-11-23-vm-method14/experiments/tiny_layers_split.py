# usage: python tiny_layers_split.py tiny-q8_0.gguf tiny_fit75.plan.json 10
"""tiny decode, placements with 0/1/2/4 layers (+ output) on loopback rpc-servers (one each), all loaded
at once and alternated round-robin: TPOT of a generation, and the split-mode timed decode pass broken into
outside the graph / per split: gap before its first node, its own range (us)."""

import json
import os
import statistics
import sys
from pathlib import Path

from oallama import _core
from oallama.planner.cost.calibrate import _span_us, _split_stops
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

M, PLAN = sys.argv[1], sys.argv[2]
R = int(sys.argv[3]) if len(sys.argv) > 3 else 8
base = json.loads(Path(PLAN).read_text())
RPC = base["accelerator"]


def plan(n_rpc_layers, output_rpc, port):
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


cases = [(0, True), (1, True), (2, True), (4, True)]
llms, srvs = {}, []
for i, (nl, o) in enumerate(cases):
    srvs.append(start_server(port=46990 + i, threads=1))
    llms[f"{nl}L{'+out' if o else ''}"] = Llama(
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
toks = prompt_tokens(next(iter(llms.values())), 256)
tp = {k: [] for k in llms}
rows = {k: [] for k in llms}
stops = {}
for r in range(R):
    for k, llm in llms.items() if r % 2 == 0 else reversed(llms.items()):
        tp[k].append(timed_generate(llm, prompt, 32, temperature=0.0).tpot_s * 1e3)
        with _core.NodeTimer(llm.native_context) as timer:
            if k not in stops:
                stops[k] = _split_stops(timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes)
            for _ in range(10):
                run = timed_eval(llm, timer, toks[:32], toks[32:33], stops[k])
                first, prev, segs = 0, run.nodes[0].start_us, []
                for s in stops[k]:
                    st, dn = run.nodes[first].start_us, run.nodes[s].done_us
                    segs.append((st - prev, dn - st))
                    prev, first = dn, s + 1
                rows[k].append(
                    (
                        run.wall_us,
                        run.wall_us - _span_us(run.nodes),
                        run.wall_us - (prev - run.nodes[0].start_us),
                        segs,
                    )
                )
med = statistics.median
for k in llms:
    rs = rows[k]
    n = len(stops[k])
    devs = None
    print(
        f"{k:7s} TPOT {med(tp[k]):.3f} ms (p25 {sorted(tp[k])[len(tp[k]) // 4]:.3f} p75 {sorted(tp[k])[3 * len(tp[k]) // 4]:.3f}) | "
        f"timed pass wall {med(r[0] for r in rs):.0f} us, outside {med(r[1] for r in rs):.0f}, | "
        + " | ".join(
            f"split {j}: gap {med(r[3][j][0] for r in rs):.0f} [{sorted(r[3][j][0] for r in rs)[len(rs) // 10]:.0f}..{sorted(r[3][j][0] for r in rs)[9 * len(rs) // 10]:.0f}] run {med(r[3][j][1] for r in rs):.0f}"
            for j in range(n)
        )
    )
print("load", os.getloadavg())
for one in llms.values():
    one.close()
for s in srvs:
    s.stop()
