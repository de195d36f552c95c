"""Does a device's compute run slower in short turns? The full 8B's decode pass under placement
families whose turns (a device's split between two of the other's) differ in length, each split
measured against the pass model (ms).

  ngl K     llama.cpp's rule, the last K layers and the output on the rpc-server: one host turn,
            one rpc-server turn of K layers (K = 1, 4, 16)
  ffn/M     the FFN of every M-th layer on the rpc-server, all else on the host: rpc-server turns
            of one FFN, host turns of M-1 layers and an attention (M = 1, 2, 4, 8)

Each load's plan is costed by the bench's committed profile (method16, this 8B's), refitted by this
checkout (as bench/scripts/repredict.py); each 1-token pass after 32 tokens is timed at its splits' ends
(the calibration's `_split_stops`), ROUNDS times alternated across loads, plus its untimed pass.
Per split: the device, the preceding gap (the other device's turn, measured), measured, predicted.

    python turns.py ROUNDS [LOAD ...] [--spec RESULTS_DIR:CONFIG_ID]   (loads named as above: ngl1 ffn4 ...)

--spec: another bench configuration's model, settings and profile (default the 8B's below; ngl0 is
the output matrix alone on the rpc-server).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "bench" / "scripts"))
sys.path.insert(0, str(HERE.parent / "2026-11-24-vm-method16" / "experiments"))
from splits_apart import close, measure, predicted_splits, prepared  # noqa: E402

import repredict  # noqa: E402
from oallama.planner.cost.schedmodel import Placement  # noqa: E402
from oallama.runtime.llama import Llama  # noqa: E402
from oallama.runtime.rpc import start_server  # noqa: E402

RESULTS = HERE.parent / "2026-11-24-vm-method16"
SPEC = "0d3dbc246b40cd17"  # the 8B's optimal @75%: its model, settings and profile
LOADS = ("ngl1", "ngl4", "ngl16", "ffn1", "ffn2", "ffn4", "ffn8")


def load(name: str, model: str, tensors: list[str], srv) -> tuple[Llama, Placement]:
    common = dict(
        n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234
    )
    if name.startswith("ngl"):
        k = int(name[3:])
        llm = Llama(model, devices=[srv.device_name], n_gpu_layers=k + 1, **common)
        on = frozenset(t.name for t in llm.tensor_placements() if t.device == srv.device_name)
        return llm, Placement(on, k)
    m = int(name[3:])
    on = frozenset(
        t
        for t in tensors
        if t.startswith("blk.")
        and ".ffn_" in t
        and t.endswith(".weight")
        and ".ffn_norm" not in t
        and int(t.split(".")[1]) % m == m - 1
    )
    llm = Llama(model, devices=[srv.device_name], placement={t: srv.device_name for t in on}, **common)
    got = frozenset(t.name for t in llm.tensor_placements() if t.device == srv.device_name)
    assert got == on, sorted(on ^ got)[:5]
    return llm, Placement(on, 0)


def main() -> int:
    args = sys.argv[1:]
    results, spec_id = RESULTS, SPEC
    if "--spec" in args:
        k = args.index("--spec")
        d, spec_id = args[k + 1].rsplit(":", 1)
        results, args = Path(d), args[:k] + args[k + 2 :]
    rounds, names = int(args[0]), args[1:] or list(LOADS)
    spec = json.loads((results / "raw" / f"{spec_id}.spec.json").read_text())
    model = spec["config"]["model"]
    loads = []
    for name in names:
        srv = start_server(threads=1)
        ctx = repredict._context(spec, results, srv.device_name)
        llm, placement = load(name, model, list(ctx.weight_bytes), srv)
        pred = predicted_splits(ctx, placement)
        loads.append(prepared(name, llm, srv, pred))
    measure(loads, rounds)
    print(f"\n{rounds} rounds, medians (ms); load average {os.getloadavg()}")
    for L in loads:
        meas = [statistics.median(v) for v in L["per"]]
        pred = [us / 1e3 for _, _, us in L["pred"]]
        print(
            f"\n{L['label']}: pass timed at its splits {statistics.median(L['T']):.2f} (spread "
            f"{min(L['T']):.2f}-{max(L['T']):.2f}), untimed {statistics.median(L['U']):.2f}; predicted graph "
            f"{sum(pred):.2f}"
        )
        by: dict[str, list[float]] = {}
        print("| split | device | gap before | measured | predicted | ratio |\n|---|---|---|---|---|---|")
        for k, m in enumerate(meas):
            gap = meas[k - 1] if k else float("nan")
            p = pred[k] if k < len(pred) else float("nan")
            print(f"| {k} | {L['nodes'][k]} | {gap:.3f} | {m:.3f} | {p:.3f} | {m / p:.3f} |")
            by.setdefault(L["nodes"][k], [0.0, 0.0])
            by[L["nodes"][k]][0] += m
            by[L["nodes"][k]][1] += p if p == p else 0.0
        print(
            "per device, measured / predicted in sum: "
            + ", ".join(f"{d} {m:.2f} / {p:.2f} = {m / p:.3f}" for d, (m, p) in by.items())
        )
    close(loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
