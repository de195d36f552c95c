import os
import statistics
import sys

from oallama import _core
from oallama.planner.cost.calibrate import _span_us, _split_stops
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

M, PLAN = (
    sys.argv[1],
    sys.argv[2],
)  # tiny-q8_0.gguf, tiny_fit75.plan.json (fit True 75%, prompt 32; its rpc-server was 127.0.0.1:46987)
srv = start_server(port=46987, threads=1)
llm = Llama(
    M,
    placement=PLAN,
    n_ctx=256,
    n_batch=64,
    n_ubatch=64,
    n_threads=1,
    n_threads_batch=1,
    verbose=False,
    seed=1234,
)
prompt = prompt_tokens(llm, 32)
tp = []
for _r in range(6):
    g = timed_generate(llm, prompt, 32, temperature=0.0)
    tp.append(g.tpot_s * 1e3)
print("generate TPOT ms", [round(x, 3) for x in tp])
toks = prompt_tokens(llm, 256)
with _core.NodeTimer(llm.native_context) as timer:
    nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    sp = [timed_eval(llm, timer, toks[:32], toks[32:33], stops) for _ in range(30)]
print("splits:", [(nodes[s].device[:3], s) for s in stops])
walls = [r.wall_us for r in sp]
spans = [_span_us(r.nodes) for r in sp]
print(
    f"decode eval wall us median {statistics.median(walls):.0f} min {min(walls):.0f}; graph span median {statistics.median(spans):.0f}; outside median {statistics.median(w - s for w, s in zip(walls, spans, strict=False)):.0f}"
)
for k, s in enumerate(stops):
    print(
        "  split",
        k,
        nodes[s].device[:3],
        f"range us median {statistics.median(r.nodes[s].range_us for r in sp):.0f}",
    )
plain = [timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us for _ in range(30)]
print(f"decode eval wall without timer: median {statistics.median(plain):.0f} min {min(plain):.0f}")
print(os.getloadavg())
llm.close()
srv.stop()
