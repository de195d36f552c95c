import sys, statistics
from oallama import _core
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens
from oallama.planner.realpass import timed_eval
from oallama.planner.calibrate import _split_stops, _span_us
M, PLAN = sys.argv[1], sys.argv[2]  # tiny-q8_0.gguf, tiny_fit75.plan.json
srv = start_server(port=46987, threads=1)
llm = Llama(M, placement=PLAN, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
toks = prompt_tokens(llm, 256)
with _core.NodeTimer(llm.native_context) as timer:
    nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    sp = [timed_eval(llm, timer, toks[:32], toks[32:33], stops) for _ in range(20)]
    r = sp[len(sp)//2]
    t0 = r.nodes[0].start_us
    for n in r.nodes:
        print(n.index, n.device[:3], n.name, n.op, "start %.0f done %.0f range %.0f" % (n.start_us - t0, n.done_us - t0, n.range_us))
print([ (k, getattr(r.nodes[0], k)) for k in dir(r.nodes[0]) if not k.startswith('_')][:20])
llm.close(); srv.stop()
