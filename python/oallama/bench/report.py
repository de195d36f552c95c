"""Aggregate `oallama bench` results: records (JSON + CSV, one schema), a Markdown summary, PNG
plots mirroring the paper's figures (the catalogue of every result set is catalogue.py's).

Record schema "oallama.bench/1": one flat record per (configuration, metric); `COLUMNS` lists
the fields, in CSV order. Times are medians over the timed repetitions (warm-up discarded) with
their sample standard deviation; `predicted` is the planner's prediction where it has one
(ttft_ms, tpot_ms, e2e_ms, tokens_per_s); `source` says where a memory figure comes from. The last
columns came later (older results lack them and still read): `profile_key` (the profile the plan was
costed with, saved as profiles/<profile_key>.json), the 1-minute load average at the start and end
of the configuration, `placement_key` (`accuracy.placement_key` of its plan file), and for a run of
several rounds (`oallama bench --rounds N`) `rounds` and `round_spread`: a configuration measured in
several rounds reports its median round's samples (by median e2e; of an even number, the slower of
the middle two), the machine's typical speed (the project's VM runs 1.4x slower for seconds to
minutes at a time: the fastest of 3 rounds of a 2-layer 8B cut ran 24% faster than predicted where
the median round was within 7%), and the spread of its rounds' e2e medians (slowest / fastest - 1);
rounds.csv lists every round (every raw result stays under raw/). `confirm_s`: the seconds
`optimal`'s confirmation by measurement took before its run (planner.confirm; its plan is the one
that confirmation kept).

Beside them: predicted.json (config_id -> the plan's whole prediction, per-pass breakdown
included) and predicted_passes.csv (the same passes as flat rows); `accuracy` computes the
prediction error, measured winners and noise checks that summary.md reports.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import accuracy
from .accuracy import STRATEGY_ORDER

SCHEMA = "oallama.bench/1"
COLUMNS = [
    "schema", "config_id", "timestamp", "machine", "cpu", "cpu_detail", "cpu_count", "host_memory_bytes", "os",
    "oallama_version", "build_commit",
    "build_patches", "cuda_build", "device", "device_kind", "device_description", "model", "model_identity",
    "model_architecture", "model_n_layer", "model_weight_bytes", "strategy", "series", "plan_from", "op_offload",
    "budget", "budget_bytes", "budget_share", "fits_budget", "acc_weight_bytes", "acc_weight_share",
    "n_gpu_layers", "kv_layers", "streamed_weights", "prompt", "gen", "threads", "n_ctx", "n_batch", "n_ubatch",
    "flash_attn", "mmap", "reps", "warmup", "metric", "unit", "median", "stddev", "min", "max", "n", "predicted",
    "source", "profile_key", "load_avg_start", "load_avg_end", "host_speed", "acc_speed", "placement_key", "rounds",
    "round_spread", "confirm_s",
]
# metric -> (unit, description)
METRICS = {
    "ttft_ms": ("ms", "time to first token: prompt evaluation through the first sampled token"),
    "tpot_ms": ("ms", "mean time per generated token after the first"),
    "e2e_ms": ("ms", "end to end: prompt in -> last of `gen` tokens out"),
    "tokens_per_s": ("tok/s", "generated tokens / end-to-end time"),
    "prefill_tokens_per_s": ("tok/s", "prompt tokens / TTFT"),
    "decode_tokens_per_s": ("tok/s", "1 / TPOT"),
    "load_s": ("s", "model load in the worker (fresh process)"),
    "host_peak_bytes": ("bytes", "peak host memory of the worker"),
    "device_peak_bytes": ("bytes", "peak accelerator memory of the load"),
    "device_planned_bytes": ("bytes", "accelerator memory of the load by llama.cpp's accounting"),
}
STRATEGY_COLORS = {"layers": "C0", "fit": "C1", "flexgen": "C2", "affinity": "C3", "optimal": "C4"}
PLOTS = {"e2e": "e2e_per_model.png", "ttft": "ttft_vs_prompt.png", "tpot": "tpot_vs_gen.png",
         "share": "time_vs_share.png"}
ROUND_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")  # per round in rounds.csv


def _stats(xs: Sequence[float]) -> dict[str, float | int]:
    return {"median": statistics.median(xs), "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "n": len(xs)}


def records_from_raw(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of one finished configuration (raw/<id>.json)."""
    c, st, meta, plan, mem = raw["config"], raw["config"]["settings"], raw["meta"], raw["plan"], raw["memory"]
    wbytes = int(plan["model_weight_bytes"])
    base = {
        "schema": SCHEMA, "config_id": raw["id"], "timestamp": raw.get("finished"),
        **{k: meta.get(k) for k in ("machine", "cpu", "cpu_detail", "cpu_count", "host_memory_bytes", "os",
                                    "oallama_version", "build_commit",
                                    "build_patches", "cuda_build", "device", "device_kind", "device_description")},
        "model": c["model_name"], "model_identity": c["model_identity"][:16],
        "model_architecture": plan.get("model_architecture"), "model_n_layer": plan.get("model_n_layer"),
        "model_weight_bytes": wbytes, "strategy": c["strategy"], "series": c["series"], "plan_from": plan["from"],
        "op_offload": c["op_offload"], "budget": c["budget"], "budget_bytes": plan["budget_bytes"],
        "budget_share": plan["budget_bytes"] / wbytes if wbytes else None,
        "fits_budget": plan["memory"]["total"] <= plan["budget_bytes"],
        "acc_weight_bytes": raw["placement"]["acc_weight_bytes"],
        "acc_weight_share": raw["placement"]["acc_weight_bytes"] / wbytes if wbytes else None,
        "n_gpu_layers": plan["n_gpu_layers"], "kv_layers": plan["kv_layers"],
        "streamed_weights": plan["streamed_weights"], "prompt": c["prompt"], "gen": c["gen"],
        "threads": st["threads"], "n_ctx": c["n_ctx"], "n_batch": st["n_batch"], "n_ubatch": st["n_ubatch"],
        "flash_attn": st["flash_attn"], "mmap": st["mmap"], "reps": st["reps"], "warmup": st["warmup"],
        **{k: raw.get(k) for k in ("profile_key", "load_avg_start", "load_avg_end")},
        "host_speed": _speed(raw, "host"), "acc_speed": _speed(raw, "accelerator"),
        "placement_key": raw.get("placement_key"),
        "rounds": raw.get("rounds", 1), "round_spread": _spread(raw.get("round_e2e_ms") or []),
        "confirm_s": plan.get("confirm_s"),  # optimal's confirmation by measurement, before its run (s)
    }
    s = raw["samples"]
    pred = plan["predicted"]
    gen, prompt = c["gen"], c["prompt"]
    series: dict[str, tuple[list[float], float | None, str | None]] = {
        "ttft_ms": (s["ttft_ms"], pred["ttft_ms"], None),
        "tpot_ms": (s["tpot_ms"], pred["tpot_ms"], None),
        "e2e_ms": (s["e2e_ms"], pred["e2e_ms"], None),
        "tokens_per_s": ([gen / (x / 1e3) for x in s["e2e_ms"] if x > 0],
                         gen / (pred["e2e_ms"] / 1e3) if pred["e2e_ms"] > 0 else None, None),
        "prefill_tokens_per_s": ([prompt / (x / 1e3) for x in s["ttft_ms"] if x > 0],
                                 prompt / (pred["ttft_ms"] / 1e3) if pred["ttft_ms"] > 0 else None, None),
        "decode_tokens_per_s": ([1e3 / x for x in s["tpot_ms"] if x > 0],
                                1e3 / pred["tpot_ms"] if pred["tpot_ms"] > 0 else None, None),
        "load_s": ([raw["load_s"]], None, None),
        "host_peak_bytes": ([mem["host_peak_bytes"]], None, "worker max RSS (getrusage), model mmap included"),
        "device_planned_bytes": ([mem["device_planned_bytes"]], None,
                                 "llama.cpp accounting of the load: weights + KV cache + compute buffers"),
    }
    if mem.get("device_peak_bytes") is not None:
        series["device_peak_bytes"] = ([mem["device_peak_bytes"]], None, mem["device_source"])
    out = []
    for metric, (xs, p, source) in series.items():
        if not xs:
            continue
        out.append({**base, "metric": metric, "unit": METRICS[metric][0], **_stats(xs), "predicted": p,
                    "source": source})
    return out


def _speed(raw: dict[str, Any], role: str) -> float | None:
    """The reference ops' speed on the host or the accelerator (`role`) around the worker's timed
    runs against their speed when the plan's profile was measured (> 1: faster than when
    profiled); None when not recorded (a run from before the host's alone was: a number)."""
    v = (raw.get("host_speed") or {}).get("vs_profile")
    if isinstance(v, (int, float)):
        v = {"host": v}
    got = (v or {}).get(role)
    return float(got) if got is not None else None


def _spread(medians: Sequence[float]) -> float | None:
    """Slowest / fastest - 1 of a configuration's rounds (None for one round)."""
    return max(medians) / min(medians) - 1.0 if len(medians) > 1 and min(medians) > 0 else None


def median_round(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's finished rounds -> the raw result its records report: the round whose
    median e2e is the rounds' median (the slower middle one of an even number), with `rounds`,
    every round's median e2e (`round_e2e_ms`, by round) and its medians (`round_medians`, each
    with its own plan's prediction and profile: `--reprofile` costs every round anew)."""
    if len(docs) == 1:
        return docs[0]
    by_round = sorted(docs, key=lambda d: int(d.get("round", 1)))
    medians = [statistics.median(d["samples"]["e2e_ms"]) for d in by_round]
    best = by_round[sorted(range(len(medians)), key=lambda i: medians[i])[len(medians) // 2]]
    every = [{"round": int(d.get("round", 1)), **{m: statistics.median(d["samples"][m]) if d["samples"][m] else None
                                                   for m in ROUND_METRICS}, "load_avg_start": d.get("load_avg_start"),
              "finished": d.get("finished"), "profile_key": d.get("profile_key"), "host_speed": _speed(d, "host"),
              "acc_speed": _speed(d, "accelerator"),
              **{f"predicted_{m}": ((d.get("plan") or {}).get("predicted") or {}).get(m) for m in ROUND_METRICS}}
             for d in by_round]
    return {**best, "rounds": len(docs), "round_e2e_ms": medians, "round_medians": every}


def load_raw(out_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(finished raw results, failures) under out_dir/raw; a configuration measured in several
    rounds is one result (`median_round`)."""
    ok: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    raw_dir = out_dir / "raw"
    if not raw_dir.is_dir():
        return ok, failed
    rounds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in sorted(raw_dir.glob("*.json")):
        if p.name.endswith((".spec.json", ".plan.json")):
            continue
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if doc.get("status") == "ok":
            rounds[doc["id"]].append(doc)
        elif doc.get("status") == "failed":
            failed.append(doc)
    ok = [median_round(docs) for docs in rounds.values()]
    # a configuration with a finished round is no failure (one round of several failed, or an earlier run)
    return ok, list({d["id"]: d for d in failed if d["id"] not in rounds}.values())


def _order_key(r: dict[str, Any]) -> tuple:
    strat = STRATEGY_ORDER.index(r["strategy"]) if r["strategy"] in STRATEGY_ORDER else 99
    return (r["model"], r["prompt"], r["gen"], r["budget_bytes"], not r["op_offload"], strat, r["metric"])


def _plan_file(raw: dict[str, Any], raw_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((raw_dir / f"{raw['id']}.plan.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _completed(raw: dict[str, Any], raw_dir: Path) -> dict[str, Any]:
    """A raw result with the keys older runs did not record (placement_key, profile_key, the
    per-pass prediction) filled in from its plan file where that is still in raw/."""
    if raw.get("placement_key") and raw.get("profile_key") and "passes" in raw["plan"]["predicted"]:
        return raw
    plan = _plan_file(raw, raw_dir)
    if not plan:
        return raw
    out = {**raw, "placement_key": raw.get("placement_key") or accuracy.placement_key(plan),
           "profile_key": raw.get("profile_key") or (str(plan.get("profile") or "")[:16] or None)}
    if "passes" not in raw["plan"]["predicted"] and "passes" in (plan.get("predicted") or {}):
        out["plan"] = {**raw["plan"], "predicted": plan["predicted"]}
    return out


def write_predicted(out_dir: Path, ok: Sequence[dict[str, Any]]) -> dict[str, Path]:
    """predicted.json (config_id -> the plan's whole prediction) and predicted_passes.csv."""
    predicted = {raw["id"]: raw["plan"]["predicted"] for raw in sorted(ok, key=lambda r: r["id"])}
    out = {"predicted": out_dir / "predicted.json", "predicted_passes": out_dir / "predicted_passes.csv"}
    out["predicted"].write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in predicted.items())
                                + "\n}\n")
    columns, rows = accuracy.predicted_passes(predicted, {raw["id"]: raw["config"] for raw in ok})
    with out["predicted_passes"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row[k]) for k in columns})
    return out


def write_outputs(out_dir: Path, *, plots: bool = True) -> dict[str, Path]:
    """results.json, results.csv, predicted.json, predicted_passes.csv, summary.md and the
    plots, from out_dir/raw."""
    ok, failed = load_raw(out_dir)
    ok = [_completed(raw, out_dir / "raw") for raw in ok]
    records = sorted((r for raw in ok for r in records_from_raw(raw)), key=_order_key)
    out: dict[str, Path] = {}
    out["json"] = out_dir / "results.json"
    # one record per line: valid JSON, compact, and diffs line by line
    out["json"].write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + ("\n]\n" if records else "]\n"))
    out["csv"] = out_dir / "results.csv"
    with out["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in records:
            w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    out.update(write_predicted(out_dir, ok))
    if any(raw.get("rounds", 1) > 1 for raw in ok):
        out["rounds"] = write_rounds(out_dir / "rounds.csv", ok)
    out["md"] = out_dir / "summary.md"
    out["md"].write_text(summary_markdown(records, failed, out_dir.name))
    if plots and records:
        out.update(make_plots(records, out_dir))
    return out


def write_rounds(path: Path, ok: Sequence[dict[str, Any]]) -> Path:
    """rounds.csv: every round of every configuration measured in several (`--rounds`): its
    medians, its own plan's prediction and profile, and whether the records report it (`kept`:
    the median round by e2e)."""
    cols = ["config_id", "model", "strategy", "op_offload", "budget", "prompt", "gen", "round", "kept",
            *ROUND_METRICS, *(f"predicted_{m}" for m in ROUND_METRICS), "profile_key", "load_avg_start", "host_speed",
            "acc_speed", "finished"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for raw in sorted(ok, key=lambda r: r["id"]):
            c = raw["config"]
            for rd in raw.get("round_medians") or []:
                row = {"config_id": raw["id"], "model": c["model_name"], "strategy": c["strategy"],
                       "op_offload": c["op_offload"], "budget": c["budget"], "prompt": c["prompt"], "gen": c["gen"],
                       **rd, "kept": rd["round"] == int(raw.get("round", 1))}
                w.writerow({k: ("" if row.get(k) is None else row[k]) for k in cols})
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a results.json (or results.csv), checked against the schema."""
    if path.suffix == ".csv":
        with path.open() as f:
            rows = list(csv.DictReader(f))
        return [_typed(r) for r in rows]
    doc = json.loads(path.read_text())
    if not isinstance(doc, list) or any(r.get("schema") != SCHEMA for r in doc):
        raise ValueError(f"{path}: not a list of {SCHEMA} records")
    return doc


def _typed(row: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v == "":
            out[k] = None
        elif v in ("True", "False"):
            out[k] = v == "True"
        else:
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out


# --- Markdown ----------------------------------------------------------------------------------


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def _ms(m: dict[str, Any] | None, digits: int = 1) -> str:
    if m is None:
        return "-"
    return f"{m['median']:.{digits}f} ± {m['stddev']:.{digits}f}"


def _pred(m: dict[str, Any] | None, digits: int = 1) -> str:
    return "-" if m is None or m.get("predicted") is None else f"{m['predicted']:.{digits}f}"


def by_config(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """config_id -> metric -> record."""
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        out[r["config_id"]][r["metric"]] = r
    return out


def anchor_of(records: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The workload of the end-to-end figure: prompt 64 / gen 32 (the paper's) when measured,
    else the most common gen and, at it, the prompt closest to 64."""
    pairs = {(r["prompt"], r["gen"]) for r in records}
    if not pairs:
        return None
    if (64, 32) in pairs:
        return (64, 32)
    gens = defaultdict(int)
    for _, g in pairs:
        gens[g] += 1
    gen = min(gens, key=lambda g: (-gens[g], g))
    prompt = min((p for p, g in pairs if g == gen), key=lambda p: (abs(p - 64), p))
    return (prompt, gen)


def _settings_line(r: dict[str, Any]) -> str:
    return (f"threads {r['threads']}, n_batch {r['n_batch']}, n_ubatch {r['n_ubatch']}, flash_attn "
            f"{'on' if r['flash_attn'] else 'off'}, mmap {'on' if r['mmap'] else 'off'}, n_ctx per workload "
            f"(256-token multiples of prompt + gen); median ± stddev of {r['reps']} timed runs after "
            f"{r['warmup']} discarded warm-up run(s), each configuration in a fresh process"
            + (f"; the median of {r['rounds']} rounds (the whole grid once per round)" if (r.get("rounds") or 1) > 1
               else ""))


def settings_text(records: Sequence[dict[str, Any]]) -> str:
    """The run settings, once if all models share them, else per model."""
    per_model = {r["model"]: _settings_line(r) for r in records}
    if len(set(per_model.values())) == 1:
        return next(iter(per_model.values()))
    return "; ".join(f"{m}: {t}" for m, t in sorted(per_model.items()))


def machine_line(r: dict[str, Any]) -> str:
    mem = f", {r['host_memory_bytes'] / 2**30:.0f} GiB RAM" if r.get("host_memory_bytes") else ""
    return (f"{r['machine']}: CPU {r['cpu']} ({r['cpu_count']} cores{mem}, {r.get('os') or '?'}); "
            f"accelerator {r['device']} "
            f"({r['device_kind']}: {r['device_description']}); oallama {r['oallama_version']}, llama.cpp "
            f"{str(r['build_commit'])[:9]}{' + ' + r['build_patches'].replace(';', ', ') if r['build_patches'] else ''}"
            f"{', CUDA build' if r['cuda_build'] else ''}")


RPC_NOTE = ("The accelerator here is a loopback rpc-server, i.e. another CPU process on the same machine: "
            "these timings prove the harness, they are no evidence of a speed-up.")
SOFT_GPU_NOTE = ("The accelerator here is Mesa's software GPU (lavapipe) running on the same CPU cores: a real "
                 "GPU-class backend with its own costs, far slower than the CPU; no evidence of GPU speed.")


def summary_markdown(records: Sequence[dict[str, Any]], failed: Sequence[dict[str, Any]], title: str) -> str:
    lines = [f"# oallama bench: {title}", ""]
    if not records:
        lines += ["No finished configurations yet.", ""]
    else:
        r0 = records[0]
        lines += [f"Machine: {machine_line(r0)}.", "", f"Settings: {settings_text(records)}.", ""]
        if any(r["device_kind"] == "rpc" for r in records):
            lines += [RPC_NOTE, ""]
        lines += ["Columns: on acc = accelerator bytes of the load by llama.cpp's accounting (planned); "
                  "TTFT/TPOT/e2e measured (median ± stddev) with the planner's prediction in the `pred` column; "
                  "device peak = " + "; ".join(sorted({r["source"] for r in records
                                                        if r["metric"] == "device_peak_bytes"}) or ["not measured"])
                  + "; **bold** e2e: the lowest measured end-to-end time at that budget (the measured winner).", ""]
        lines += [*accuracy.load_markdown(records), *accuracy.noisy_markdown(records),
                  *accuracy.rounds_markdown(records)]
        winners = set(accuracy.measured_winners(records).values())
        cfgs = by_config(records)
        models = sorted({r["model"] for r in records})
        for model in models:
            mrecs = [r for r in records if r["model"] == model]
            lines += [f"## {model} ({_mib(mrecs[0]['model_weight_bytes'])} MiB of weights, "
                      f"{mrecs[0]['model_n_layer']} layers)", ""]
            for prompt, gen in sorted({(r["prompt"], r["gen"]) for r in mrecs}):
                ids = list(dict.fromkeys(r["config_id"] for r in mrecs if (r["prompt"], r["gen"]) == (prompt, gen)))
                lines += [f"### prompt {prompt}, generate {gen} (n_ctx {cfgs[ids[0]]['e2e_ms']['n_ctx']})", "",
                          "| budget | strategy | on acc MiB | weights on acc | TTFT ms | pred | TPOT ms | pred | "
                          "e2e ms | pred | tok/s | host peak MiB | device peak MiB |",
                          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
                for cid in ids:
                    m = cfgs[cid]
                    e = m["e2e_ms"]
                    fits = "" if e["fits_budget"] else " (over budget)"
                    frm = f" (= {e['plan_from']})" if e["plan_from"] != e["strategy"] else ""
                    if e.get("confirm_s") is not None:
                        frm += f", confirmed in {e['confirm_s']:.0f} s"
                    dev = m.get("device_peak_bytes")
                    e2e = f"**{_ms(m['e2e_ms'])}**" if cid in winners else _ms(m["e2e_ms"])
                    lines.append(
                        f"| {e['budget']} ({_mib(e['budget_bytes'])} MiB) | {e['series']}{frm} | "
                        f"{_mib(m['device_planned_bytes']['median'])}{fits} | {100 * (e['acc_weight_share'] or 0):.0f}% | "
                        f"{_ms(m['ttft_ms'])} | {_pred(m['ttft_ms'])} | {_ms(m['tpot_ms'], 2)} | {_pred(m['tpot_ms'], 2)} | "
                        f"{e2e} | {_pred(m['e2e_ms'])} | {m['tokens_per_s']['median']:.1f} | "
                        f"{_mib(m['host_peak_bytes']['median'])} | {_mib(dev['median'] if dev else None)} |")
                lines.append("")
        lines += [*accuracy.optimal_markdown(records), *accuracy.prediction_error_markdown(records),
                  *accuracy.host_speed_markdown(records)]
    if failed:
        lines += ["## Failed configurations", "", "| model | strategy | budget | prompt | gen | error |",
                  "|---|---|---|---|---|---|"]
        for f in failed:
            c = f["config"]
            err = str(f.get("error", "")).replace("|", "/").replace("\n", " ")[:200]
            lines.append(f"| {c['model_name']} | {c['series']} | {c['budget']} | {c['prompt']} | {c['gen']} | {err} |")
        lines.append("")
    return "\n".join(lines)


# --- plots -------------------------------------------------------------------------------------


def _series_style(series: str) -> dict[str, Any]:
    strat = series.split(" ")[0]
    return {"color": STRATEGY_COLORS.get(strat, "C7"), "marker": "o" if "off" not in series else "s"}


def _series_order(names: Iterable[str]) -> list[str]:
    def key(s: str) -> tuple[int, int, str]:
        strat = s.split(" ")[0]
        return (STRATEGY_ORDER.index(strat) if strat in STRATEGY_ORDER else 99, "off" in s, s)

    return sorted(set(names), key=key)


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def make_plots(records: Sequence[dict[str, Any]], out_dir: Path) -> dict[str, Path]:
    """The paper's figures: end-to-end per model, TTFT vs prompt length, TPOT vs generation
    length, time vs accelerator weight share; one colour per strategy, measured solid with the
    spread as error bars, predicted dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in records})
    anchors = {m: anchor_of([r for r in records if r["model"] == m]) or (0, 0) for m in models}
    budgets = sorted({(r["budget_bytes"] / r["model_weight_bytes"], r["budget"]) for r in records})
    budget_names = list(dict.fromkeys(b for _, b in budgets))
    title_sfx = "\n(accelerator = loopback rpc-server: a harness check, not a speed claim)" if any(
        r["device_kind"] == "rpc" for r in records) else ""
    out: dict[str, Path] = {}

    def pick(metric: str, model: str, **kw: Any) -> list[dict[str, Any]]:
        return [r for r in records if r["metric"] == metric and r["model"] == model
                and all(r[k] == v for k, v in kw.items())]

    # 1. end-to-end per model: grouped bars (groups = models, each at its anchor workload; bars =
    # strategies), one panel per budget
    rows, cols = _grid(len(budget_names))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax, budget in zip(axes.flat, budget_names, strict=False):
        recs = [r for m in models for r in pick("e2e_ms", m, prompt=anchors[m][0], gen=anchors[m][1],
                                                 budget=budget)]
        series = _series_order(r["series"] for r in recs)
        width = 0.8 / max(len(series), 1)
        for j, s in enumerate(series):
            xs, ys, es, ps = [], [], [], []
            for k, m in enumerate(models):
                r = next((r for r in recs if r["model"] == m and r["series"] == s), None)
                if r is not None:
                    xs.append(k + (j - (len(series) - 1) / 2) * width)
                    ys.append(r["median"])
                    es.append(r["stddev"])
                    ps.append(r["predicted"])
            st = _series_style(s)
            ax.bar(xs, ys, width, yerr=es, color=st["color"], label=s, capsize=2)
            ax.scatter(xs, ps, marker="_", s=220, color="black", zorder=3,
                       label="predicted" if j == 0 else None)
        ax.set_xticks(range(len(models)), [f"{m}\nprompt {anchors[m][0]}, gen {anchors[m][1]}" for m in models],
                      fontsize=7)
        vals = [r["median"] for r in recs if r["median"] > 0]
        if vals and max(vals) / min(vals) > 20:
            ax.set_yscale("log")  # models of very different sizes side by side
        ax.set_ylabel("end-to-end ms")
        ax.set_title(f"budget {budget}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(budget_names):]:
        ax.axis("off")
    fig.suptitle("End-to-end time per model" + title_sfx, fontsize=10)
    fig.tight_layout()
    out["plot_e2e"] = _save(fig, out_dir / PLOTS["e2e"])

    # 2./3. TTFT vs prompt length (at the anchor gen), TPOT vs generation length (at the anchor prompt)
    for key, metric, xkey, xlabel in (("ttft", "ttft_ms", "prompt", "prompt tokens"),
                                      ("tpot", "tpot_ms", "gen", "generated tokens")):
        panels = [(m, b) for m in models for b in budget_names]
        rows, cols = _grid(len(panels))
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
        for ax, (model, budget) in zip(axes.flat, panels, strict=False):
            fixed = {"gen": anchors[model][1]} if xkey == "prompt" else {"prompt": anchors[model][0]}
            recs = pick(metric, model, budget=budget, **fixed)
            _lines(ax, recs, xkey)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("TTFT ms" if metric == "ttft_ms" else "TPOT ms")
            (k, v), = fixed.items()
            ax.set_title(f"{model}, budget {budget}, {k} {v}", fontsize=9)
            xs = sorted({r[xkey] for r in recs})
            if xkey == "prompt" and len(xs) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        what = "TTFT vs prompt length" if key == "ttft" else "TPOT vs generation length"
        fig.suptitle(f"{what} (solid measured, dashed predicted){title_sfx}", fontsize=10)
        fig.tight_layout()
        out[f"plot_{key}"] = _save(fig, out_dir / PLOTS[key])

    # 4. time vs the accelerator's share of the weights (budget as a share), at the anchor workload
    panels2 = [(m, metric) for m in models for metric in ("ttft_ms", "tpot_ms", "e2e_ms")]
    rows, cols = len(models), 3
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, (model, metric) in zip(axes.flat, panels2, strict=False):
        ap, ag = anchors[model]
        recs = [dict(r, share=100 * r["budget_share"]) for r in pick(metric, model, prompt=ap, gen=ag)]
        _lines(ax, recs, "share")
        shares = sorted({r["share"] for r in recs})
        ax.set_xticks(shares, [f"{x:.0f}%" for x in shares])
        ax.set_xlabel("accelerator budget, % of the weights")
        ax.set_ylabel({"ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "e2e_ms": "end-to-end ms"}[metric])
        ax.set_title(f"{model}: prompt {ap}, generate {ag}", fontsize=9)
    for ax in list(axes.flat)[len(panels2):]:
        ax.axis("off")
    fig.suptitle("Time vs GPU weight share (solid measured, dashed predicted)" + title_sfx, fontsize=10)
    fig.tight_layout()
    out["plot_share"] = _save(fig, out_dir / PLOTS["share"])
    plt.close("all")
    return out


def _lines(ax: Any, recs: Sequence[dict[str, Any]], xkey: str) -> None:
    for s in _series_order(r["series"] for r in recs):
        pts = sorted((r[xkey], r["median"], r["stddev"], r["predicted"]) for r in recs if r["series"] == s)
        st = _series_style(s)
        xs = [p[0] for p in pts]
        ax.errorbar(xs, [p[1] for p in pts], yerr=[p[2] for p in pts], color=st["color"], marker=st["marker"],
                    linestyle="-", capsize=2, markersize=4, label=s)
        if any(p[3] is not None for p in pts):
            ax.plot(xs, [p[3] if p[3] is not None else float("nan") for p in pts], color=st["color"],
                    linestyle="--", linewidth=1, marker="x", markersize=5)
    vals = [v for r in recs for v in (r["median"], r["predicted"]) if v is not None and v > 0]
    if vals and max(vals) / min(vals) > 20:
        ax.set_yscale("log")  # e.g. flexgen an order of magnitude above the rest
    if recs:
        ax.legend(fontsize=7)


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


# --- result sets ---------------------------------------------------------------------------------


def result_dirs(paths: Sequence[Path]) -> list[Path]:
    """Directories at or under `paths` holding a results.json of this schema, by name."""
    found: dict[Path, None] = {}
    for p in paths:
        for f in sorted([p / "results.json", *p.rglob("*/results.json")]):
            if f.is_file():
                try:
                    read_records(f)
                except (ValueError, OSError, AttributeError):
                    continue  # another benchmark's results
                found[f.parent] = None
    return sorted(found, key=lambda d: (d.name, str(d)))
