import sys, statistics
from oallama import _core
from oallama.planner.realpass import timed_eval
from oallama.planner.calibrate import _split_stops, _span_us
from oallama.runtime.llama import Llama
from oallama.runtime.generate import prompt_tokens
M = sys.argv[1]; sizes = [int(x) for x in sys.argv[2].split(",")]
llm = Llama(M, n_ctx=512, n_batch=max(sizes), n_ubatch=max(sizes), n_threads=1, n_threads_batch=1, n_gpu_layers=0, verbose=False, op_offload=False, flash_attn=False)
toks = prompt_tokens(llm, 512)
for rnd in range(2):
  for n, past in [(1, 32)] + [(n, 0) for n in sizes]:
    with _core.NodeTimer(llm.native_context) as timer:
        stops = _split_stops(timed_eval(llm, timer, toks[:past], toks[past:past+n], []).nodes)
        sp = [timed_eval(llm, timer, toks[:past], toks[past:past+n], stops) for _ in range(9)]
    out = statistics.median(r.wall_us - _span_us(r.nodes) for r in sp)
    print(f"n={n} past={past}: wall {statistics.median(r.wall_us for r in sp):.0f} outside {out:.0f} us")
