"""Plans (CPU + loopback rpc-server, each its own server) loaded side by side in one process, one
generation of each in turn per round (order reversed every other round), as bench/scripts/bench_ab.py
does for a bench cell: medians, and each plan's e2e over the first plan's in the same round.

    python ab_plans.py ROUNDS PROMPT GEN MODEL PLAN LABEL [MODEL PLAN LABEL ...]
"""
import json, os, statistics, sys
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate

R, NP, NG = map(int, sys.argv[1:4]); args = sys.argv[4:]
loads = []
for k in range(0, len(args), 3):
    m, plan, label = args[k:k + 3]
    doc = json.loads(open(plan).read()); text = open(plan).read()
    srv = start_server(threads=1)
    p = f"/tmp/ab-plans-{k}.plan.json"; open(p, "w").write(text.replace(doc["accelerator"], srv.device_name))
    llm = Llama(m, placement=p, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
    loads.append(dict(label=label, llm=llm, srv=srv, pred=doc["predicted"], s=[]))
prompt = prompt_tokens(loads[0]["llm"], NP)
for L in loads:
    timed_generate(L["llm"], prompt, NG, temperature=0.0)
print(f"load at start {os.getloadavg()}")
for r in range(R):
    for L in (loads if r % 2 == 0 else loads[::-1]):
        g = timed_generate(L["llm"], prompt, NG, temperature=0.0)
        L["s"].append((g.ttft_s * 1e3, g.tpot_s * 1e3, g.e2e_s * 1e3))
print(f"load at end {os.getloadavg()}; {R} rounds, prompt {NP}, gen {NG}")
print("| plan | TTFT ms | TPOT ms | e2e ms | pred TTFT / TPOT / e2e | e2e / first's [p25..p75] | pred |")
print("|---|---|---|---|---|---|---|")
base = loads[0]
for L in loads:
    med = [statistics.median(x[i] for x in L["s"]) for i in range(3)]
    rat = sorted(a[2] / b[2] for a, b in zip(L["s"], base["s"]))
    pr = L["pred"]
    print(f"| {L['label']} | {med[0]:.1f} | {med[1]:.2f} | {med[2]:.1f} | {pr['ttft_ms']:.1f} / {pr['tpot_ms']:.2f} / {pr['e2e_ms']:.1f} | "
          f"{statistics.median(rat):.3f} [{rat[len(rat) // 4]:.3f}..{rat[(3 * len(rat)) // 4]:.3f}] | {pr['e2e_ms'] / base['pred']['e2e_ms']:.3f} |")
for L in loads:
    L["llm"].close(); L["srv"].stop()
