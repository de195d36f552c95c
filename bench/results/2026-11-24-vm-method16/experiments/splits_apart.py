"""A bench configuration's decode pass taken apart split by split: measured against predicted (ms).

Loads each configuration's plan (its rpc-server replaced by a fresh loopback one, 1 thread), times its
1-token pass after 32 tokens with the scheduler's eval callback stopping at each split's end (as the
calibration times), ROUNDS times alternated across configurations, and prints per split: its device,
nodes, the measured time from the previous split's end to its own (its copies in, hand-over, compute)
and the pass model's cost of the same (compute + other ops + copies in + issue), from the bench's own
profile refitted by this checkout (as bench/scripts/repredict.py). Also each configuration's untimed pass.

    python splits_apart.py ROUNDS RESULTS_DIR CONFIG_ID [CONFIG_ID ...]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "bench" / "scripts"))
import repredict
from oallama import _core
from oallama.planner.cost.calibrate import _split_stops
from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server


def predicted_splits(ctx, placement) -> list[tuple[bool, int, float]]:
    """(on the accelerator, nodes, us) per split of the decode pass model, copies charged to the split
    that reads them."""
    pm = ctx.passes[1]
    dev = pm.assign(placement)
    out: list[list] = []
    seen: set = set()
    for i in pm.order:
        if not out or out[-1][0] != dev[i]:
            out.append([dev[i], 0, pm.launch[int(dev[i])] if out else 0.0])
        out[-1][1] += 1
        if i in pm.t_host:
            out[-1][2] += pm.t_acc[i] if dev[i] else pm.host_us(i, placement)
        for src, _ in pm.reads[i]:
            if pm.source_on_acc(src, dev, placement) != dev[i] and (src, dev[i]) not in seen:
                seen.add((src, dev[i]))
                b = pm.read_bytes[src]
                out[-1][2] += (pm.h2d if dev[i] else pm.d2h).time_us(b)
    return [(d, n, us) for d, n, us in out]


def prepared(
    label: str, llm: Llama, srv: Any, pred: list[tuple[bool, int, float]], **extra: Any
) -> dict[str, Any]:
    """A loaded configuration, its decode pass's split stops found (a 1-token pass after 32 tokens)."""
    toks = prompt_tokens(llm, 64)
    with _core.NodeTimer(llm.native_context) as timer:
        nodes = timed_eval(llm, timer, toks[:32], toks[32:33], []).nodes
    stops = _split_stops(nodes)
    print(f"loaded {label}: {len(stops)} splits measured, {len(pred)} predicted", flush=True)
    return dict(
        extra,
        label=label,
        llm=llm,
        srv=srv,
        toks=toks,
        stops=stops,
        pred=pred,
        nodes=[nodes[s].device[:3] for s in stops],
        per=[[] for _ in stops],
        T=[],
        U=[],
    )


def measure(loads: list[dict[str, Any]], rounds: int) -> None:
    """ROUNDS timed passes per load, alternated across loads: each split's time (ms, from the previous
    split's end, or the pass's first node, to its own end) into `per`, the timed pass into `T`, an untimed
    one into `U`."""
    for r in range(rounds):
        for L in loads if r % 2 == 0 else loads[::-1]:
            llm, toks = L["llm"], L["toks"]
            with _core.NodeTimer(llm.native_context) as timer:
                run = timed_eval(llm, timer, toks[:32], toks[32:33], L["stops"])
            prev = run.nodes[0].start_us
            for k, st in enumerate(L["stops"]):
                L["per"][k].append((run.nodes[st].done_us - prev) / 1e3)
                prev = run.nodes[st].done_us
            L["T"].append(run.wall_us / 1e3)
            L["U"].append(timed_eval(llm, None, toks[:32], toks[32:33], []).wall_us / 1e3)


def close(loads: list[dict[str, Any]]) -> None:
    for L in loads:
        L["llm"].close()
        L["srv"].stop()


def main() -> int:
    rounds, d, ids = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    loads = []
    for cid in ids:
        spec = json.loads((d / "raw" / f"{cid}.spec.json").read_text())
        text = Path(spec["plan_file"]).read_text()
        plan = json.loads(text)
        srv = start_server(threads=1)
        ctx = repredict._context(spec, d, srv.device_name)
        pred = predicted_splits(ctx, repredict._placement(plan))
        p = Path(f"/tmp/splits-apart-{cid}.plan.json")
        p.write_text(text.replace(plan["accelerator"], srv.device_name))
        llm = Llama(
            spec["config"]["model"],
            placement=str(p),
            n_ctx=256,
            n_batch=64,
            n_ubatch=64,
            n_threads=1,
            n_threads_batch=1,
            verbose=False,
            seed=1234,
        )
        label = (
            f"{Path(spec['config']['model']).stem} {spec['config']['strategy']} @{spec['config']['budget']}"
        )
        loads.append(prepared(label, llm, srv, pred, cid=cid))
    measure(loads, rounds)
    print(f"\n{rounds} rounds, medians (ms); load {os.getloadavg()}")
    for L in loads:
        print(
            f"\n{L['label']} ({L['cid']}): pass timed at its splits {statistics.median(L['T']):.2f}, untimed "
            f"{statistics.median(L['U']):.2f}; predicted graph {sum(us for _, _, us in L['pred']) / 1e3:.2f}"
        )
        print(
            "| split | device | nodes (predicted) | measured | predicted | measured - predicted |\n|---|---|---|---|---|---|"
        )
        prev = 0
        for k, st in enumerate(L["stops"]):
            n = st - prev + 1
            prev = st + 1
            m = statistics.median(L["per"][k])
            if k < len(L["pred"]):
                acc, pn, us = L["pred"][k]
                print(
                    f"| {k} | {L['nodes'][k]} | {n} ({pn}, {'acc' if acc else 'host'}) | {m:.3f} | {us / 1e3:.3f} | "
                    f"{m - us / 1e3:+.3f} |"
                )
            else:
                print(f"| {k} | {L['nodes'][k]} | {n} | {m:.3f} | - | - |")
    close(loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
