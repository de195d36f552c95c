#!/usr/bin/env python3
"""Patch 0009 on an accelerator: a decode pass with every layer on DEVICE, timed without the eval
callback (as a generation runs it) and split by split as calibration times it (the callback's range is
the whole split, so the split keeps its graph id: CUDA replays its captured graph, an rpc-server
recomputes the graph it holds), and after a pass timed node by node (the view graphs of uid 0 the
backend saw before the patch). Each mode's logits are compared with the no-callback pass's.

    python bench/gpu/splitmode.py DEVICE ROUNDS [--preset mid --layers 4 --type q8_0]   # DEVICE: CUDA0, RPC[...]
    python bench/gpu/splitmode.py rpc ROUNDS        # a loopback rpc-server started here

Prints one JSON object: median / min / max wall time per mode (us), the median ratio to the
no-callback pass of the same round, and the largest |logit difference| of each mode.
"""
import argparse
import contextlib
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

from oallama import Llama, _core
from oallama.model import synthetic
from oallama.planner.cost.calibrate import _split_stops
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime import rpc


class NodeLead:
    """A timer whose first reset (timed_eval's lead pass) stops at every node (views of uid 0)."""

    def __init__(self, timer: _core.NodeTimer) -> None:
        self.timer, self.calls = timer, 0

    def reset(self, stops: list[int]) -> None:
        self.timer.reset([] if self.calls == 0 else stops)
        self.calls += 1

    def times(self) -> list:
        return self.timer.times()


def last_logits(llm: Llama) -> np.ndarray:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # the last pass's last output: [n_vocab] f32
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device")
    ap.add_argument("rounds", type=int)
    ap.add_argument("--preset", default="mid")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="splitmode-"))
    path = tmp / "model.gguf"
    synthetic.write_model(path, preset=a.preset, qtype=a.type, progress=False, n_layer=a.layers)
    modes = ("no callback", "split mode", "split mode after node mode")
    wall: dict[str, list[float]] = {m: [] for m in modes}
    diff: dict[str, float] = {m: 0.0 for m in modes}
    with contextlib.ExitStack() as stack:
        device = a.device
        if device == "rpc":
            device = stack.enter_context(rpc.start_server(threads=a.threads)).device_name
        llm = Llama(str(path), devices=[device], n_gpu_layers=999, n_ctx=512, n_batch=32, n_ubatch=32,
                    flash_attn=False, verbose=False, n_threads=a.threads, n_threads_batch=a.threads)
        stack.callback(llm.close)
        toks = list(range(10, 80))
        prefix = toks[:32]
        with _core.NodeTimer(llm.native_context) as timer:
            stops = _split_stops(timed_eval(llm, timer, prefix, [toks[33]], []).nodes)
        for r in range(a.rounds):
            tok = [toks[34 + r % 30]]
            wall["no callback"].append(timed_eval(llm, None, prefix, tok, []).wall_us)
            ref = last_logits(llm)
            with _core.NodeTimer(llm.native_context) as timer:
                wall["split mode"].append(timed_eval(llm, timer, prefix, tok, stops).wall_us)
                diff["split mode"] = max(diff["split mode"], float(np.abs(last_logits(llm) - ref).max()))
                m = "split mode after node mode"
                wall[m].append(timed_eval(llm, NodeLead(timer), prefix, tok, stops).wall_us)
                diff[m] = max(diff[m], float(np.abs(last_logits(llm) - ref).max()))
    base = wall["no callback"]
    out = {k: {"median_us": round(statistics.median(v)), "min_us": round(min(v)), "max_us": round(max(v)),
               "median_ratio_to_no_callback": round(statistics.median(x / b for x, b in zip(v, base, strict=True)), 3),
               "max_abs_logit_diff": diff[k]}
           for k, v in wall.items()}
    print(json.dumps({"device": device, "model": f"{a.preset} {a.layers} layers {a.type}", "rounds": a.rounds,
                      "splits": len(stops), "load": round(os.getloadavg()[0], 2), "commit": os.environ.get("COMMIT"),
                      **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
