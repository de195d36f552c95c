import sys, statistics, json, os
from oallama import _core
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.planner.realpass import timed_eval
from oallama.planner.calibrate import _split_stops, _span_us
M, PLAN = sys.argv[1], sys.argv[2]  # tiny-q8_0.gguf, tiny_fit75.plan.json (fit True 75%, prompt 32; its rpc-server was 127.0.0.1:46987)
srv = start_server(port=46987, threads=1)
llm = Llama(M, placement=PLAN, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
prompt = prompt_tokens(llm, 32)
tp = []
for r in range(6):
    g = timed_generate(llm, prompt, 32, temperature=0.0); tp.append(g.tpot_s * 1e3)
print("generate TPOT ms", [round(x, 3) for x in tp])
toks = prompt_tokens(llm, 256)
with _core.NodeTimer(llm.native_context) as timer:
    nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    sp = [timed_eval(llm, timer, toks[:32], toks[32:33], stops) for _ in range(30)]
print("splits:", [(nodes[s].device[:3], s) for s in stops])
walls = [r.wall_us for r in sp]; spans = [_span_us(r.nodes) for r in sp]
print("decode eval wall us median %.0f min %.0f; graph span median %.0f; outside median %.0f" % (statistics.median(walls), min(walls), statistics.median(spans), statistics.median(w - s for w, s in zip(walls, spans))))
for k, s in enumerate(stops):
    print("  split", k, nodes[s].device[:3], "range us median %.0f" % statistics.median(r.nodes[s].range_us for r in sp))
plain = [timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us for _ in range(30)]
print("decode eval wall without timer: median %.0f min %.0f" % (statistics.median(plain), min(plain)))
print(os.getloadavg())
llm.close(); srv.stop()
