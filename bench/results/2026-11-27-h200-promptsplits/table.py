#!/usr/bin/env python3
"""The two promptsplits runs side by side: per placement of a 512-token prompt pass, its wall time
and prediction, and the terms this set is about (the host's KV writes, the token embedding's lookup,
the streamed weights' copies), predicted beside measured node by node.

    python bench/results/2026-11-27-h200-promptsplits/table.py > table.txt
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(run: str) -> list[str]:
    d = json.loads((HERE / run / "promptsplits.json").read_text())
    out = [f"## {run}: commit {d['commit'][:7]} (code: see README), machine {d['machine']}, {d['threads']} threads, "
           f"load average {d['load_avg_start']:.1f} at the start",
           "",
           "| model | placement | wall ms | predicted ms | error | SET_ROWS (host) pred / meas ms | GET_ROWS (host) "
           "pred / meas ms | streamed + copies pred ms / accelerator's gaps meas ms |",
           "|---|---|---|---|---|---|---|---|"]
    for m, e in d["models"].items():
        for label, p in e["placements"].items():
            pn, mn = p["predicted_nodes"]["by_op"], p["node_mode"]["by_op"]
            pr = p["predicted"]
            err = pr["total_ms"] / (p["wall_us"] / 1e3) - 1
            acc_gap = sum(v for k, v in p["node_mode"]["gaps_us"].items() if k != "CPU")
            out.append(f"| {m} | {label} | {p['wall_us'] / 1e3:.1f} | {pr['total_ms']:.1f} | {err:+.1%} | "
                       f"{pn.get('CPU:SET_ROWS', 0) / 1e3:.1f} / {mn.get('CPU:SET_ROWS', 0) / 1e3:.1f} | "
                       f"{pn.get('CPU:GET_ROWS', 0) / 1e3:.2f} / {mn.get('CPU:GET_ROWS', 0) / 1e3:.2f} | "
                       f"{pr['copy_ms']:.1f} / {acc_gap / 1e3:.1f} |")
    return [*out, ""]


def main() -> int:
    print("\n".join(rows("before") + rows("after")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
