"""What a generation's first token pays beyond its prompt pass and a sample: not in the model.

`generate` builds a sampler chain per call. Timed as a generation's time to its first token
(`timed_generate`, 32-token prompt) less the same prompt's pass (reset + eval after a decode pass)
less a later sample (`outside.sample_us`, what every pass's overhead includes), 12 alternations:

  fresh      in a process that has only loaded the model and evaluated a prompt
  after      the same, right after `sample_us` timed 17 samples of one chain and freed it (the
             calibration's host load times `sample_us` before anything else would time this)

Host load, 1 thread (us, medians).

    python first_sample.py MODEL.gguf [...]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from oallama.planner.cost.outside import sample_us
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama


def first_token_extra(llm: Llama, toks: list[int], reps: int) -> tuple[float, float]:
    """(TTFT less prompt pass less a later sample, that later sample) in us."""
    ttft, prompt = [], []
    for _ in range(reps):
        ttft.append(timed_generate(llm, toks[:32], 2).ttft_s * 1e6)
        llm.reset()
        llm.eval(toks[:40])
        llm.eval(toks[40:41])  # the prompt's pass follows a decode pass, as in a generation
        t0 = time.perf_counter()
        llm.reset()
        llm.eval(toks[:32])
        prompt.append((time.perf_counter() - t0) * 1e6)
    s = sample_us(llm, 15)
    return statistics.median(ttft) - statistics.median(prompt) - s, s


def main() -> int:
    print(f"load average {os.getloadavg()}")
    print(
        "| model | n_vocab | later sample | first token's extra, fresh | ... after sample_us |\n|---|---|---|---|---|"
    )
    for m in sys.argv[1:]:
        llm = Llama(
            m,
            n_ctx=256,
            n_batch=64,
            n_ubatch=64,
            n_threads=1,
            n_threads_batch=1,
            verbose=False,
            n_gpu_layers=0,
        )
        try:
            toks = prompt_tokens(llm, 64)
            llm.eval(toks[:32])
            fresh, s = first_token_extra(llm, toks, 12)  # ends with sample_us
            after, _ = first_token_extra(llm, toks, 12)
            print(f"| {Path(m).stem} | {llm.n_vocab()} | {s:.0f} | {fresh:.0f} | {after:.0f} |")
        finally:
            llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
