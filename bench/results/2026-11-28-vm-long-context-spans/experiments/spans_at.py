"""The attention spans of a decode pass and a 128-token prompt pass (attnspan.measure, the
calibration's own measurement) with the long KV cache at other lengths than its 1024 cells: the
growth per cell from the short cache to the long one, the model's layers summed.

    python spans_at.py MODEL 1024,4000 on:f16,off:f16
"""

import sys

from oallama.planner.cost import attnspan
from oallama.runtime import kvcache

model = sys.argv[1]
for long in [int(x) for x in sys.argv[2].split(",")]:
    attnspan.LONG_PAST = long
    for fa, ct in [tuple(x.split(":")) for x in sys.argv[3].split(",")]:
        att = kvcache.llama_kwargs(flash_attn=(fa == "on"), type_k=ct, type_v=ct)
        out = attnspan.measure(model, ["CPU"], threads=1, attention=att, reps=5)
        for n in (1, 128):
            sp = [s for s in out if s["n_tokens"] == n]
            sh, lo = sum(s["short_us"] for s in sp), sum(s["long_us"] for s in sp)
            cells = long - sp[0]["short_past"]
            print(f"long {long} fa {fa} n {n}: spans {len(sp)} short {sh:.0f} long {lo:.0f} us  "
                  f"growth/cell {(lo - sh) / cells:.3f} us", flush=True)
