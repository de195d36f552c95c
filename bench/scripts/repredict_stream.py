#!/usr/bin/env python3
"""Re-predict committed bench results with one term replaced: the rate streamed host weights
move at, taken from the configurations of one strategy (by default `flexgen`, which streams
every weight in every pass: what calibration method 8's streamed load times) and applied to the
others, whose measurements stay out of the fit. For results measured before that load existed
(an H100 run whose profile timed the h2d link on a fresh pinned buffer at 54 GB/s).

Per configuration and pass, from the committed plan's breakdown: the streamed weights' bytes
(host weights whose matmul runs on the accelerator in that pass: every host weight at a pass of
op-offload size when the plan sets no per-weight threshold, else those whose threshold the pass
reaches), their old transfer time at the profiled link's bandwidth, and the new one at the
fitted rate; the per-copy latency stays. Prints a Markdown report (errors before / after).

    python bench/scripts/repredict_stream.py bench/results/<dir> [--from-strategy flexgen]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from oallama.model import gguf_file
from repredict_table import METRICS, ErrorTable, metrics

OFFLOAD_MIN_BATCH = 32  # ggml-cuda's default: a host weight's op moves to the GPU from this batch


def _configs(d: Path) -> list[dict[str, Any]]:
    out = []
    for spec_file in sorted(d.glob("raw/*.spec.json")):
        spec = json.loads(spec_file.read_text())
        res = d / "raw" / f"{spec['id']}.json"
        plan_file = d / "raw" / f"{spec['id']}.plan.json"
        if not res.exists() or not plan_file.exists():
            continue
        r = json.loads(res.read_text())
        if r.get("status") != "ok":
            continue
        meas = {k: statistics.median(v) for k, v in r["samples"].items()}
        out.append({"spec": spec, "plan": json.loads(plan_file.read_text()), "measured": meas})
    return out


def _streamed_bytes(plan: dict[str, Any], n_tokens: int, sizes: dict[str, int], op_offload: bool) -> int:
    """Bytes of the host weights streamed in a pass of n_tokens (matmul weights: 2-D or more)."""
    acc = plan["accelerator"]
    policy = plan.get("offload_min_batch") or {}
    total = 0
    for w, dev in plan["placement"].items():
        if dev == acc or w.startswith("token_embd") or w not in sizes or w.endswith("norm.weight"):
            continue
        if w in policy:
            streams = policy[w] is not None and n_tokens >= int(policy[w])
        else:
            streams = op_offload and n_tokens >= OFFLOAD_MIN_BATCH
        total += sizes[w] if streams else 0
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--from-strategy", default="flexgen")
    a = ap.parse_args()
    d: Path = a.results
    rows = _configs(d)
    sizes: dict[str, dict[str, int]] = {}
    link: dict[str, float] = {}
    for c in rows:
        m = c["spec"]["config"]["model"]
        local = Path(m) if Path(m).exists() else Path.cwd() / Path(m).relative_to("/work/main")
        if m not in sizes and local.exists():
            sizes[m] = {t.name: t.nbytes for t in gguf_file.read(local).tensors}
        prof = d / "profiles" / f"{c['spec']['profile_key']}.json"
        prof = prof if prof.exists() else next(d.glob("profiles/*.json"))
        link[c["spec"]["profile_key"]] = json.loads(prof.read_text())["links"][c["plan"]["accelerator"]]["h2d"][
            "bytes_per_us"]
    rows = [c for c in rows if c["spec"]["config"]["model"] in sizes]

    def new_passes(c: dict[str, Any], rate: float | None) -> dict[int, float]:
        old_bw = link[c["spec"]["profile_key"]]
        out = {}
        for n, p in c["plan"]["predicted"]["passes"].items():
            b = _streamed_bytes(c["plan"], int(n), sizes[c["spec"]["config"]["model"]],
                                c["spec"]["config"]["op_offload"])
            out[int(n)] = p["total_ms"] - (b / old_bw - (b / rate if rate else b / old_bw)) / 1e3
        return out

    # the rate from the chosen strategy's decode: measured TPOT less everything else predicted
    fits = []
    for c in rows:
        if c["spec"]["config"]["strategy"] != a.from_strategy:
            continue
        p1 = c["plan"]["predicted"]["passes"]["1"]
        b = _streamed_bytes(c["plan"], 1, sizes[c["spec"]["config"]["model"]], c["spec"]["config"]["op_offload"])
        rest = p1["total_ms"] - b / link[c["spec"]["profile_key"]] / 1e3
        if b > 0 and c["measured"]["tpot_ms"] > rest:
            fits.append(b / ((c["measured"]["tpot_ms"] - rest) * 1e3))
    if not fits:
        print(f"no {a.from_strategy} configuration streams weights in {d}")
        return 1
    rate = statistics.median(fits)
    print(f"# Re-prediction with the streamed-weight rate fitted on `{a.from_strategy}` ({d.name})\n")
    print(f"Streamed weights' rate from {len(fits)} `{a.from_strategy}` decode measurement(s): "
          f"{', '.join(f'{x / 1e3:.2f}' for x in fits)} GB/s, median **{rate / 1e3:.2f} GB/s**; the profile's "
          f"h2d link: {statistics.median(link.values()) / 1e3:.1f} GB/s. The other strategies' measurements are "
          f"not used in the fit.\n")
    print("| model | strategy | budget | TTFT ms | old | new | TPOT ms | old | new | e2e ms | old | new |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = ErrorTable()
    for c in sorted(rows, key=lambda c: (c["spec"]["config"]["model_name"], c["spec"]["config"]["budget"],
                                         c["spec"]["config"]["strategy"])):
        cfg = c["spec"]["config"]
        if cfg["strategy"] == a.from_strategy:
            continue
        np_ = new_passes(c, rate)
        gen = cfg["gen"]
        new = metrics(np_, c["plan"]["workload"], gen)
        old = {k: c["plan"]["predicted"][k] for k in METRICS}
        print(f"| {cfg['model_name']} | {cfg['strategy']} | {cfg['budget']} | {table.add(c['measured'], old, new)} |")
    print(table.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
