"""MiniCPM3-4B Q4_K_M cut to 4 layers, every weight on the host: llama.cpp's default layouts (the bench's
`layers` @25% plan) against `optimal`'s per-weight layouts (20 plain, 8 repacked), both loaded in one
process, generations alternated (prompt 32, generate 8): TTFT / TPOT medians per plan."""
import sys, statistics, json, os
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate
M, A, B, R = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
port = int(json.load(open(A))["accelerator"].rsplit(":", 1)[1].rstrip("]"))
srv = start_server(port=port, threads=1)
kw = dict(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
llms = {"default layouts (layers@25%)": Llama(M, placement=A, **kw), "optimal's layouts": Llama(M, placement=B, **kw)}
prompt = prompt_tokens(next(iter(llms.values())), 32)
res = {k: [] for k in llms}
for r in range(R):
    for k, llm in (list(llms.items()) if r % 2 == 0 else list(reversed(llms.items()))):
        g = timed_generate(llm, prompt, 8, temperature=0.0); res[k].append((g.ttft_s * 1e3, g.tpot_s * 1e3))
for k, v in res.items():
    print(f"{k:30s} TTFT median {statistics.median(x[0] for x in v):.1f} ms [{min(x[0] for x in v):.1f}..{max(x[0] for x in v):.1f}]  "
          f"TPOT median {statistics.median(x[1] for x in v):.2f} ms [{min(x[1] for x in v):.2f}..{max(x[1] for x in v):.2f}]")
ka, kb = list(res)
print("ratio optimal/default per round, median: TTFT %.3f TPOT %.3f" % (
    statistics.median(b[0] / a[0] for a, b in zip(res[ka], res[kb])), statistics.median(b[1] / a[1] for a, b in zip(res[ka], res[kb]))))
print("load", os.getloadavg())
for l in llms.values(): l.close()
srv.stop()
