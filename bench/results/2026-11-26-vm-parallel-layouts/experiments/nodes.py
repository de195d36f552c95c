#!/usr/bin/env python3
"""Where a decode pass of N sequences spends its time, node by node: one token of each of N
sequences after a 64-token prompt each, with a row of logits for `outs` of them (N: as llama-server
runs it; 1: as a prompt pass of N tokens would be timed). The scheduler's eval callback times every
node (`_core.NodeTimer`); per (layer-less name, op, weight type), the median over 5 passes after one
warm-up, summed over the pass.

    python nodes.py MODEL N OUTS [THREADS]

The finding of the README's step 2: the output matmul of a 4-sequence pass with 4 rows of logits
against 1 (the pass timed as a prompt's: one output).
"""
import collections
import contextlib
import statistics
import sys

from oallama import Llama, _core
from oallama.runtime.generate import SeqBatch, prompt_tokens

PROMPT, PASSES = 64, 5


def main() -> int:
    model, n, outs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    llm = Llama(model, n_ctx=1024, n_batch=128, n_ubatch=128, n_threads=threads, n_threads_batch=threads,
                verbose=False, n_seq_max=n, kv_unified=False)
    toks = prompt_tokens(llm, PROMPT)
    by: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    with contextlib.closing(SeqBatch(128)) as b:
        for s in range(n):
            b.decode(llm, [(t, i, s, i == PROMPT - 1) for i, t in enumerate(toks)])
        with _core.NodeTimer(llm.native_context) as timer:
            for step in range(PASSES + 1):
                timer.reset([])
                b.decode(llm, [(toks[step], PROMPT + step, s, s >= n - outs) for s in range(n)])
                if step == 0:
                    continue  # warm-up
                for r in timer.times():
                    by[(r.name.split("-")[0], r.op, r.weight_type)].append(r.range_us)
    llm.close()
    total = {k: statistics.median(v) * len(v) / PASSES for k, v in by.items()}  # us per pass
    print(f"sequences {n}, rows of logits {outs}, threads {threads}: pass {sum(total.values()) / 1e3:.1f} ms "
          "(node by node)")
    for k, us in sorted(total.items(), key=lambda x: -x[1])[:6]:
        print(f"  {k[0]:<14} {k[1]:<10} {k[2]:<6} {us / 1e3:7.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
