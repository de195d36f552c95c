"""Flash attention's cost per multiply-add on the CPU against the pass's tokens and the KV cells
before it, across models of different head shapes: is it one device curve (a term fitted once per
device) or does it need each model's own spans?

Per model: one load (flash attention on, f16 cache, 1 thread, host only). The attention spans of a
pass (attnspan.spans: each layer's flash-attention node, timed whole between two stops) are found
once per pass size (1, 128, 512 tokens), then timed in rounds. A round times every pass size after each
past, REPS runs each, the pasts longest first in even rounds (the cache filled once to the longest:
a shorter past reuses its cells) and shortest first in odd ones (each longer past filled anew), so
that the VM's drift does not always favour the same pasts; the host-speed reference ops are timed before each
round. Per (tokens, past): the spans' median time summed over the layers (us) and their work
(calfit.work: multiply-adds over the cells each token attends to, mean over the pass's tokens), and
per multiply-add (ps). Between two pasts: the growth's cost per multiply-add (ps), what a line
fitted to two pasts extrapolates with.

    python attn_per_mac.py OUT.jsonl MODEL [MODEL...]   (PASTS=32,1024,2048,4096,8192 ROUNDS=3 REPS=3)
"""

import json
import os
import statistics
import sys
import time

from oallama import Llama
from oallama.planner.cost import attnspan, hostspeed
from oallama.planner.cost.calfit import work
from oallama.planner.cost.realpass import VIEW_OPS
from oallama.runtime import kvcache
from oallama.runtime.generate import prompt_tokens

out_path, models = sys.argv[1], sys.argv[2:]
pasts = sorted(int(x) for x in os.environ.get("PASTS", "32,1024,2048,4096,8192").split(","))
rounds, reps = int(os.environ.get("ROUNDS", "3")), int(os.environ.get("REPS", "3"))
sizes = (1, 128, 512)


def kv_bytes_per_cell(nodes, spans):
    """K + V bytes per cell of one KV head (f16): what each query head's attention streams per cell."""
    r = next(r for a, b in spans for r in nodes[a:b + 1] if r.op == "FLASH_ATTN_EXT")
    return 2 * (r.src_ne[1][0] + r.src_ne[2][0])


def mac(nodes, spans, n, past):
    """Multiply-adds of the spans' flash-attention nodes for a pass of n tokens after past cells."""
    cells = past + (n + 1) / 2
    return sum(work(r.op, r.ne, r.nbytes, r.src_ne, r.src_bytes, attended=cells)
               for a, b in spans for r in nodes[a:b + 1] if r.op == "FLASH_ATTN_EXT")


with open(out_path, "a") as f:
    for model in models:
        att = kvcache.llama_kwargs(flash_attn=True, type_k="f16", type_v="f16")
        n_ctx = -(-(pasts[-1] + max(sizes) + 2) // 256) * 256
        llm = Llama(model, n_ctx=n_ctx, n_batch=max(sizes), n_ubatch=max(sizes), n_threads=1, n_threads_batch=1,
                    n_gpu_layers=0, op_offload=False, verbose=False, **att)
        toks = prompt_tokens(llm, n_ctx)
        found = {}
        for n in sizes:  # the spans, from node-by-node runs after the shortest and the longest past
            short, long = attnspan.node_list(llm, toks, n, pasts[0]), attnspan.node_list(llm, toks, n, pasts[-1])
            sp = attnspan.spans(short, long, n, pasts[0], pasts[-1])
            ops = {r.op for a, b in sp for r in long[a:b + 1] if r.op not in VIEW_OPS}
            stops = sorted({k for a, b in sp for k in (a - 1, b)})
            found[n] = (long, sp, stops)
            print(f"{os.path.basename(model)} n={n}: {len(sp)} spans of {sorted(ops)}", flush=True)
        for rnd in range(rounds):
            ref = hostspeed.measure("CPU", threads=1)
            load = os.getloadavg()[0]
            order = list(reversed(pasts)) if rnd % 2 == 0 else pasts
            if rnd % 2 == 0:
                llm.reset()
                llm.eval(toks[:pasts[-1]])  # filled once; each shorter past reuses its first cells
            for past in order:  # ascending: timed_eval refills each longer past
                for n in sizes:
                    nodes, sp, stops = found[n]
                    t0 = time.perf_counter()
                    runs = attnspan.time_stops(llm, toks, n, past, stops, reps)
                    per_run = [sum(r[stops.index(b)] for _, b in sp) for r in runs]  # us, every layer's span
                    rec = {"model": os.path.basename(model), "round": rnd, "n_tokens": n, "past": past,
                           "span_us": statistics.median(per_run), "span_min_us": min(per_run),
                           "span_max_us": max(per_run), "mac": mac(nodes, sp, n, past), "layers": len(sp),
                           "kv_bytes_per_cell": kv_bytes_per_cell(nodes, sp),
                           "ref_n32_us": ref["n32_us"], "ref_n1_us": ref["n1_us"], "load": load,
                           "seconds": time.perf_counter() - t0}
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print(f"  round {rnd} past {past:5d} n {n:3d}: {rec['span_us']:9.0f} us "
                          f"({rec['span_us'] / rec['mac'] * 1e6:6.1f} ps/MAC)  ref n32 {ref['n32_us']:.0f}", flush=True)
        llm.close()
