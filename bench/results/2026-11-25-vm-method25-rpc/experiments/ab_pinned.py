"""Two or more bench plans of one cell in one process, each on its own rpc-server pinned to CPU 1
(this process on CPU 0), generated alternately. usage: ab_pinned.py MODEL ROUNDS PLAN.json..."""

import json
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack, closing
from pathlib import Path

from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens, timed_generate
from oallama.runtime.llama import Llama

model, rounds, plans = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
res = {p: {"ttft": [], "tpot": [], "e2e": []} for p in plans}
with ExitStack() as st, tempfile.TemporaryDirectory() as tmp:
    servers = [st.enter_context(rpc.start_server(threads=1, cpus=[1])) for _ in plans]
    st.enter_context(rpc.beside([1]))
    llms = {}
    for k, p in enumerate(plans):
        srv = servers[k]
        doc = json.loads(Path(p).read_text())
        old = doc["accelerator"]
        text = json.dumps(doc).replace(old, srv.device_name)
        path = Path(tmp) / f"p{k}.json"
        path.write_text(text)
        wl = doc["workload"]
        llms[p] = (
            st.enter_context(
                closing(
                    Llama(
                        model,
                        devices=[srv.device_name],
                        placement=str(path),
                        n_ctx=256,
                        n_batch=64,
                        n_ubatch=64,
                        n_threads=1,
                        n_threads_batch=1,
                        flash_attn=False,
                        verbose=False,
                    )
                )
            ),
            wl,
            doc["predicted"],
        )
    for r in range(rounds + 1):
        order = list(llms) if r % 2 else list(reversed(llms))
        for p in order:
            llm, wl, _ = llms[p]
            g = timed_generate(llm, prompt_tokens(llm, wl["prompt"]), wl["gen"])
            if r:
                res[p]["ttft"].append(g.ttft_s * 1e3)
                res[p]["tpot"].append(g.tpot_s * 1e3)
                res[p]["e2e"].append(g.e2e_s * 1e3)
    base = plans[0]
    for p in plans:
        pred = llms[p][2]
        ratio = statistics.median(a / b for a, b in zip(res[p]["e2e"], res[base]["e2e"], strict=False))
        print(
            f"{Path(p).name}: ttft {statistics.median(res[p]['ttft']):.2f} (pred {pred['ttft_ms']:.2f}) tpot "
            f"{statistics.median(res[p]['tpot']):.3f} (pred {pred['tpot_ms']:.3f}) e2e {statistics.median(res[p]['e2e']):.1f} "
            f"(pred {pred['e2e_ms']:.1f}); paired e2e / first {ratio:.3f} (pred {pred['e2e_ms'] / llms[base][2]['e2e_ms']:.3f}); load {os.getloadavg()[0]:.2f}"
        )
