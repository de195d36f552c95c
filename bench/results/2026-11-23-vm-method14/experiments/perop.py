import sys, statistics, collections
from oallama import _core
from oallama.planner.profile import Profile
from oallama.planner.context import build_context, Workload
from oallama.planner.realpass import timed_eval, VIEW_OPS
from oallama.planner.calibrate import _split_stops, _span_us
from oallama.runtime.llama import Llama
from oallama.runtime.generate import prompt_tokens
M, P = sys.argv[1], sys.argv[2]
prof = Profile.load(P); cal = prof.calibration; ov = cal.devices["CPU"].node_overhead_us
sizes = [int(x) for x in sys.argv[3].split(",")]
pred = {}
for n in sizes:
    ctx = build_context(M, None, Workload(prompt=n, gen=2, n_ubatch=n), profile=prof, threads=1, progress=False)
    pm = ctx.passes[n]; agg = collections.Counter()
    for i, us in pm.t_host.items():
        node = pm.graph.nodes[i]; agg[("W:" if i in pm.targets else "") + node.op] += us
    pred[n] = agg
llm = Llama(M, n_ctx=512, n_batch=max(sizes), n_ubatch=max(sizes), n_threads=1, n_threads_batch=1, n_gpu_layers=0, verbose=False, op_offload=False, flash_attn=False)
toks = prompt_tokens(llm, 512)
for n in sizes:
    with _core.NodeTimer(llm.native_context) as timer:
        timed_eval(llm, timer, [], toks[:n], [])
        runs = [timed_eval(llm, timer, [], toks[:n], []) for _ in range(5)]
        stops = _split_stops(runs[0].nodes)
        sp = [timed_eval(llm, timer, [], toks[:n], stops) for _ in range(5)]
    meas = collections.Counter()
    for k, r in enumerate(runs[0].nodes):
        if r.op in VIEW_OPS: continue
        us = statistics.median(run.nodes[k].range_us for run in runs) - ov
        meas[("W:" if r.weight_type and r.op in ("MUL_MAT", "MUL_MAT_ID", "GET_ROWS") and r.op != "GET_ROWS" else "") + r.op] += us
    span = statistics.median(_span_us(r.nodes) for r in sp)
    print(f"n={n}: span {span:.0f} us; node-mode sum {sum(meas.values()):.0f}; predicted graph {sum(pred[n].values()):.0f}")
    for k in sorted(set(meas) | set(pred[n]), key=lambda k: -meas.get(k, 0)):
        print(f"   {k:14s} meas {meas.get(k,0):8.0f}  pred {pred[n].get(k,0):8.0f}")
