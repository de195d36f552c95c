"""Per weight matmul shape: the real graph's time (node by node, the scheduler's eval callback) with
llama.cpp's default layouts and with every host weight plain, at 1 and 32 tokens, against the one-op
profile's times of the same shapes in both layouts (the profile the bench planned with). Every weight
on the host, 1 thread. What a per-layout calibration would correct (us, median of 5 passes)."""
import sys, statistics, json, os
from collections import defaultdict
from oallama import _core
from oallama.runtime.llama import Llama
from oallama.runtime.generate import prompt_tokens
from oallama.planner.realpass import timed_eval
M, PROFILE = sys.argv[1], sys.argv[2]
prof = json.load(open(PROFILE))["layouts"]
kw = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234, n_gpu_layers=0, op_offload=False)
default = Llama(M, **kw)
weights = [w for w in default.tensor_devices() if w.endswith(".weight") and "norm" not in w and "token_embd" not in w]
plain = Llama(M, layouts={w: "CPU" for w in weights}, **kw)
toks = prompt_tokens(default, 64)
res = {}
for name, llm in (("default", default), ("plain", plain)):
    with _core.NodeTimer(llm.native_context) as timer:
        for n in (1, 32):
            prefix, batch = (toks[:32], toks[32:33]) if n == 1 else ([], toks[:32])
            timed_eval(llm, timer, prefix, batch, [])
            runs = [timed_eval(llm, timer, prefix, batch, []) for _ in range(5)]
            per = defaultdict(list)
            for k, node in enumerate(runs[0].nodes):
                if node.op == "MUL_MAT" and node.weight_type and node.src_ne:
                    s = node.src_ne[0]
                    key = f"MUL_MAT:{node.weight_type}:{s[0]}x{s[1]}:{n}"
                    per[key].append(statistics.median(r.nodes[k].range_us for r in runs))
            for key, v in per.items():
                res.setdefault(key, {})[name] = statistics.median(v)
print(f"{'shape @ columns':34s} {'real default':>12s} {'real plain':>11s} {'ratio':>6s} | {'profile default':>15s} {'plain':>8s} {'ratio':>6s}")
for key in sorted(res, key=lambda k: (int(k.rsplit(':', 1)[1]), k)):
    r = res[key]; pd = prof.get("CPU_REPACK", {}).get(key, {}).get("median_us"); pp = prof.get("CPU", {}).get(key, {}).get("median_us")
    if "default" in r and "plain" in r:
        print(f"{key:34s} {r['default']:12.0f} {r['plain']:11.0f} {r['plain'] / r['default']:6.2f} | "
              + (f"{pd:15.0f} {pp:8.0f} {pp / pd:6.2f}" if pd and pp else "   (not in the profile's layouts)"))
print("load", os.getloadavg())
default.close(); plain.close()
