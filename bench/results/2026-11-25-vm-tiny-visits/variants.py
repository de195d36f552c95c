"""Which placement change makes the tiny model's affinity @75% decode (method 22's 8f9094f35fac07ec)
1.5x slower than predicted, when a plan one weight away (cc666b0c18623806) runs as predicted?
Loads the plan and one-weight variants on one loopback rpc-server each (1 thread), times untimed
1-token passes after 32 tokens (realpass.timed_eval, as the calibration), ROUNDS rounds alternated.

    python variants.py ROUNDS [PIN]

PIN: none (default: the kernel places both), same (client and every rpc-server on CPU 0), split
(client on CPU 0, rpc-servers on CPU 1).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from oallama.planner.cost.realpass import timed_eval
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama
from oallama.runtime.rpc import start_server

RAW = Path(__file__).resolve().parents[1] / "2026-11-24-vm-method22" / "raw"
MODEL = "build/bench-models/tiny-q8_0.gguf"


def variants() -> dict[str, dict[str, bool]]:
    """label -> weight -> on the rpc-server"""
    plan = json.loads((RAW / "8f9094f35fac07ec.plan.json").read_text())
    base = {w: d != "CPU" for w, d in plan["placement"].items()}
    out = {"8f9094 (as planned)": base}
    out["blk.1.ffn_up on rpc"] = {**base, "blk.1.ffn_up.weight": True}
    out["blk.3.ffn_down on CPU (= cc666b)"] = {**base, "blk.3.ffn_down.weight": False}
    out["both"] = {**base, "blk.1.ffn_up.weight": True, "blk.3.ffn_down.weight": False}
    out["output on CPU"] = {**base, "output.weight": False}
    out["plan file 8f9094"] = {}  # loaded from the plan file itself (its settings too), as the bench does
    out["plan file cc666b"] = {}
    return out


def main() -> int:
    rounds = int(sys.argv[1])
    pin = sys.argv[2] if len(sys.argv) > 2 else "none"
    if pin != "none":
        os.sched_setaffinity(0, {0})
    loads = []
    for label, on in variants().items():
        srv = start_server(threads=1)
        if pin != "none":
            for tid in os.listdir(f"/proc/{srv.pid}/task"):  # every thread of the server
                os.sched_setaffinity(int(tid), {0} if pin == "same" else {1})
        common = dict(
            n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, verbose=False, seed=1234
        )
        if label.startswith("plan file"):
            text = next(RAW.glob(f"{label.split()[-1]}*.plan.json")).read_text()
            path = Path(f"/tmp/variants-{label.split()[-1]}.plan.json")
            path.write_text(text.replace(json.loads(text)["accelerator"], srv.device_name))
            llm = Llama(MODEL, placement=str(path), **common)
        else:
            llm = Llama(
                MODEL,
                devices=[srv.device_name],
                placement={w: srv.device_name for w, r in on.items() if r},
                **common,
            )
        loads.append({"label": label, "llm": llm, "srv": srv, "toks": prompt_tokens(llm, 64), "U": []})
    for r in range(rounds):
        for L in loads if r % 2 == 0 else loads[::-1]:
            for _ in range(3):
                L["U"].append(timed_eval(L["llm"], None, L["toks"][:32], L["toks"][32:33], []).wall_us / 1e3)
    print(f"{rounds} rounds x 3 passes, ms, pinned: {pin}; load average {os.getloadavg()}")
    print("| placement | decode pass median | p10 | p90 |\n|---|---|---|---|")
    for L in loads:
        u = sorted(L["U"])
        print(
            f"| {L['label']} | {statistics.median(u):.3f} | {u[len(u) // 10]:.3f} | {u[len(u) * 9 // 10]:.3f} |"
        )
        L["llm"].close()
        L["srv"].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
