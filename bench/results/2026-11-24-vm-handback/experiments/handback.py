"""Bench plans (CPU + loopback rpc-server) loaded side by side in one process; per round, each in turn:
its decode pass (1 token after 32) timed four ways, and its generation loop taken apart (ms).

  T  one pass, the scheduler's eval callback stopping at each split's end (as the calibration times);
     also each device's splits summed (first node's start to last node's end)
  U  the same pass without a timer (realpass.timed_eval, no timer)
  C  consecutive 1-token passes after the prompt, each eval + llama_synchronize (realpass.decode_walls)
  L  the generation loop's TPOT (runtime.generate.timed_generate, 8 tokens), and within it the time in
     Llama.eval (+ a synchronize, so the pass is finished) and in Llama.sample per generated token

    python handback.py ROUNDS MODEL PLAN LABEL [MODEL PLAN LABEL ...]
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

from oallama import _core
from oallama.planner.cost.calibrate import _split_stops
from oallama.planner.cost.realpass import decode_walls, sync, timed_eval
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

R = int(sys.argv[1])
args = sys.argv[2:]
loads = []
for k in range(0, len(args), 3):
    m, plan, label = args[k : k + 3]
    text = Path(plan).read_text()
    old = json.loads(text)["accelerator"]
    srv = start_server(threads=1)
    p = f"/tmp/handback-{k}.plan.json"
    Path(p).write_text(text.replace(old, srv.device_name))
    llm = Llama(
        m,
        placement=p,
        n_ctx=256,
        n_batch=64,
        n_ubatch=64,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
        seed=1234,
    )
    toks = prompt_tokens(llm, 64)
    with _core.NodeTimer(
        llm.native_context
    ) as timer:  # attached only while it times: it is the eval callback
        nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    devs = [nodes[s].device[:3] for s in stops]
    loads.append(
        dict(label=label, llm=llm, srv=srv, toks=toks, stops=stops, devs=devs, s={k: [] for k in "TUCLES"})
    )
    print(f"loaded {label}: decode splits {'>'.join(devs)}", flush=True)


def instrumented_loop(L):
    llm = L["llm"]
    ev, sa = [], []
    e0, s0 = llm.eval, llm.sample

    def e(tokens):
        t = time.perf_counter()
        e0(tokens)
        sync(llm)
        ev.append((len(tokens), time.perf_counter() - t))

    def s(*a, **kw):
        t = time.perf_counter()
        r = s0(*a, **kw)
        sa.append(time.perf_counter() - t)
        return r

    llm.eval, llm.sample = e, s
    try:
        g = timed_generate(llm, L["toks"][:32], 8, temperature=0.0)
    finally:
        del llm.eval, llm.sample
    dec = [t for n, t in ev if n == 1]
    return g.tpot_s * 1e3, statistics.fmean(dec) * 1e3, statistics.fmean(sa[1:]) * 1e3


for L in loads:  # warm-up
    timed_generate(L["llm"], L["toks"][:32], 8, temperature=0.0)
for r in range(R):
    order = loads if r % 2 == 0 else loads[::-1]
    for L in order:
        llm, toks = L["llm"], L["toks"]
        with _core.NodeTimer(llm.native_context) as timer:
            run = timed_eval(llm, timer, toks[:32], toks[32:33], L["stops"])
        L["s"]["T"].append(run.wall_us / 1e3)
        first, per = 0, {}
        for st in L["stops"]:  # each split's time, its first node's start to its last node's end (ms)
            d = run.nodes[st].device[:3]
            per[d] = per.get(d, 0.0) + (run.nodes[st].done_us - run.nodes[first].start_us) / 1e3
            first = st + 1
        for d, v in per.items():
            L.setdefault("dev", {}).setdefault(d, []).append(v)
        L["s"]["U"].append(timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us / 1e3)
        L["s"]["C"].append(statistics.fmean(decode_walls(llm, toks, 32, 3)) / 1e3)
        tpot, e, s = instrumented_loop(L)
        L["s"]["L"].append(tpot)
        L["s"]["E"].append(e)
        L["s"]["S"].append(s)
    print(f"round {r + 1}/{R} load {os.getloadavg()[0]:.2f}", flush=True)
print(f"\n{R} rounds; medians (ms) [p25..p75]; load {os.getloadavg()}")
print(
    "| placement | decode splits | T timed at splits | U untimed | C consecutive | L loop TPOT | E loop eval+sync | S loop sample |"
)
print("|---|---|---|---|---|---|---|---|")


def q(v):
    v = sorted(v)
    return f"{statistics.median(v):.2f} [{v[len(v) // 4]:.1f}..{v[(3 * len(v)) // 4]:.1f}]"


for L in loads:
    print(f"| {L['label']} | {'>'.join(L['devs'])} | " + " | ".join(q(L["s"][k]) for k in "TUCLES") + " |")
print("\nT's splits per device, summed (ms, median):")
for L in loads:
    print(f"  {L['label']}: " + ", ".join(f"{d} {statistics.median(v):.2f}" for d, v in L["dev"].items()))
for L in loads:
    L["llm"].close()
    L["srv"].stop()
