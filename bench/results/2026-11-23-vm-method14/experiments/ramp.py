import os, sys, time, statistics
from oallama.runtime.llama import Llama
from oallama.planner.realpass import timed_eval
M = sys.argv[1]; n = 32
llm = Llama(M, n_ctx=512, n_batch=n, n_ubatch=n, n_threads=1, n_threads_batch=1, n_gpu_layers=0, verbose=False, op_offload=False, flash_attn=False)
toks = llm.tokenize(b"The quick brown fox " * 80)[:400]
def spin(ms):
    t = time.perf_counter() + ms/1e3
    while time.perf_counter() < t: pass
def evals(ms):
    t = time.perf_counter() + ms/1e3
    while time.perf_counter() < t: timed_eval(llm, None, toks[:n], toks[n:n+1], [])
res = {}
for r in range(12):
    for mode, X in (("spin",0),("spin",100),("spin",400),("spin",1000),("eval",100),("eval",400),("eval",1000)):
        time.sleep(0.5)
        (spin if mode=="spin" else evals)(X)
        d = [timed_eval(llm, None, toks[:n], toks[n:n+1], []).wall_us/1e3 for _ in range(3)]
        res.setdefault((mode,X), []).append(d[0])
for k, v in res.items():
    print(k, "fast share %.2f median %.2f" % (sum(x < 3.3 for x in v)/len(v), statistics.median(v)))
