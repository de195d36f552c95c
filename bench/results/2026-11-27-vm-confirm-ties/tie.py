"""One placement confirmed against itself: llama.cpp's host-only load as the baseline and the same
placement as a candidate predicted twice as fast (tests/test_confirm.py's tie). One JSON line per
confirmation: the paired ratios q (candidate / baseline, round by round), their median and spread
(half the range), the TTFT and TPOT ratios' medians, which was kept, the load average.

    python tie.py N ROUNDS [TREE] > out.jsonl   # N confirmations of ROUNDS rounds each (TREE: another
                                                # tree's python/ directory, whose oallama runs instead)
"""
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

if len(sys.argv) > 3:  # another tree's sources, ahead of the installed (editable) oallama
    sys.meta_path = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, sys.argv[3])
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["OALLAMA_CACHE"] = tempfile.mkdtemp(prefix="tie-cache-")
import oallama  # noqa: F401
from oallama.model import synthetic
from oallama.planner import confirm as C
from oallama.planner.plan import Workload, build_context, make_plan
from oallama.runtime import rpc
from oallama.runtime.planfile import ConfirmOptions

N, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
path = Path(tempfile.gettempdir()) / "tie-mid-q8_0-4.gguf"  # the test's model: `mid`, q8_0, 4 layers
if not path.exists():
    synthetic.write_model(path, preset="mid", qtype="q8_0", progress=False, n_layer=4)
with rpc.start_server(threads=1) as srv:
    ctx = build_context(path, srv.device_name, Workload(prompt=32, gen=16, n_ubatch=32), threads=1, progress=False)
    host = make_plan(ctx, "layers", 1)  # -ngl 0
    for k in range(N):
        cands = [C.Candidate(["layers"], host, True, host.predicted["e2e_ms"]),
                 C.Candidate(["optimal"], dataclasses.replace(host, strategy="optimal"), False,
                             host.predicted["e2e_ms"] / 2)]
        conf = C.confirm(ctx, {}, ConfirmOptions(confirm_rounds=ROUNDS), candidates=cands, cache=False,
                         progress=False)
        a, b = cands[1].runs, cands[0].runs
        q = [x["objective_ms"] / y["objective_ms"] for x, y in zip(a, b, strict=True)]
        print(json.dumps({
            "k": k, "mode": conf.mode, "chosen": conf.chosen.label, "median": statistics.median(q),
            "spread": (max(q) - min(q)) / 2, "q": [round(v, 4) for v in q],
            "ttft_med": statistics.median(x["ttft_ms"] / y["ttft_ms"] for x, y in zip(a, b, strict=True)),
            "tpot_med": statistics.median(x["tpot_ms"] / y["tpot_ms"] for x, y in zip(a, b, strict=True)),
            "base_ms": statistics.median(y["objective_ms"] for y in b), "load": os.getloadavg()[0],
            "seconds": conf.seconds}), flush=True)
