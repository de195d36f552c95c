"""tiny on Vulkan0, 25% cell, prompt 32 / gen 32: `optimal`'s plan (every weight on the host, op
offload on with every weight's offload off) against `layers` with op offload off (the same weights
on the host), and the same `layers` plan loaded with op offload on; one process, alternated (ms)."""
import json, os, statistics, sys
from oallama.runtime.llama import Llama
from oallama.runtime.generate import prompt_tokens, timed_generate
D = "bench/results/2026-11-24-vm-vulkan-method15/raw/"
M = "build/bench-models/tiny-q8_0.gguf"
R = int(sys.argv[1]) if len(sys.argv) > 1 else 30
loads = [("optimal (op offload on, every weight never)", "46a065a639e6ac36", True),
         ("layers (op offload off)", "485bd69d578bb6db", False),
         ("layers' plan, op offload on", "485bd69d578bb6db", True)]
llms = [(lab, Llama(M, placement=D + i + ".plan.json", n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1,
                    op_offload=oo, verbose=False, seed=1234)) for lab, i, oo in loads]
prompt = prompt_tokens(llms[0][1], 32)
for _, llm in llms:
    timed_generate(llm, prompt, 32, temperature=0.0)
s = {lab: [] for lab, _ in llms}
for r in range(R):
    for lab, llm in (llms if r % 2 == 0 else llms[::-1]):
        g = timed_generate(llm, prompt, 32, temperature=0.0)
        s[lab].append((g.ttft_s * 1e3, g.tpot_s * 1e3, g.e2e_s * 1e3))
print(f"{R} rounds, load {os.getloadavg()}")
for lab, v in s.items():
    print(f"{lab}: TTFT {statistics.median(x[0] for x in v):.2f} TPOT {statistics.median(x[1] for x in v):.3f} "
          f"e2e {statistics.median(x[2] for x in v):.2f} ms")
for _, llm in llms:
    llm.close()
