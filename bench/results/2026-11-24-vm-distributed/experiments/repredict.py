#!/usr/bin/env python3
"""Re-predict a distributed result directory's runs with this checkout's model, from the block
times, devices and plans it committed (no device needed):
    python repredict.py DIR [--tcp-iw N] [--loss-rtts X]
Prints measured vs predicted TTFT / TPOT per run and the |error| medians / p90."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from oallama import cluster as D
from oallama.cluster.problem import BlockTimes


def times_from_json(doc: dict) -> BlockTimes:
    ints = lambda m: {int(k): v for k, v in m.items()}  # noqa: E731
    return BlockTimes(
        doc["threads"],
        {int(k): tuple(v) for k, v in doc["block_us"].items()},
        ints(doc["rest_us"]),
        ints(doc["matmul_flops"]),
        n_past=doc["n_past"],
        rpc_block_us=ints(doc["rpc_block_us"]),
        visit_bytes_up=ints(doc["visit_bytes_up"]),
        visit_bytes_down=ints(doc["visit_bytes_down"]),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--tcp-iw", type=int, default=None)
    ap.add_argument("--loss-rtts", type=float, default=None)
    ap.add_argument("--model", default=str(Path.home() / ".cache/oallama/bench-distributed/mid-q8_0.gguf"))
    a = ap.parse_args()
    errs: dict[str, list[float]] = {"ttft": [], "tpot": []}
    for f in sorted(a.dir.glob("result-*.json")):
        res = json.loads(f.read_text())
        wl = res["workload"]
        cost = replace(
            D.model_cost(a.model, (1, wl["n_prompt"]), n_ctx=wl["n_ctx"]),
            times=times_from_json(res["block_times"]),
        )
        cluster = D.read_devices(a.dir / res["devices_file"])
        opts = D.DistOptions(n_prompt=wl["n_prompt"], n_gen=wl["n_gen"], n_ctx=wl["n_ctx"])
        if a.tcp_iw is not None:
            opts = replace(opts, tcp_initial_window=a.tcp_iw)
        if a.loss_rtts is not None:
            opts = replace(opts, loss_recovery_rtts=a.loss_rtts)
        names = [d.name for d in cluster.devices]
        for run in res["results"]:
            assign = []
            for s in run["segments"]:
                assign += [names.index(s["device"])] * (s["last"] - s["first"] + 1)
            p = D.predict(cost, cluster, assign, opts)
            e1 = (p.ttft_s - run["measured_ttft_s"]) / run["measured_ttft_s"] * 100
            e2 = (p.tpot_s - run["measured_tpot_s"]) / run["measured_tpot_s"] * 100
            errs["ttft"].append(abs(e1))
            errs["tpot"].append(abs(e2))
            st = p.stages["prefill"]
            print(
                f"{res['label']:18s} {run['strategy']:7s} TTFT {run['measured_ttft_s'] * 1e3:6.1f} pred "
                f"{p.ttft_s * 1e3:6.1f} ({e1:+5.1f}%; committed {run['predicted_ttft_s'] * 1e3:6.1f}) "
                f"[compute {st['compute_s'] * 1e3:.1f} transfer {st['transfer_s'] * 1e3:.1f}]  "
                f"TPOT {run['measured_tpot_s'] * 1e3:6.2f} pred {p.tpot_s * 1e3:6.2f} ({e2:+5.1f}%)"
            )
    for k, v in errs.items():
        print(
            f"{k}: |error| median {statistics.median(v):.1f}% p90 {np.percentile(v, 90):.1f}% max {max(v):.1f}%"
        )


if __name__ == "__main__":
    main()
