"""A bench plan (here QwQ-32B cut to 2 layers, `optimal` @25%; written for the full-size llama3-8b) (CPU + loopback rpc-server): TPOT of generations and the
split-mode timed decode pass (per split: device, gap before it, its time), against the calibration's
decode splits of the same profile (us)."""
import sys, statistics, json, os, time
from oallama import _core
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.planner.realpass import timed_eval
from oallama.planner.calibrate import _split_stops, _span_us
M, PLAN = sys.argv[1], sys.argv[2]
doc = json.load(open(PLAN)); acc = doc["accelerator"]; port = int(acc.rsplit(":", 1)[1].rstrip("]"))
srv = start_server(port=port, threads=1)
t0 = time.time()
llm = Llama(M, placement=PLAN, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
print(f"loaded in {time.time() - t0:.1f} s", flush=True)
prompt = prompt_tokens(llm, 32)
for r in range(2):
    g = timed_generate(llm, prompt, 8, temperature=0.0)
    print(f"generate: TTFT {g.ttft_s * 1e3:.0f} ms TPOT {g.tpot_s * 1e3:.1f} ms", flush=True)
toks = prompt_tokens(llm, 64)
with _core.NodeTimer(llm.native_context) as timer:
    nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    for k in range(4):
        run = timed_eval(llm, timer, toks[:32], toks[32:33], stops)
        first, prev, segs = 0, run.nodes[0].start_us, []
        for s in stops:
            st, dn = run.nodes[first].start_us, run.nodes[s].done_us
            segs.append((nodes[s].device[:3], round((st - prev) / 1e3, 2), round((dn - st) / 1e3, 2))); prev, first = dn, s + 1
        per = {}
        for d, g_, t in segs:
            per.setdefault(d, [0, 0, 0]); per[d][0] += 1; per[d][1] += g_; per[d][2] += t
        print(f"timed decode: wall {run.wall_us / 1e3:.1f} ms, outside {(run.wall_us - _span_us(run.nodes)) / 1e3:.1f}; per device (splits, gaps ms, run ms):",
              {d: [v[0], round(v[1], 1), round(v[2], 1)] for d, v in per.items()}, flush=True)
print("load", os.getloadavg())
llm.close(); srv.stop()
