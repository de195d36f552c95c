"""Flash attention's prompt spans (f16 cache) in passes of 128 and of 512 tokens (llama.cpp's default
ubatch), after 1024 and 4000 cells: the growth per token and cell, and per multiply-add of the work
term (calfit.work).

    python spans_512.py MODEL
"""

import sys

from oallama.planner.cost import attnspan
from oallama.runtime import kvcache

model = sys.argv[1]
for pt in (128, 512):
    attnspan.PROMPT_TOKENS = pt
    for long in (1024, 4000):
        attnspan.LONG_PAST = long
        att = kvcache.llama_kwargs(flash_attn=True, type_k="f16", type_v="f16")
        out = attnspan.measure(model, ["CPU"], threads=1, attention=att, reps=3)
        sp = [s for s in out if s["n_tokens"] == pt]
        sh, lo = sum(s["short_us"] for s in sp), sum(s["long_us"] for s in sp)
        wl, ws = sum(n[2] for s in sp for n in s["nodes"]), sum(n[1] for s in sp for n in s["nodes"])
        print(f"prompt {pt} long {long}: spans {len(sp)} short {sh:.0f} long {lo:.0f} us; per token-cell "
              f"{(lo - sh) / (long * pt) * 1e3:.2f} ns; per MAC {(lo - sh) / (wl - ws) * 1e6:.3f} ps", flush=True)
