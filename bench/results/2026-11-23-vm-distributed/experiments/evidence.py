"""The observations behind cluster/timing.py's choices, re-measured (run alone; writes evidence.json):

1. the probe's matmul on one loopback rpc-server, probed 4 times back to back (GFLOP/s per sample):
   why the probe keeps its fastest sample;
2. bytes a pass moves on llama.cpp's connection with every block on the server, loaded with
   n_gpu_layers = n (output layer on the CPU) and as plans load (n + 1, output weights pinned):
   why the timing child loads as plans load;
3. decode passes of the tiny model on a loopback rpc-server (us): why the timing test uses `mid`.

    python bench/results/2026-11-23-vm-distributed/experiments/evidence.py MID.gguf TINY.gguf
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import oallama  # noqa: F401
from oallama import cluster as D
from oallama.cluster import timing
from oallama.cluster.probe import ProbeOptions, probe_device
from oallama.planner.cost.realpass import decode_walls
from oallama.runtime import rpc
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama

KW = {"n_ctx": 256, "n_batch": 32, "n_ubatch": 32, "n_threads": 1, "n_threads_batch": 1, "verbose": False}


def main() -> None:
    mid, tiny = sys.argv[1], sys.argv[2]
    out: dict = {
        "load_avg_start": os.getloadavg()[0],
        "commit": os.popen("git rev-parse --short HEAD").read().strip(),
    }
    opts = ProbeOptions(
        tokens=(1, 32),
        samples=3,
        rtt_samples=10,
        warmup=1,
        payload_bytes=2**16,
        compute_target_s=0.2,
        compute_repeats=5,
    )
    with rpc.start_server(threads=1) as srv:
        out["probe_gflops_samples"] = []
        for _ in range(4):
            s = probe_device(srv.endpoint, opts)[0]["matmul"]["seconds"]
            out["probe_gflops_samples"].append(
                {k: [round(2 * 4096 * 4096 * int(k) / x / 1e9, 1) for x in v] for k, v in s.items()}
            )
    cost = D.model_cost(mid, (1, 32), n_ctx=256)
    blocks = [t for b in cost.blocks for t in b.tensors]
    with rpc.start_server(threads=1) as srv:
        out["pass_bytes_up_down"] = {}
        for label, kw in (
            ("n_gpu_layers=n", {"n_gpu_layers": cost.n_blocks}),
            ("n_gpu_layers=n+1 (as plans load)", {"n_gpu_layers": cost.n_blocks + 1, "tensor_split": [1.0]}),
        ):
            llm = Llama(
                mid,
                devices=["CPU", srv.device_name],
                placement=dict.fromkeys(blocks, srv.device_name),
                **kw,
                **KW,
            )
            toks = prompt_tokens(llm, 33)
            out["pass_bytes_up_down"][label] = {
                s: timing._pass_bytes(llm, srv.endpoint, toks, s, 32) for s in (1, 32)
            }
            llm.close()
    tcost = D.model_cost(tiny, (1, 16), n_ctx=256)
    tblocks = [t for b in tcost.blocks for t in b.tensors]
    with rpc.start_server(threads=1) as srv:
        llm = Llama(
            tiny,
            devices=["CPU", srv.device_name],
            placement=dict.fromkeys(tblocks, srv.device_name),
            n_gpu_layers=tcost.n_blocks + 1,
            tensor_split=[1.0],
            **KW,
        )
        toks = prompt_tokens(llm, 64)
        out["tiny_rpc_decode_us"] = [[round(x) for x in decode_walls(llm, toks, 16, 5)] for _ in range(4)]
        llm.close()
    out["load_avg_end"] = os.getloadavg()[0]
    out["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (Path(__file__).parent / "evidence.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
