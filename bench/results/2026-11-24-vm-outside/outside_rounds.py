"""Which round's time outside the graph does a calibration keep? Each calibration's rounds, as
measured: per round, every pass's time outside its graph (host load, sampling included) and its
host splits' total, then what method 18 kept (the outside of the round whose splits ran fastest)
and method 19 keeps (the least over the rounds), and the decode value each gives; what a detached
load saves as measured in its round and as kept (moved onto the kept outside times) (us).

The one-op profile is a committed one (its calibration is replaced), so only the calibration runs:

    python outside_rounds.py PROFILE.json MODEL.gguf N [--no-op-offload]
"""

from __future__ import annotations

import os
import statistics
import sys
from collections import defaultdict

from oallama.planner.cost import calibrate as cal_mod
from oallama.planner.cost.profile import Profile
from oallama.runtime.rpc import start_server


def main() -> int:
    prof_path, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    op_offload = "--no-op-offload" not in sys.argv
    captured: list[list[cal_mod.Round]] = []
    real_merge = cal_mod.merge_rounds

    def recording(rounds, *a, **kw):  # the calibration's own rounds, before its merge
        captured.append(list(rounds))
        return real_merge(rounds, *a, **kw)

    cal_mod.merge_rounds = recording
    print(f"{model} op_offload={op_offload}; load average {os.getloadavg()}")
    for k in range(n):
        srv = start_server(threads=1)
        try:
            prof = Profile.load(prof_path).renamed(["CPU", srv.device_name])
            cal = cal_mod.calibrate(
                model, ["CPU", srv.device_name], prof, threads=1, op_offload=op_offload, progress=False
            )
        finally:
            srv.stop()
        rounds = captured[-1]
        print(
            f"\ncalibration {k + 1}: {len(rounds)} rounds in {cal.elapsed_s:.1f} s; load average {os.getloadavg()}"
        )
        keys = sorted({key for r in rounds for key in r.outside})
        print(
            "| round | "
            + " | ".join(f"outside {a},{b}" for a, b in keys)
            + " | host splits 1,32 | detached a |"
        )
        print("|---" * (len(keys) + 3) + "|")
        for i, r in enumerate(rounds):
            host = defaultdict(float)
            for s in r.splits:
                if s.get("load") == "host":
                    host[(int(s["n_tokens"]), int(s["n_past"]))] += float(s["split_us"])
            det = next(iter(r.detached.values()), [float("nan")])[0]
            print(
                f"| {i + 1} | "
                + " | ".join(f"{r.outside.get(key, float('nan')):.0f}" for key in keys)
                + f" | {host.get((1, 32), float('nan')):.0f} | {det:.0f} |"
            )
        fastest = {
            key: min(
                (i for i, r in enumerate(rounds) if key in r.outside),
                key=lambda i: sum(
                    float(s["split_us"])
                    for s in rounds[i].splits
                    if s.get("load") == "host" and (int(s["n_tokens"]), int(s["n_past"])) == key
                ),
            )
            for key in keys
        }
        r0 = min((r for r in rounds if r.detached), key=lambda r: sum(r.outside.values()))
        m18 = statistics.median(rounds[fastest[key]].outside[key] for key in keys if key[0] == 1)
        print(
            f"decode outside: method 18 {m18:.0f} us, method 19 {cal.decode_us:.0f} us; "
            f"detached, as measured in its round {dict(r0.detached)}, as kept {cal.detached}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
