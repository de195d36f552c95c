"""qwen3moe-small cut to 8 layers, every layer on Vulkan0 (the calibration's accelerator load): its
decode pass (1 token after 32) timed as the calibration times it (timed_eval, split stops) and back to
back as a generation runs it (decode_walls), in turns for R rounds: the distribution of each (ms)."""
import os, statistics, sys
from oallama import _core
from oallama.runtime.llama import Llama
from oallama.runtime.generate import prompt_tokens
from oallama.planner.realpass import timed_eval, decode_walls
from oallama.planner.calibrate import _split_stops
R = int(sys.argv[1]) if len(sys.argv) > 1 else 10
llm = Llama("build/bench-models/qwen3moe-small-q4_k_m-L8.gguf", devices=["Vulkan0"], n_gpu_layers=99, n_ctx=256,
            n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, op_offload=True, verbose=False)
toks = prompt_tokens(llm, 64)
with _core.NodeTimer(llm.native_context) as timer:
    stops = _split_stops(timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes)
timed, walls = [], []
for r in range(R):
    with _core.NodeTimer(llm.native_context) as timer:
        timed.append(timed_eval(llm, timer, toks[:32], toks[32:33], stops).wall_us / 1e3)
    walls += [w / 1e3 for w in decode_walls(llm, toks, 32, 3)]
def q(v):
    v = sorted(v); return f"min {v[0]:.1f} p25 {v[len(v) // 4]:.1f} median {statistics.median(v):.1f} p75 {v[3 * len(v) // 4]:.1f} max {v[-1]:.1f} (n {len(v)})"
print(f"timed at split stops: {q(timed)}")
print(f"back to back:         {q(walls)}")
print("load", os.getloadavg())
llm.close()
