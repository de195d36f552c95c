"""Repeat test_timed_prediction_matches_a_real_run's measurements and print every factor (one JSON
line per iteration, after a "min" line: the fastest run's TTFT and TPOT, s).

    [SAME=1] python timing_diag.py MID_GGUF ITERATIONS   (MID_GGUF: oallama synth -p mid -t q8_0 --layers 8)

SAME=1: the device at the calibration's matmul speed, as the test now gives it."""

import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from oallama import cluster as D
from oallama.cluster import probe
from oallama.runtime import rpc
from oallama.runtime.generate import timed_generate

N_PROMPT = 16
MATMUL = (1024, 1024)
mid = Path(sys.argv[1])
iters = int(sys.argv[2])
with rpc.start_server(threads=1) as server:
    for it in range(iters):
        cost = D.model_cost(mid, (1, N_PROMPT), n_ctx=256)
        timed = D.time_blocks(cost, threads=1, n_prompt=N_PROMPT, matmul=MATMUL, progress=False)
        opts = probe.ProbeOptions(
            matmul_k=1024,
            matmul_m=1024,
            tokens=(1, N_PROMPT),
            samples=3,
            rtt_samples=10,
            warmup=1,
            payload_bytes=2**16,
            compute_target_s=0.1,
        )
        doc = probe.probe([server.endpoint], opts, client=False)
        doc["devices"][0]["memory_free"] = 2**34
        p = Path(tempfile.gettempdir()) / f"timing_diag_dev{it}.json"
        p.write_text(json.dumps(doc))
        cl = D.read_devices(p)
        if os.environ.get("SAME"):
            cl = replace(cl, devices=[replace(cl.devices[0], flops=dict(timed.times.matmul_flops))])
        dopts = D.DistOptions(n_prompt=N_PROMPT, n_gen=16, n_ctx=256)
        plan = D.plan(timed, cl, dopts)
        pred = plan.predicted()
        llm = D.load(plan, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
        toks = llm.tokenize(b"The quick brown fox jumps over the lazy dog and runs far away", add_bos=True)
        toks = (toks * N_PROMPT)[:N_PROMPT]
        timed_generate(llm, toks, 4)
        gens = [timed_generate(llm, toks, 16) for _ in range(5)]
        llm.close()
        ttft = statistics.median(g.ttft_s for g in gens)
        print("min", min(g.ttft_s for g in gens), min(g.tpot_s for g in gens))
        tpot = statistics.median(g.tpot_s for g in gens)
        fo = D.predict(replace(timed, times=None), cl, plan.assign, dopts)
        t = timed.times
        dev = cl.devices[0]
        print(
            json.dumps(
                dict(
                    it=it,
                    load=os.getloadavg()[0],
                    ttft=dict(
                        pred=pred.ttft_s,
                        flop=fo.ttft_s,
                        meas=ttft,
                        r=pred.ttft_s / ttft,
                        rf=fo.ttft_s / ttft,
                        runs=[g.ttft_s for g in gens],
                    ),
                    tpot=dict(
                        pred=pred.tpot_s, flop=fo.tpot_s, meas=tpot, r=pred.tpot_s / tpot, rf=fo.tpot_s / tpot
                    ),
                    client_flops={n: t.matmul_flops[n] for n in t.matmul_flops},
                    dev_flops=dev.flops,
                    ratio={n: t.matmul_flops[n] / dev.flops[n] for n in t.matmul_flops},
                    blocks={n: sum(v) / 1e3 for n, v in t.block_us.items()},
                    rest={n: v / 1e3 for n, v in t.rest_us.items()},
                    rpc_block={n: v / 1e3 for n, v in t.rpc_block_us.items()},
                )
            ),
            flush=True,
        )
