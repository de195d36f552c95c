"""QwQ-32B cut to 2 layers, budget 25%: plans made again with a fresh calibration (a draft of method 15, below) against
method 14's optimal, three loads alternated in one process (prompt 32, generate 8); each plan its own rpc-server."""
import sys, statistics, json, os
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate
M, R, plans = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
names = ["layers (re-planned)", "optimal (re-planned)", "optimal (the bench's plan)"]
kw = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
llms, srvs = {}, []
for name, p in zip(names, plans):
    text = open(p).read(); old = json.loads(text)["accelerator"]
    srv = start_server(threads=1); srvs.append(srv)
    f = f"/tmp/exp/ab_{len(srvs)}.plan.json"; open(f, "w").write(text.replace(old, srv.device_name))
    llms[name] = Llama(M, placement=f, **kw)
prompt = prompt_tokens(next(iter(llms.values())), 32)
for llm in llms.values(): timed_generate(llm, prompt, 8, temperature=0.0)
res = {k: [] for k in llms}
for r in range(R):
    for k in (names if r % 2 == 0 else names[::-1]):
        g = timed_generate(llms[k], prompt, 8, temperature=0.0); res[k].append((g.ttft_s * 1e3, g.tpot_s * 1e3))
for k, v in res.items():
    a = res[names[0]]
    print(f"{k:28s} TTFT median {statistics.median(x[0] for x in v):.1f} ms  TPOT median {statistics.median(x[1] for x in v):.2f} ms"
          f"  | / layers per round: TTFT {statistics.median(b[0] / c[0] for b, c in zip(v, a)):.3f} TPOT {statistics.median(b[1] / c[1] for b, c in zip(v, a)):.3f}")
print("load", os.getloadavg())
for l in llms.values(): l.close()
for s in srvs: s.stop()
