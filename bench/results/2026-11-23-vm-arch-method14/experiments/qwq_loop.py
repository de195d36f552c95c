"""QwQ-32B cut to 2 layers, a bench plan: the generation loop's TPOT against the same decode passes
without sampling (realpass.decode_walls: consecutive 1-token passes after the prompt, no timer) and a
timed_eval decode pass without a timer, alternated (ms)."""
import sys, statistics, json, os
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.planner.realpass import timed_eval, decode_walls
M, PLAN, R = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(PLAN).read(); old = json.loads(text)["accelerator"]
srv = start_server(threads=1)
open("/tmp/exp/loop.plan.json", "w").write(text.replace(old, srv.device_name))
llm = Llama(M, placement="/tmp/exp/loop.plan.json", n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234)
prompt = prompt_tokens(llm, 32); toks = prompt_tokens(llm, 64)
gen, walls, single = [], [], []
for r in range(R):
    gen.append(timed_generate(llm, prompt, 8, temperature=0.0).tpot_s * 1e3)
    walls.append(statistics.fmean(decode_walls(llm, toks, 32, 7)) / 1e3)
    single.append(timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us / 1e3)
print(f"generation TPOT median {statistics.median(gen):.1f} ms; consecutive decode passes (no sampling) {statistics.median(walls):.1f} ms; "
      f"one timed decode pass {statistics.median(single):.1f} ms  ({R} rounds alternated)")
print("load", os.getloadavg())
llm.close(); srv.stop()
