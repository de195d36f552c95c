"""How far the planner's predictions are from what `oallama bench` measured, and how far the
measurements themselves can be trusted (issue 13: a cost model that predicts what it measures).

    prediction_errors   relative error |predicted - measured| / measured per device class and
                        strategy: median, p90, max, count
    optimal_behind      cells (model, workload, budget) where `optimal` measured more than 3%
                        behind the best other strategy
    compare_repeats     identical placements measured twice (e.g. `layers` and `fit` often give
                        the same): their TTFT/TPOT medians must agree within 5%
    round_disagreements configurations measured in several rounds (`--rounds`) whose rounds' e2e
                        medians spread by more than 5% (`round_spread`): the same process, run
                        again minutes later, measured something else
    high_load           configurations measured while the machine was busy (1-minute load
                        average above 1.5 at their start or end)
    host_drift          configurations measured while the host or the accelerator ran reference
                        ops more than 10% faster or slower than when their profile was measured
                        (`host_speed`, `acc_speed`; planner/cost/hostspeed.py): the machine's errors
    predicted_passes    the planner's per-pass breakdown as flat rows (predicted_passes.csv)

Everything here works on records (`report.records_from_raw`, or a results.json / results.csv
read back); records of older runs without the newer columns are read, those checks skip them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from ..planner.workload import Ubatch

ERROR_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
REPEAT_METRICS = ("ttft_ms", "tpot_ms")
STRATEGY_ORDER = ("layers", "fit", "flexgen", "affinity", "optimal")
LOAD_LIMIT = 1.5  # 1-minute load average above which a configuration is to be measured again ...
LOAD_LIMIT_CORES = 2  # ... on a machine of this many cores; it scales with the record's cpu_count
NOISE_TOLERANCE = 0.05  # identical placements measured twice agree within 5%
OPTIMAL_TOLERANCE = 0.03  # issue target: optimal no more than 3% behind the best other strategy
SPEED_TOLERANCE = 0.10  # a device more than 10% faster or slower than when profiled: the machine drifted
SPEED_ROLES = {"host_speed": "host", "acc_speed": "accelerator"}  # record field -> device role (hostspeed.py)
# what makes two configurations the same measurement besides the placement
_SAME_RUN = ("machine", "device_kind", "model", "model_identity", "prompt", "gen", "op_offload", "threads", "n_ctx",
             "n_batch", "n_ubatch", "flash_attn", "mmap")


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of xs by linear interpolation between the closest
    ranks: position q/100 * (n - 1) in the sorted values, as numpy.percentile's default
    method "linear" (Hyndman & Fan type 7)."""
    if not xs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q}: must be in [0, 100]")
    s = sorted(xs)
    pos = q / 100 * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _strategy_key(series: str) -> tuple[int, bool, str]:
    strat = series.split(" ")[0]
    return (STRATEGY_ORDER.index(strat) if strat in STRATEGY_ORDER else len(STRATEGY_ORDER), "off" in series, series)


def prediction_errors(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Relative prediction error |predicted - measured| / measured of each configuration's
    measured median, summarised per device class (`device_kind`) and strategy (its series:
    "layers (op offload off)" is its own) plus an "all" row per device class, for TTFT, TPOT and
    end-to-end time. One row per (device_kind, strategy, metric), in that order:
    {device_kind, strategy, metric, count, median, p90, max, bias}; errors are fractions (0.1 =
    10%), p90 by `percentile` (linear interpolation, numpy's default), bias the median signed
    error (predicted - measured) / measured (> 0: the planner predicts slower than measured).
    Records without a prediction, or with a measured median of 0 (TPOT of a 1-token generation),
    are left out."""
    signed: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.get("metric") not in ERROR_METRICS or r.get("predicted") is None or not r.get("median"):
            continue
        e = (float(r["predicted"]) - float(r["median"])) / float(r["median"])
        kind = str(r.get("device_kind") or "?")
        series = str(r.get("series") or r["strategy"])
        signed[(kind, series, r["metric"])].append(e)
        signed[(kind, "all", r["metric"])].append(e)
    rows = []
    for kind, series, metric in sorted(signed, key=lambda k: (
            k[0], k[1] == "all", _strategy_key(k[1]), ERROR_METRICS.index(k[2]))):
        es = signed[(kind, series, metric)]
        ab = [abs(e) for e in es]
        rows.append({"device_kind": kind, "strategy": series, "metric": metric, "count": len(es),
                     "median": statistics.median(ab), "p90": percentile(ab, 90), "max": max(ab),
                     "bias": statistics.median(es)})
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def errors_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The prediction error table (Markdown lines) of `prediction_errors`."""
    if not rows:
        return ["No configuration with both a prediction and a measurement."]
    lines = ["| device | strategy | metric | configs | median | p90 | max | bias (median signed) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        strat = f"**{r['strategy']}**" if r["strategy"] == "all" else r["strategy"]
        lines.append(f"| {r['device_kind']} | {strat} | {r['metric']} | {r['count']} | {_pct(r['median'])} | "
                     f"{_pct(r['p90'])} | {_pct(r['max'])} | {'+' if r['bias'] > 0 else ''}{_pct(r['bias'])} |")
    return lines


# --- measured winners ----------------------------------------------------------------------------


def _cells(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[Mapping[str, Any]]]:
    """(model, prompt, gen, budget) -> the e2e_ms records of that cell."""
    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("metric") == "e2e_ms" and r.get("median") is not None:
            cells[(r["model"], r["prompt"], r["gen"], r["budget"])].append(r)
    return cells


def measured_winners(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], str]:
    """(model, prompt, gen, budget) -> config_id of the configuration with the lowest measured
    end-to-end median in that cell (every series: op offload off ones too)."""
    return {cell: str(min(rs, key=lambda r: r["median"])["config_id"]) for cell, rs in _cells(records).items()}


def optimal_behind(records: Iterable[Mapping[str, Any]],
                   tolerance: float = OPTIMAL_TOLERANCE) -> tuple[int, list[dict[str, Any]]]:
    """(cells compared, the cells where an `optimal` configuration measured more than
    `tolerance` behind the best configuration of another strategy in its (model, workload,
    budget) cell): [{model, prompt, gen, budget, optimal, optimal_ms, optimal_predicted, best,
    best_ms, best_predicted, behind, same_placement}], behind = optimal_ms / best_ms - 1;
    same_placement: both loaded one placement (equal `placement_key`), so the gap is the run's noise,
    not the plan's (a small MoE's host-only decode: one placement 3.25-5.02 ms a token between processes)."""
    compared, out = 0, []
    for (model, prompt, gen, budget), rs in sorted(_cells(records).items(), key=lambda kv: str(kv[0])):
        others = [r for r in rs if r["strategy"] != "optimal" and r["median"] > 0]
        if not others:
            continue
        best = min(others, key=lambda r: r["median"])
        for o in (r for r in rs if r["strategy"] == "optimal"):
            compared += 1
            behind = o["median"] / best["median"] - 1
            if behind > tolerance:
                out.append({"model": model, "prompt": prompt, "gen": gen, "budget": budget,
                            "optimal": o.get("series") or "optimal", "optimal_ms": o["median"],
                            "optimal_predicted": o.get("predicted"), "best": best.get("series") or best["strategy"],
                            "best_ms": best["median"], "best_predicted": best.get("predicted"), "behind": behind,
                            "optimal_speed": {f: o.get(f) for f in SPEED_ROLES},
                            "best_speed": {f: best.get(f) for f in SPEED_ROLES},
                            "same_placement": bool(o.get("placement_key"))
                            and o.get("placement_key") == best.get("placement_key")})
    return compared, out


def optimal_markdown(records: Sequence[Mapping[str, Any]], tolerance: float = OPTIMAL_TOLERANCE) -> list[str]:
    compared, behind = optimal_behind(records, tolerance)
    if not compared:
        return []
    head = [f"## Optimal against the best other strategy (measured end-to-end, target: within "
            f"{100 * tolerance:.0f}%)", ""]
    if not behind:
        return [*head, f"`optimal` is within {100 * tolerance:.0f}% of the best other strategy (or ahead) in all "
                f"{compared} cell(s).", ""]
    lines = [*head, f"`optimal` measured more than {100 * tolerance:.0f}% behind the best other strategy in "
             f"{len(behind)} of {compared} cell(s):", "",
             "| model | prompt / gen | budget | optimal e2e ms (pred) | best other | its e2e ms (pred) | behind | "
             "same placement | host / acc speed: optimal; best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b in behind:
        speed = "; ".join(_speed_pair(b[k]) for k in ("optimal_speed", "best_speed"))
        lines.append(f"| {b['model']} | {b['prompt']} / {b['gen']} | {b['budget']} | {b['optimal_ms']:.1f} "
                     f"({_fmt(b['optimal_predicted'])}) | {b['best']} | {b['best_ms']:.1f} "
                     f"({_fmt(b['best_predicted'])}) | +{_pct(b['behind'])} | {'yes' if b['same_placement'] else 'no'} | "
                     f"{speed} |")
    same = sum(1 for b in behind if b["same_placement"])
    if same:
        lines += ["", f"In {same} of them `optimal` loaded the very placement the best other did: the gap is "
                  "this run's noise, not the plan's (see Noisy)."]
    return [*lines, ""]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# --- noise ---------------------------------------------------------------------------------------


def placement_key(plan_doc: Mapping[str, Any]) -> str:
    """A hash of what a plan file makes llama.cpp do: the weight -> device assignment (the
    accelerator under one name: an rpc-server's port changes between runs), n_gpu_layers,
    kv_layers and the per-weight op-offload thresholds. Equal keys: the same placement."""
    acc = plan_doc.get("accelerator")
    doc = {"placement": {w: ("<acc>" if d == acc else d) for w, d in sorted((plan_doc.get("placement") or {}).items())},
           "n_gpu_layers": plan_doc.get("n_gpu_layers"), "kv_layers": plan_doc.get("kv_layers"),
           "offload_min_batch": dict(sorted((plan_doc.get("offload_min_batch") or {}).items()))}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def compare_repeats(records: Iterable[Mapping[str, Any]],
                    tolerance: float = NOISE_TOLERANCE) -> list[dict[str, Any]]:
    """Every pair of configurations that measured the same placement (equal `placement_key`) of
    the same model, workload and settings, compared on the TTFT and TPOT medians: [{model,
    prompt, gen, metric, a, b (config ids), a_label, b_label, a_ms, b_ms, diff, noisy}], diff =
    larger / smaller - 1, noisy when diff > tolerance. Records without a placement_key (runs
    before it was recorded) are not compared."""
    groups: dict[tuple[Any, ...], dict[str, dict[str, Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("metric") in REPEAT_METRICS and r.get("placement_key"):
            # an rpc-server's name carries its port, which changes with every run (a resumed one too)
            device = re.sub(r":\d+\]$", "]", str(r.get("device")))
            key = (*(r.get(k) for k in _SAME_RUN), device, r["placement_key"])
            groups[key][r["config_id"]][r["metric"]] = r
    out = []
    for cfgs in groups.values():
        for (ida, ma), (idb, mb) in combinations(sorted(cfgs.items()), 2):
            for metric in REPEAT_METRICS:
                ra, rb = ma.get(metric), mb.get(metric)
                if ra is None or rb is None or not ra["median"] or not rb["median"]:
                    continue
                a, b = float(ra["median"]), float(rb["median"])
                diff = max(a, b) / min(a, b) - 1
                out.append({"model": ra["model"], "prompt": ra["prompt"], "gen": ra["gen"], "metric": metric,
                            "a": ida, "b": idb, "a_label": _label(ra), "b_label": _label(rb), "a_ms": a, "b_ms": b,
                            "diff": diff, "noisy": diff > tolerance})
    return out


def _label(r: Mapping[str, Any]) -> str:
    return f"{r.get('series') or r['strategy']} @{r['budget']}"


def noisy_markdown(records: Sequence[Mapping[str, Any]], tolerance: float = NOISE_TOLERANCE) -> list[str]:
    """The "Noisy" section: identical placements whose repeated measurements disagree."""
    pairs = compare_repeats(records, tolerance)
    noisy = [p for p in pairs if p["noisy"]]
    if records and not any(r.get("placement_key") for r in records):
        return ["Repeat check: no placement keys recorded (a run before they were), not possible.", ""]
    if not noisy:
        return [f"Repeat check: {len(pairs)} comparison(s) of identical placements measured twice, all within "
                f"{100 * tolerance:.0f}%.", ""] if pairs else []
    lines = ["## Noisy", "", f"Identical placements measured twice that differ by more than {100 * tolerance:.0f}% "
             f"({len(noisy)} of {len(pairs)} comparison(s)): these timings are noise-limited, measure again.", "",
             "| model | prompt / gen | metric | first | ms | second | ms | diff |", "|---|---|---|---|---|---|---|---|"]
    for p in noisy:
        lines.append(f"| {p['model']} | {p['prompt']} / {p['gen']} | {p['metric']} | {p['a_label']} | "
                     f"{p['a_ms']:.2f} | {p['b_label']} | {p['b_ms']:.2f} | {_pct(p['diff'])} |")
    return [*lines, ""]


def round_disagreements(records: Iterable[Mapping[str, Any]],
                        tolerance: float = NOISE_TOLERANCE) -> tuple[int, list[Mapping[str, Any]]]:
    """(configurations measured in more than one round, the e2e records of those whose rounds'
    medians spread by more than `tolerance`: slowest / fastest - 1, `round_spread`), largest
    spread first."""
    several = [r for r in records if r.get("metric") == "e2e_ms" and (r.get("rounds") or 1) > 1
               and r.get("round_spread") is not None]
    return len(several), sorted((r for r in several if float(r["round_spread"]) > tolerance),
                                key=lambda r: -float(r["round_spread"]))


def rounds_markdown(records: Sequence[Mapping[str, Any]], tolerance: float = NOISE_TOLERANCE) -> list[str]:
    """The "Rounds that disagree" part of the noise checks (runs with `--rounds`)."""
    n, off = round_disagreements(records, tolerance)
    if not n:
        return []
    if not off:
        return [f"Round check: the rounds of all {n} configuration(s) measured in several agree within "
                f"{100 * tolerance:.0f}% (end to end).", ""]
    lines = ["## Rounds that disagree", "",
             f"{len(off)} of {n} configuration(s) measured in several rounds spread by more than "
             f"{100 * tolerance:.0f}% end to end between their rounds (slowest / fastest - 1; the records report "
             "the median round, `rounds.csv` has each):", "",
             "| model | prompt / gen | strategy | budget | rounds | e2e ms (median round) | spread |",
             "|---|---|---|---|---|---|---|"]
    for r in off:
        lines.append(f"| {r['model']} | {r['prompt']} / {r['gen']} | {r.get('series') or r['strategy']} | "
                     f"{r['budget']} | {r['rounds']} | {float(r['median']):.2f} | {_pct(float(r['round_spread']))} |")
    return [*lines, ""]


def load_limit(cpu_count: int | None) -> float:
    """The load average above which a run on a machine of cpu_count cores is to be redone:
    LOAD_LIMIT per LOAD_LIMIT_CORES cores (a 16-core GPU machine's 8 benchmark threads are no
    sign of a busy machine; on the 2-core VM two are)."""
    return LOAD_LIMIT * max(int(cpu_count or LOAD_LIMIT_CORES), LOAD_LIMIT_CORES) / LOAD_LIMIT_CORES


def high_load(records: Iterable[Mapping[str, Any]], limit: float | None = None) -> list[dict[str, Any]]:
    """Configurations whose 1-minute load average, at their start or end, was above `limit`
    (default: `load_limit` of the record's machine): [{config_id, label, load, limit}] (load:
    the higher of the two)."""
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        loads = [float(x) for x in (r.get("load_avg_start"), r.get("load_avg_end")) if x is not None]
        lim = limit if limit is not None else load_limit(r.get("cpu_count"))
        if r["config_id"] in seen or not loads or max(loads) <= lim:
            continue
        seen[r["config_id"]] = {"config_id": r["config_id"], "load": max(loads), "limit": lim,
                                "label": f"{r['model']} {_label(r)} prompt {r['prompt']} gen {r['gen']}"}
    return sorted(seen.values(), key=lambda x: -x["load"])


def load_warning(load: float, label: str, limit: float = LOAD_LIMIT) -> str:
    return f"redo: measured at load {load:.2f} (1-minute load average above {limit:g}): {label}"


def warning_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per configuration measured under load and per identical placement measured twice
    that disagrees (the end of `oallama bench`'s log)."""
    return [*(f"{load_warning(b['load'], b['label'], b['limit'])}" for b in high_load(records)),
            *(f"noisy: {p['model']} prompt {p['prompt']} gen {p['gen']}: the same placement measured {p['metric']} "
              f"{p['a_ms']:.2f} ms ({p['a_label']}) and {p['b_ms']:.2f} ms ({p['b_label']}), {_pct(p['diff'])} apart"
              for p in compare_repeats(records) if p["noisy"])]


def load_markdown(records: Sequence[Mapping[str, Any]], limit: float | None = None) -> list[str]:
    busy = high_load(records, limit)
    if not any(r.get("load_avg_start") is not None or r.get("load_avg_end") is not None for r in records):
        return ["Load average: not recorded (a run before it was).", ""] if records else []
    if not busy:
        return []
    lims = sorted({b["limit"] for b in busy})
    return ["## Measured under load", "", f"{len(busy)} configuration(s) ran while the 1-minute load average was "
            f"above {' / '.join(f'{x:g}' for x in lims)} ({LOAD_LIMIT:g} per {LOAD_LIMIT_CORES} cores; the benchmark's "
            "own threads count in it): measure them again on a quiet machine.", "",
            *(f"- {load_warning(b['load'], b['label'], b['limit'])} ({b['config_id']})" for b in busy), ""]


def host_drift(records: Iterable[Mapping[str, Any]],
               tolerance: float = SPEED_TOLERANCE) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """({record field: every configuration's speed} for `host_speed` and `acc_speed`, the
    configurations with a speed more than `tolerance` off 1: [{config_id, label, host_speed,
    acc_speed}], the farthest first). Configurations without a recorded speed are left out."""
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["config_id"] in seen or all(r.get(f) is None for f in SPEED_ROLES):
            continue
        seen[r["config_id"]] = {"config_id": r["config_id"],
                                "label": f"{r['model']} {_label(r)} prompt {r['prompt']} gen {r['gen']}",
                                **{f: (float(r[f]) if r.get(f) is not None else None) for f in SPEED_ROLES}}
    speeds = {f: [c[f] for c in seen.values() if c[f] is not None] for f in SPEED_ROLES}

    def worst(c: Mapping[str, Any]) -> float:
        return max(abs(c[f] - 1) for f in SPEED_ROLES if c[f] is not None)

    off = [c for c in seen.values() if worst(c) > tolerance]
    return speeds, sorted(off, key=lambda c: -worst(c))


def _speed_pair(c: Mapping[str, Any]) -> str:
    return " / ".join("-" if c.get(f) is None else f"{c[f]:.2f}" for f in SPEED_ROLES)


def host_speed_markdown(records: Sequence[Mapping[str, Any]], tolerance: float = SPEED_TOLERANCE) -> list[str]:
    """The "Device speed" section: how fast the host and the accelerator ran against their
    profiles, and the prediction errors of the configurations measured near and far from them."""
    speeds, off = host_drift(records, tolerance)
    if not any(speeds.values()):
        return []
    far = {o["config_id"] for o in off}
    ranges = "; ".join(f"the {role} {min(v):.2f}-{max(v):.2f} (median {statistics.median(v):.2f})"
                       for f, role in SPEED_ROLES.items() if (v := speeds[f]))
    n = len({r["config_id"] for r in records if any(r.get(f) is not None for f in SPEED_ROLES)})
    lines = ["## Device speed against the profile", "",
             f"Reference ops (planner/cost/hostspeed.py) timed around every configuration's runs ran at this speed "
             f"against their speed when the plan's profile was measured (> 1: faster): {ranges}. {len(off)} of {n} "
             f"configuration(s) ran more than {100 * tolerance:.0f}% off it on a device: the machine, not the model, "
             "moved under their predictions.", ""]
    groups = {"near": [r for r in records if any(r.get(f) is not None for f in SPEED_ROLES)
                       and r["config_id"] not in far],
              "far": [r for r in records if r["config_id"] in far]}
    lines += [f"| device speed | configs | {' | '.join(f'{m} median / p90' for m in ERROR_METRICS)} |",
              f"|---|---|{'---|' * len(ERROR_METRICS)}"]
    for name, rs in groups.items():
        errs = {m: [abs(float(r["predicted"]) - float(r["median"])) / float(r["median"]) for r in rs
                    if r.get("metric") == m and r.get("predicted") is not None and r.get("median")]
                for m in ERROR_METRICS}
        cells = " | ".join(f"{_pct(statistics.median(e))} / {_pct(percentile(e, 90))}" if e else "-"
                           for e in errs.values())
        span = f"within {100 * tolerance:.0f}%" if name == "near" else f"more than {100 * tolerance:.0f}% off"
        lines.append(f"| {span} | {len({r['config_id'] for r in rs})} | {cells} |")
    if off:
        lines += ["", "Host / accelerator speed:", "",
                  *(f"- {o['label']}: {_speed_pair(o)} ({o['config_id']})" for o in off[:20])]
        if len(off) > 20:
            lines.append(f"- ... and {len(off) - 20} more")
    return [*lines, ""]


def prediction_error_markdown(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Prediction error" section of summary.md."""
    if not records:
        return []
    return ["## Prediction error", "",
            "Relative error |predicted - measured| / measured of the measured medians over configurations, "
            "per accelerator kind and strategy; p90 by linear interpolation between ranks (numpy.percentile's "
            "default); bias > 0: predicted slower than measured.", "",
            *errors_markdown(prediction_errors(records)), ""]


def accuracy_markdown(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Load and repeat checks, optimal against the others, prediction error: what
    `oallama bench-report` prints (summary.md has the same sections)."""
    return [*load_markdown(records), *noisy_markdown(records), *rounds_markdown(records),
            *optimal_markdown(records), *prediction_error_markdown(records), *host_speed_markdown(records)]


# --- the per-pass breakdown ---------------------------------------------------------------------


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def predicted_passes(predicted: Mapping[str, Mapping[str, Any]],
                     configs: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of predicted_passes.csv: one row per (configuration, pass) of the
    predictions (config_id -> the plan's predicted dict with "passes": {ubatch: {...}}, `Ubatch`), with
    the configuration's identity from `configs` (config_id -> its raw "config") and one column
    per numeric key of the pass dicts (any the planner adds), in the order first seen."""
    ident = ["config_id", "model", "strategy", "op_offload", "budget", "prompt", "gen", "n_tokens", "n_seqs"]
    keys: dict[str, None] = {}
    rows = []
    for cid, pred in predicted.items():
        c = configs.get(cid, {})
        for u, ps in sorted(((Ubatch.parse(k), v) for k, v in (pred.get("passes") or {}).items())):
            vals = {k: v for k, v in ps.items() if _numeric(v)}
            keys.update(dict.fromkeys(vals))
            rows.append({"config_id": cid, "model": c.get("model_name"), "strategy": c.get("strategy"),
                         "op_offload": c.get("op_offload"), "budget": c.get("budget"), "prompt": c.get("prompt"),
                         "gen": c.get("gen"), "n_tokens": u.n_tokens, "n_seqs": u.n_seqs, **vals})
    return ident + list(keys), rows
