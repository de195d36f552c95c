#!/usr/bin/env python3
"""A decode pass of the mid model (4 blocks, q8_0) with every layer on a loopback rpc-server (1 thread each),
timed three ways in alternated rounds: without the eval callback (as a generation runs it), split by split as
calibration method 33 times it (the pass before it stops at the same split ends, so the rpc-server recomputes
the graph it holds: patch 0009), and split by split after a pass timed node by node (calibration method 32's
order: the server is sent the whole graph again, as every split-mode pass was before patch 0009).

    python splitmode.py ROUNDS > splitmode.txt
"""
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
from oallama import Llama, _core
from oallama.model import synthetic
from oallama.planner.cost.calibrate import _split_stops
from oallama.planner.cost.realpass import timed_eval
from oallama.planner.plan import Workload, build_context, make_plan
from oallama.runtime import rpc


class NodeLead:
    """A timer whose first reset (timed_eval's lead pass) stops at every node, as method 32's did."""

    def __init__(self, timer: _core.NodeTimer) -> None:
        self.timer, self.calls = timer, 0

    def reset(self, stops: list[int]) -> None:
        self.timer.reset([] if self.calls == 0 else stops)
        self.calls += 1

    def times(self) -> list:
        return self.timer.times()


def main() -> int:
    rounds = int(sys.argv[1])
    tmp = Path(tempfile.mkdtemp(prefix="splitmode-"))
    os.environ["OALLAMA_CACHE"] = str(tmp / "cache")
    path = tmp / "mid.gguf"
    synthetic.write_model(path, preset="mid", qtype="q8_0", progress=False, n_layer=4)
    wl = Workload(prompt=32, gen=16, n_ubatch=32)
    res: dict[str, list[float]] = {"no callback": [], "split mode, method 33": [], "split mode, method 32's lead": []}
    with rpc.start_server(threads=1) as server:
        ctx = build_context(path, server.device_name, wl, threads=1, progress=False, calibration="device")
        plan = make_plan(ctx, "layers", "100%").save(tmp / "plan.json")
        llm = Llama(str(path), placement=str(plan), n_ctx=512, n_batch=32, n_ubatch=32, flash_attn=False,
                    verbose=False, n_threads=1, n_threads_batch=1)
        toks = list(range(10, 80))
        prefix = toks[:32]
        with _core.NodeTimer(llm.native_context) as timer:
            stops = _split_stops(timed_eval(llm, timer, prefix, [toks[33]], []).nodes)
        for r in range(rounds):
            tok = [toks[34 + r % 30]]
            res["no callback"].append(timed_eval(llm, None, prefix, tok, []).wall_us)
            with _core.NodeTimer(llm.native_context) as timer:
                res["split mode, method 33"].append(timed_eval(llm, timer, prefix, tok, stops).wall_us)
                res["split mode, method 32's lead"].append(timed_eval(llm, NodeLead(timer), prefix, tok, stops).wall_us)
        llm.close()
    base = res["no callback"]
    out = {k: {"median_us": round(statistics.median(v)), "min_us": round(min(v)), "max_us": round(max(v)),
               "median_ratio_to_no_callback": round(statistics.median(a / b for a, b in zip(v, base, strict=True)), 3)}
           for k, v in res.items()}
    print(json.dumps({"rounds": rounds, "splits": len(stops), "load": round(os.getloadavg()[0], 2), **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
