"""Full-size llama3-8b Q4_K_M: does the model's ratio between two placements hold while the machine's
speed drifts? Two loads in one process - every weight on the host, and `layers` @75% on a loopback
rpc-server (the bench's plan) - with decode passes alternated, plus a host memory-bandwidth probe
(numpy copy of 512 MiB), every few seconds for `minutes`. Prints per sample: probe GB/s, host-only
decode ms, layers@75% decode ms, their ratio; then medians and correlations."""
import os
os.environ["OPENBLAS_NUM_THREADS"] = "1"; os.environ["OMP_NUM_THREADS"] = "1"
import sys, statistics, json, time
import numpy as np
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens
from oallama.planner.realpass import timed_eval
M, PLAN, minutes = sys.argv[1], sys.argv[2], float(sys.argv[3])
doc = json.load(open(PLAN)); port = int(doc["accelerator"].rsplit(":", 1)[1].rstrip("]"))
srv = start_server(port=port, threads=1)
kw = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
host = Llama(M, n_gpu_layers=0, op_offload=False, **kw)
l75 = Llama(M, placement=PLAN, **kw)
toks = prompt_tokens(host, 64)
src = np.ones(128 << 20, np.float32); dst = np.empty_like(src)  # 512 MiB
def probe():
    t = time.perf_counter(); np.copyto(dst, src); return 2 * src.nbytes / (time.perf_counter() - t) / 1e9
def decode(llm):
    return statistics.median(timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us / 1e3 for _ in range(2))
rows = []; t_end = time.time() + 60 * minutes
while time.time() < t_end:
    bw = probe(); a = decode(host); b = decode(l75)
    rows.append((time.time(), bw, a, b)); print(f"{time.strftime('%H:%M:%S')} probe {bw:.1f} GB/s host-only {a:.0f} ms layers@75% {b:.0f} ms ratio {b / a:.3f}", flush=True)
r = np.array([x[1:] for x in rows])
print("medians", np.median(r, 0).round(3), "ratio median %.3f (min %.3f max %.3f)" % (np.median(r[:, 2] / r[:, 1]), (r[:, 2] / r[:, 1]).min(), (r[:, 2] / r[:, 1]).max()))
print("corr probe~host %.2f probe~l75 %.2f host~l75 %.2f" % (np.corrcoef(r[:, 0], r[:, 1])[0, 1], np.corrcoef(r[:, 0], r[:, 2])[0, 1], np.corrcoef(r[:, 1], r[:, 2])[0, 1]))
print("load", os.getloadavg())
host.close(); l75.close(); srv.stop()
