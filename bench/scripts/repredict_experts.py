#!/usr/bin/env python3
"""Re-predict a committed calibrated bench run with one term corrected: the bytes a streamed
expert tensor moves. ggml's scheduler copies only the experts a pass's tokens were routed to
(ggml_backend_sched_compute_splits); the planner charged whole tensors until
`schedmodel.expert_fraction`. Two places change, both in the committed breakdowns' own terms:

- the calibrated stream link: calibration method 8 timed a decode pass with every host weight
  streamed, and the plan turned that wall time into a rate over the *whole* tensors' bytes; at
  one token only n_used / n_expert of each expert tensor moved, so the same time spread over the
  bytes that moved gives a slower rate (dense models: unchanged);
- each pass's streamed bytes: dense weights whole, expert tensors at their routed share
  (1 - (1 - n_used/n_expert)^n_tokens).

new stream_ms = old stream_ms * (moved / whole bytes of the pass) * (whole / moved bytes of the
calibration pass); the per-copy latency is not separated (a few us per weight). No measurement of
the run enters the correction. Needs the runs' GGUFs (a `--shape-only` synth has the same sizes).

    python bench/scripts/repredict_experts.py bench/results/<dir> [--models-dir build/bench-models]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from oallama.model import gguf_file
from oallama.planner.cost.schedmodel import expert_fraction
from repredict_table import METRICS, ErrorTable, metrics

OFFLOAD_MIN_BATCH = 32  # ggml-cuda's default: a host weight's op moves to the GPU from this batch


_SHAPES: dict[str, tuple[int, ...]] = {}  # tensor -> its dimensions above 1 (a matmul weight has two or more)


def _streamed(plan: dict[str, Any], n_tokens: int, sizes: dict[str, int], op_offload: bool) -> list[str]:
    """Host matmul weights streamed in a pass of n_tokens (as the plan's policy sets them)."""
    acc, policy, out = plan["accelerator"], plan.get("offload_min_batch") or {}, []
    for w in sizes:
        if plan["placement"].get(w) == acc or len(_SHAPES[w]) < 2 or (w.startswith("token_embd")
                                                                         and "output.weight" in sizes):
            continue
        if w in policy:
            streams = policy[w] is not None and n_tokens >= int(policy[w])
        else:
            streams = op_offload and n_tokens >= OFFLOAD_MIN_BATCH
        if streams:
            out.append(w)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--models-dir", type=Path, default=Path("build/bench-models"))
    a = ap.parse_args()
    d: Path = a.results
    print(f"# Re-prediction with streamed expert tensors at their routed share ({d.name})\n")
    rows = []
    for spec_file in sorted(d.glob("raw/*.spec.json")):
        spec = json.loads(spec_file.read_text())
        res, plan_file = d / "raw" / f"{spec['id']}.json", d / "raw" / f"{spec['id']}.plan.json"
        if res.exists() and plan_file.exists() and json.loads(res.read_text()).get("status") == "ok":
            meas = {k: statistics.median(v) for k, v in json.loads(res.read_text())["samples"].items()}
            rows.append((spec, json.loads(plan_file.read_text()), meas))
    models: dict[str, tuple[dict[str, int], int, int]] = {}  # name -> (sizes, n_expert, n_used)
    for spec, _, _ in rows:
        name = spec["config"]["model_name"]
        if name in models:
            continue
        info = gguf_file.read(a.models_dir / f"{name}.gguf")
        for t in info.tensors:
            _SHAPES[t.name] = tuple(x for x in t.shape if x > 1) or (1,)
        models[name] = ({t.name: t.nbytes for t in info.tensors}, int(info.hparam("expert_count", 0) or 0),
                        int(info.hparam("expert_used_count", 0) or 0))

    def moved(name: str, ws: list[str], n: int) -> tuple[int, float]:
        sizes, n_expert, n_used = models[name]
        whole = sum(sizes[w] for w in ws)
        return whole, sum(sizes[w] * (expert_fraction(n_expert, n_used, n) if "_exps." in w else 1.0) for w in ws)

    # the calibration pass: every host matmul weight streamed at one token (its bytes, as recorded)
    cal: dict[str, float] = {}
    for spec, _, _ in rows:
        name = spec["config"]["model_name"]
        if name in cal:
            continue
        prof = json.loads((d / "profiles" / f"{spec['profile_key']}.json").read_text())
        st = next(iter((prof.get("calibration") or {}).get("stream", {}).values()), None)
        sizes = models[name][0]
        tied = "output.weight" not in sizes  # the output matmul reads token_embd
        ws = [w for w in sizes if (tied or not w.startswith("token_embd")) and len(_SHAPES[w]) >= 2]
        whole, mv = moved(name, ws, 1)
        if st and abs(whole - st["weight_bytes"]) > 0.01 * whole:
            print(f"note: {name}: the calibration streamed {st['weight_bytes']} bytes, these weights are {whole}")
        cal[name] = whole / mv
    print("| model | experts (used / all) | calibration pass: whole / moved bytes |")
    print("|---|---|---|")
    for name, (_, e, k) in sorted(models.items()):
        print(f"| {name} | {k} / {e} | {cal[name]:.2f} |")
    table = ErrorTable()
    print("\n| model | strategy | budget | prompt | TTFT ms | old | new | TPOT ms | old | new | e2e ms | old | new |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec, plan, meas in sorted(rows, key=lambda r: (r[0]["config"]["model_name"], r[0]["config"]["prompt"],
                                                        r[0]["config"]["budget"], r[0]["config"]["strategy"])):
        cfg, name = spec["config"], spec["config"]["model_name"]
        passes = {}
        for n, p in plan["predicted"]["passes"].items():
            whole, mv = moved(name, _streamed(plan, int(n), models[name][0], cfg["op_offload"]), int(n))
            new_stream = p["stream_ms"] * (mv / whole) * cal[name] if whole else p["stream_ms"]
            passes[int(n)] = p["total_ms"] - p["stream_ms"] + new_stream
        new = metrics(passes, plan["workload"], cfg["gen"])
        old = {k: plan["predicted"][k] for k in METRICS}
        print(f"| {name} | {cfg['strategy']} | {cfg['budget']} | {cfg['prompt']} | {table.add(meas, old, new)} |")
    print(table.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
