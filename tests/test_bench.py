"""The benchmark harness (`oallama bench`), smoke-tested on the tiny model with a loopback
rpc-server as the accelerator: record schema, CSV, Markdown, plots, resume, clean stop, bad
input. No timing assertions: on CPU + rpc-server the timings mean nothing."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oallama import cli
from oallama.bench import accuracy as bench_accuracy
from oallama.bench import harness as bench
from oallama.bench import report as bench_report

# 1 budget x 2 strategies x 1 workload, 1 timed run after 1 warm-up; ubatch 64 so that the
# compute buffers of the tiny model leave room for weights in a 75% budget
GRID = ["--gpu-budget", "75%", "--strategies", "layers,optimal", "--prompt", "32", "--gen", "4", "--reps", "1",
        "--warmup", "1", "--ubatch", "64", "--threads", "1", "--rpc-local"]
TIMED = ("ttft_ms", "tpot_ms", "e2e_ms", "tokens_per_s")


def _bench(model: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """`oallama bench` as a user runs it: its own process. (In this process, a ggml that once
    registered an rpc-server that has since stopped aborts on the next query of every device's
    memory, which the `fit` baseline does.)"""
    p = subprocess.run([sys.executable, "-m", "oallama", "bench", str(model), *GRID, *extra, "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, p.stderr[-3000:]
    return p.returncode, json.loads(lines[-1]), p.stderr


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, synth_model) -> dict[str, Any]:
    model = synth_model("tiny", "q8_0")
    out = tmp_path_factory.mktemp("bench") / "run"
    rc, summary, err = _bench(model, out)
    return {"rc": rc, "summary": summary, "err": err, "out": out, "model": model}


def test_smoke_run_writes_records_in_one_schema(smoke: dict[str, Any]) -> None:
    assert smoke["rc"] == 0, smoke["err"][-3000:]
    assert smoke["summary"]["launched"] == 2 and smoke["summary"]["failed"] == 0
    assert "[1/2]" in smoke["err"] and "[2/2]" in smoke["err"]  # progress
    records = bench_report.read_records(smoke["out"] / "results.json")
    assert records
    for r in records:
        assert r["schema"] == bench.SCHEMA
        assert set(r) == set(bench_report.COLUMNS), set(r) ^ set(bench_report.COLUMNS)
        assert r["metric"] in bench_report.METRICS and r["unit"] == bench_report.METRICS[r["metric"]][0]
        assert r["n"] >= 1 and r["min"] <= r["median"] <= r["max"] and r["stddev"] >= 0
        # settings recorded with every figure, identical across strategies: GRID's --threads 1 and
        # --ubatch 64 (n_batch = n_ubatch), the defaults (no flash attention, mmap, op offload), and
        # n_ctx = prompt + gen = 32 + 4 tokens rounded up to a multiple of 256
        assert (r["threads"], r["n_batch"], r["n_ubatch"], r["flash_attn"], r["mmap"], r["op_offload"],
                r["n_ctx"]) == (1, 64, 64, False, True, True, 256)
        assert r["build_commit"] and r["cpu"] and r["device_kind"] == "rpc"
    by_cfg = bench_report.by_config(records)
    assert {m["e2e_ms"]["strategy"] for m in by_cfg.values()} == {"layers", "optimal"}
    # optimal's plan is the one its confirmation kept, the seconds that took beside its run (a confirmation
    # of one distinct placement measures nothing: 0 s or so)
    confirm_s = {m["e2e_ms"]["strategy"]: m["e2e_ms"]["confirm_s"] for m in by_cfg.values()}
    assert confirm_s["layers"] is None and confirm_s["optimal"] is not None and confirm_s["optimal"] >= 0
    assert "confirm: " in smoke["err"]
    for metrics in by_cfg.values():
        for m in TIMED:
            assert metrics[m]["n"] == 1 and metrics[m]["predicted"] is not None and metrics[m]["median"] > 0
        assert metrics["device_planned_bytes"]["source"].startswith("llama.cpp accounting")
        assert metrics["device_peak_bytes"]["source"].startswith("rpc-server")
        # the server's peak covers this load only: not the device-speed reference ops the worker
        # times on it (a 36 MiB weight) nor another configuration's load
        assert metrics["device_peak_bytes"]["median"] < metrics["device_planned_bytes"]["median"] + 16 * 2**20, metrics
        assert metrics["host_peak_bytes"]["median"] > 0
    # the raw result says which weights the load put on the accelerator, as planned: one per configuration
    raws = [raw for raw in (smoke["out"] / "raw").glob("*.json") if raw.name.count(".") == 1]
    assert sorted(raw.stem for raw in raws) == sorted(by_cfg)
    for raw in raws:
        doc = json.loads(raw.read_text())
        assert doc["status"] == "ok" and doc["placement"]["n_mismatches"] == 0
        assert len(doc["samples"]["ttft_ms"]) == 1 and len(doc["warmup_samples"]["ttft_ms"]) == 1


def test_csv_has_the_same_columns_and_rows(smoke: dict[str, Any]) -> None:
    records = json.loads((smoke["out"] / "results.json").read_text())
    with (smoke["out"] / "results.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert reader.fieldnames == bench_report.COLUMNS
    assert len(rows) == len(records)
    back = bench_report.read_records(smoke["out"] / "results.csv")
    assert [(r["config_id"], r["metric"]) for r in back] == [(r["config_id"], r["metric"]) for r in records]
    assert back[0]["prompt"] == 32 and isinstance(back[0]["median"], float)


def test_markdown_summary_and_plots(smoke: dict[str, Any]) -> None:
    md = (smoke["out"] / "summary.md").read_text()
    assert "| budget | strategy |" in md and "| 75% " in md
    assert "layers" in md and "optimal" in md and "loopback rpc-server" in md
    for name in bench_report.PLOTS.values():
        png = smoke["out"] / name
        assert png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_reruns_only_missing_configurations(smoke: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(smoke["out"], out)
    rc, s, _ = _bench(smoke["model"], out)
    assert rc == 0 and s["total"] == 2 and s["done_before"] == 2 and s["launched"] == 0
    results = sorted(p for p in (out / "raw").glob("*.json") if p.name.count(".") == 1)
    assert len(results) == 2
    results[0].unlink()
    rc, s, err = _bench(smoke["model"], out)
    assert rc == 0 and s["done_before"] == 1 and s["launched"] == 1 and s["remaining"] == 0
    assert f"({results[0].stem})" in err and "[1/1]" in err and "skipped 1 finished" in err
    assert len(bench_report.by_config(bench_report.read_records(out / "results.json"))) == 2


def test_rounds_measure_the_grid_again_and_report_the_median(smoke: dict[str, Any], tmp_path: Path) -> None:
    # --rounds 2 on a finished run: round 1 is the run's results, round 2 runs every configuration
    # once more in its own process; each record reports the median round (of two: the slower) and
    # the rounds' spread
    out = tmp_path / "run"
    shutil.copytree(smoke["out"], out)
    rc, s, err = _bench(smoke["model"], out, "--rounds", "2")
    assert rc == 0, err[-3000:]
    assert s["total"] == 4 and s["done_before"] == 2 and s["launched"] == 2 and s["remaining"] == 0
    assert "[1/2, round 2/2]" in err and "[2/2, round 2/2]" in err
    ids = {p.name.split(".")[0] for p in (out / "raw").glob("*.r2.json")}
    assert len(ids) == 2
    by_cfg = bench_report.by_config(bench_report.read_records(out / "results.json"))
    assert set(by_cfg) == ids
    for cid, metrics in by_cfg.items():
        rounds = [json.loads((out / "raw" / f"{stem}.json").read_text()) for stem in (cid, f"{cid}.r2")]
        assert [r["round"] for r in rounds] == [1, 2]  # the spec names its round
        e2e = [r["samples"]["e2e_ms"][0] for r in rounds]
        m = metrics["e2e_ms"]
        assert m["rounds"] == 2 and m["median"] == max(e2e)
        assert m["round_spread"] == pytest.approx(max(e2e) / min(e2e) - 1)
        # every metric comes from that round's samples: TTFT and TPOT too
        best = rounds[1 if e2e[1] >= e2e[0] else 0]
        assert metrics["ttft_ms"]["median"] == best["samples"]["ttft_ms"][0]
    # every round's medians beside the records, the reported one marked
    with (out / "rounds.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["config_id"], r["round"]) for r in rows) == sorted((c, k) for c in ids for k in ("1", "2"))
    for r in rows:
        kept = float(r["e2e_ms"]) == by_cfg[r["config_id"]]["e2e_ms"]["median"]
        assert (r["kept"] == "True") == kept and float(r["predicted_e2e_ms"]) > 0
    # run again: both rounds are finished, nothing runs
    rc, s, err = _bench(smoke["model"], out, "--rounds", "2")
    assert rc == 0 and s["launched"] == 0 and s["done_before"] == 4


def test_ab_replays_a_cell_in_one_process(smoke: dict[str, Any], tmp_path: Path) -> None:
    # bench/scripts/bench_ab.py loads the cell's placements side by side (each with its own rpc-server)
    # and alternates their generations; every placement's e2e is paired with optimal's per round
    out = tmp_path / "run"
    shutil.copytree(smoke["out"], out)
    script = Path(__file__).resolve().parents[1] / "bench" / "scripts" / "bench_ab.py"
    p = subprocess.run([sys.executable, str(script), str(out), "--rounds", "2"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((out / "ab" / "ab.json").read_text())
    assert doc["meta"]["rounds"] == 2 and len(doc["cells"]) == 1
    cell = doc["cells"][0]
    assert (cell["prompt"], cell["gen"], cell["budget"]) == (32, 4, "75%")
    labels = sorted(lab for pl in cell["placements"] for lab in pl["labels"])
    assert labels == ["layers", "optimal"]  # one load per distinct placement: both strategies covered
    for pl in cell["placements"]:
        assert len(pl["samples"]) == 2 and all(s["e2e_ms"] > s["ttft_ms"] > 0 for s in pl["samples"])
        raw = json.loads((out / "raw" / f"{pl['config_id']}.json").read_text())
        assert pl["predicted"]["e2e_ms"] == raw["plan"]["predicted"]["e2e_ms"]
    md = (out / "ab" / "ab.md").read_text()
    assert "budget 75%" in md and ("| optimal" in md or "= optimal" in md)
    assert "cell(s)." in md
    # layers' predicted ratio to optimal set against its measured one (none when both are one placement)
    assert ("over 1 placement(s)" in md) == (len(cell["placements"]) == 2)
    (out / "ab" / "ab.md").unlink()
    again = subprocess.run([sys.executable, str(script), str(out), "--markdown-only"], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and (out / "ab" / "ab.md").read_text() == md  # from ab.json, nothing measured
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nothing")], capture_output=True, text=True)
    assert bad.returncode != 0 and "no raw results" in bad.stderr


def test_median_round_by_hand() -> None:
    def doc(rnd: int, e2e: list[float]) -> dict[str, Any]:
        return {"id": "c", "round": rnd, "samples": {"e2e_ms": e2e, "ttft_ms": e2e, "tpot_ms": []},
                "profile_key": f"p{rnd}", "plan": {"predicted": {"e2e_ms": 100.0 * rnd}}}

    one = doc(1, [5.0])
    assert bench_report.median_round([one]) is one
    three = [doc(2, [9.0, 8.0, 10.0]), doc(1, [12.0, 11.0, 13.0]), doc(3, [10.0, 10.0, 9.0])]
    got = bench_report.median_round(three)
    assert got["round"] == 3 and got["rounds"] == 3 and got["round_e2e_ms"] == [12.0, 9.0, 10.0]
    assert [r["e2e_ms"] for r in got["round_medians"]] == [12.0, 9.0, 10.0]
    # each round with its own plan's prediction and profile (--reprofile costs every round anew)
    assert [(r["predicted_e2e_ms"], r["profile_key"]) for r in got["round_medians"]] == [
        (100.0, "p1"), (200.0, "p2"), (300.0, "p3")]
    assert bench_report.median_round(three[:2])["round"] == 1  # of two, the slower


def test_time_limit_stops_cleanly_and_a_rerun_finishes(synth_model, tmp_path: Path) -> None:
    model = synth_model("tiny", "q8_0")
    out = tmp_path / "run"
    rc, s, err = _bench(model, out, "--strategies", "layers", "--max-minutes", "0.0001")
    assert rc == 0 and s["launched"] == 0 and s["remaining"] == 1
    assert "incomplete: 1 configuration(s) left" in err
    assert (out / "results.json").exists() and json.loads((out / "results.json").read_text()) == []
    rc, s, err = _bench(model, out, "--strategies", "layers")
    assert rc == 0 and s["launched"] == 1 and s["remaining"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--strategies", "layers,magic"], "strategy 'magic'"),
    (["--gpu-budget", "12 GB"], "budget '12 GB'"),
    (["--prompt", "32,lots"], "--prompt: '32,lots'"),
    (["--gen", "0"], "--gen"),
    (["--reps", "0"], "--reps"),
    (["--anchor", "100,4"], "--anchor"),
    (["--rpc-cpus", "4096"], "--rpc-cpus 4096: this process may use CPUs"),
    (["--rpc-cpus", ",".join(map(str, sorted(os.sched_getaffinity(0))))], "leaving the client at least one"),
])
def test_bad_input_exits_2_with_a_clear_message(synth_model, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                args: list[str], message: str) -> None:
    out = tmp_path / "run"
    try:  # a value argparse cannot convert exits from the parser, a value the options refuse returns 2
        rc = cli.main(["bench", str(synth_model("tiny", "q8_0")), *GRID, *args, "-o", str(out)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert "oallama bench: error:" in err and message in err
    assert not out.exists()  # nothing ran


def test_missing_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["bench", str(tmp_path / "none.gguf"), *GRID, "-o", str(tmp_path / "run")])
    assert rc == 2 and "none.gguf" in capsys.readouterr().err


def test_grids_and_variants(tmp_path: Path) -> None:
    o = bench.BenchOptions(models=[tmp_path / "m.gguf"], out=tmp_path, prompts=[32, 64, 128], gens=[32, 64],
                           grid="sweep")
    assert o.workloads() == [(64, 32), (32, 32), (128, 32), (64, 64)]  # the paper's 64/32 first
    o.grid = "full"
    assert o.workloads()[0] == (64, 32) and len(o.workloads()) == 6
    o.anchor = (128, 64)
    assert o.workloads()[0] == (128, 64)
    assert [s for s, _ in o.variants()] == ["layers", "fit", "flexgen", "n-cpu-moe", "affinity", "optimal"]
    o.op_offload = "both"
    assert [(s, oo) for s, oo in o.variants() if not oo] == [("layers", False), ("fit", False)]
    o.op_offload = "off"
    assert all(not oo for _, oo in o.variants()) and "flexgen" not in [s for s, _ in o.variants()]


def test_the_catalogue_has_a_line_per_result_set_from_its_own_files(smoke: dict[str, Any], tmp_path: Path) -> None:
    from oallama.bench import catalogue

    root = tmp_path / "results"
    root.mkdir()
    grid = root / "2026-01-02-vm-grid"
    shutil.copytree(smoke["out"], grid)
    note = root / "2026-01-03-vm-experiment"
    note.mkdir()
    (note / "README.md").write_text("# Splits cost 40 us on this machine\n\nHow it was measured.\n")
    (root / "README.md").write_text("stale")
    path = catalogue.write_catalogue(root)
    rows = [ln for ln in path.read_text().splitlines() if ln.startswith("| [")]
    assert len(rows) == 2  # one per set, the catalogue itself not a set
    records = bench_report.read_records(grid / "results.json")
    n = len({r["config_id"] for r in records})
    assert rows[0].startswith("| [2026-01-02-vm-grid](2026-01-02-vm-grid/) | 2026-01-02 | bench grid |")
    assert f"{n} configurations of tiny-q8_0" in rows[0] and "e2e error median" in rows[0]
    assert rows[1].startswith("| [2026-01-03-vm-experiment](2026-01-03-vm-experiment/) | 2026-01-03 | experiment |")
    assert "Splits cost 40 us on this machine" in rows[1]


# --- bookkeeping beside the measurements (issue 13) ---------------------------------------------


def test_smoke_run_saves_profile_predictions_and_load(smoke: dict[str, Any]) -> None:
    out = smoke["out"]
    records = bench_report.read_records(out / "results.json")
    by_cfg = bench_report.by_config(records)
    # the profile every plan was costed with, saved beside the results and named in every record
    keys = {r["profile_key"] for r in records}
    assert len(keys) == 1 and all(keys)
    (key,) = keys
    prof = json.loads((out / "profiles" / f"{key}.json").read_text())
    assert prof["key"].startswith(key) and prof["ops"]
    # 1-minute load average at the start and end of every configuration
    for r in records:
        assert isinstance(r["load_avg_start"], float) and isinstance(r["load_avg_end"], float)
        assert r["load_avg_start"] >= 0 and r["load_avg_end"] >= 0
    # the host's speed around every configuration's runs against the profile's (the reference op
    # timed in the worker and in the profile, minutes apart on one machine: near 1, never 0)
    assert set(prof["host_speed"]) == {"reference", "before", "after"}
    for r in records:
        for f in ("host_speed", "acc_speed"):  # the host and the rpc-server
            assert isinstance(r[f], float) and 0.2 < r[f] < 5
    raw = json.loads(next(p for p in (out / "raw").glob("*.json")
                          if not p.name.endswith((".spec.json", ".plan.json"))).read_text())
    assert set(raw["host_speed"]["before"]) == set(prof["host_speed"]["before"]) == {"host", "accelerator"}
    assert "## Device speed against the profile" in (out / "summary.md").read_text()
    # the whole prediction, per pass, for every configuration; the same passes as flat CSV rows
    predicted = json.loads((out / "predicted.json").read_text())
    assert set(predicted) == set(by_cfg)
    for cid, pred in predicted.items():
        assert pred["e2e_ms"] == pytest.approx(by_cfg[cid]["e2e_ms"]["predicted"])
        assert "1" in pred["passes"] and "32" in pred["passes"]  # decode and the 32-token prompt
        assert {"compute_ms", "copy_ms", "launch_ms", "splits"} <= set(pred["passes"]["1"])
    with (out / "predicted_passes.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames[:8] == ["config_id", "model", "strategy", "op_offload", "budget", "prompt", "gen",
                                     "n_tokens"]
    assert "compute_ms" in reader.fieldnames and "copy_bytes" in reader.fieldnames
    assert len(rows) == sum(len(p["passes"]) for p in predicted.values())
    for row in rows:
        assert float(row["compute_ms"]) == pytest.approx(predicted[row["config_id"]]["passes"][row["n_tokens"]]
                                                         ["compute_ms"])
    # raw/ is not needed to commit these: they are small
    assert sum(p.stat().st_size for p in [out / "predicted.json", out / "predicted_passes.csv",
                                          *(out / "profiles").iterdir()]) < 1 << 20


def test_summary_has_prediction_error_and_measured_winner(smoke: dict[str, Any]) -> None:
    md = (smoke["out"] / "summary.md").read_text()
    records = bench_report.read_records(smoke["out"] / "results.json")
    assert "## Prediction error" in md
    assert "| device | strategy | metric | configs | median | p90 | max |" in md
    for series, n in (("layers", 1), ("optimal", 1), ("**all**", 2)):
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            assert f"| rpc | {series} | {metric} | {n} |" in md, (series, metric)
    # exactly one bold (winning) end-to-end time in the one (model, workload, budget) cell: the lowest
    e2e = [r for r in records if r["metric"] == "e2e_ms"]
    best = min(e2e, key=lambda r: r["median"])
    assert re.findall(r"\*\*[\d.]+ ± [\d.]+\*\*", md) == [f"**{best['median']:.1f} ± {best['stddev']:.1f}**"]
    assert "## Optimal against the best other strategy" in md


def test_bench_report_prints_the_error_table(smoke: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(smoke["out"], out)
    p = subprocess.run([sys.executable, "-m", "oallama", "bench-report", str(out), "--no-plots"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "## Prediction error" in p.stdout and "| rpc | **all** | ttft_ms |" in p.stdout
    assert "predicted.json" in p.stdout and "predicted_passes.csv" in p.stdout


def test_old_raw_results_still_aggregate(smoke: dict[str, Any], tmp_path: Path) -> None:
    """Raw results of runs before profile_key, load averages, placement_key and the per-pass
    prediction were recorded: records get None there, and what the plan file still in raw/ holds
    (placement, profile, per-pass prediction) is filled in from it."""
    out = tmp_path / "run"
    shutil.copytree(smoke["out"], out, ignore=shutil.ignore_patterns("profiles", "*.png"))
    for raw in (out / "raw").glob("*.json"):
        if raw.name.count(".") != 1:
            continue
        doc = json.loads(raw.read_text())
        for k in ("profile_key", "load_avg_start", "load_avg_end", "placement_key"):
            doc.pop(k)
        doc["plan"]["predicted"] = {k: doc["plan"]["predicted"][k] for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
        assert all(r["profile_key"] is None and r["load_avg_end"] is None
                   for r in bench_report.records_from_raw(doc))
        raw.write_text(json.dumps(doc))
    bench_report.write_outputs(out, plots=False)
    new = bench_report.read_records(out / "results.json")
    old = bench_report.read_records(smoke["out"] / "results.json")
    assert [(r["config_id"], r["metric"], r["placement_key"], r["profile_key"]) for r in new] == \
        [(r["config_id"], r["metric"], r["placement_key"], r["profile_key"]) for r in old]
    assert all(r["load_avg_start"] is None for r in new)
    assert json.loads((out / "predicted.json").read_text()) == json.loads((smoke["out"] / "predicted.json").read_text())
    # a CSV written before the new columns (they are the last ones) still reads
    csv_old = out / "old.csv"
    cols = bench_report.COLUMNS[:bench_report.COLUMNS.index("profile_key")]
    with csv_old.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(old)
    back = bench_report.read_records(csv_old)
    assert len(back) == len(old) and "profile_key" not in back[0]
    assert bench_accuracy.prediction_errors(back) == bench_accuracy.prediction_errors(old)


def test_reprofile_measures_the_profile_afresh(smoke: dict[str, Any], tmp_path: Path) -> None:
    (key,) = {r["profile_key"] for r in bench_report.read_records(smoke["out"] / "results.json")}
    cached = json.loads((smoke["out"] / "profiles" / f"{key}.json").read_text())
    out = tmp_path / "run"
    rc, s, err = _bench(smoke["model"], out, "--strategies", "layers", "--reprofile")
    assert rc == 0 and s["launched"] == 1, err[-3000:]
    assert "--reprofile: measuring the profile" in err and "profile: reusing" not in err
    (rec_key,) = {r["profile_key"] for r in bench_report.read_records(out / "results.json")}
    assert rec_key == key  # same model, devices and settings: the same key, a new measurement
    fresh = json.loads((out / "profiles" / f"{key}.json").read_text())
    assert fresh["created"] > cached["created"]
    # the plan was costed with it
    (plan,) = (json.loads(p.read_text()) for p in (out / "raw").glob("*.plan.json"))
    assert plan["profile"] == fresh["key"]
    # saved again into a directory holding the other measurement under that key: both are kept
    from oallama.bench import profiles as bench_profiles
    from oallama.planner.cost.profile import Profile

    other = bench_profiles.save(out, Profile.load(smoke["out"] / "profiles" / f"{key}.json"))
    assert other == f"{key}-{int(cached['created'])}" and (out / "profiles" / f"{other}.json").exists()
    assert bench_profiles.save(out, Profile.load(out / "profiles" / f"{key}.json")) == key


# --- the accuracy computations, on records built here -------------------------------------------


def _rec(cid: str, metric: str, median: float, predicted: float | None, **kw: Any) -> dict[str, Any]:
    base = {"config_id": cid, "metric": metric, "median": median, "predicted": predicted, "stddev": 0.0,
            "device_kind": "rpc", "device": "RPC[127.0.0.1:5000]", "strategy": "layers", "series": "layers",
            "model": "m", "model_identity": "abc", "machine": "vm", "prompt": 64, "gen": 32, "budget": "50%",
            "op_offload": True, "threads": 1, "n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "flash_attn": False,
            "mmap": True}
    return {**base, **kw}


def test_prediction_errors_median_p90_max_by_hand() -> None:
    import numpy as np

    # rpc/layers TTFT: measured 100 each, predicted 110, 80, 100, 150, 70 -> |errors| 0.1, 0.2, 0,
    # 0.5, 0.3; sorted 0, 0.1, 0.2, 0.3, 0.5: median 0.2; p90 at rank 0.9 * 4 = 3.6, between 0.3
    # and 0.5: 0.3 + 0.6 * 0.2 = 0.42; max 0.5; signed errors 0.1, -0.2, 0, 0.5, -0.3: bias 0
    recs = [_rec(f"l{i}", "ttft_ms", 100.0, p) for i, p in enumerate([110.0, 80.0, 100.0, 150.0, 70.0])]
    # rpc/optimal TTFT: measured 50, 200; predicted 60, 150 -> 0.2, 0.25: median 0.225, p90
    # 0.2 + 0.9 * 0.05 = 0.245, max 0.25, bias (0.2 - 0.25) / 2 = -0.025
    recs += [_rec("o1", "ttft_ms", 50.0, 60.0, strategy="optimal", series="optimal"),
             _rec("o2", "ttft_ms", 200.0, 150.0, strategy="optimal", series="optimal")]
    # another device class; and records left out: no prediction, a measured 0, a metric not compared
    recs += [_rec("c1", "ttft_ms", 10.0, 12.0, device_kind="cpu"), _rec("x1", "ttft_ms", 10.0, None),
             _rec("x2", "tpot_ms", 0.0, 1.0), _rec("x3", "load_s", 1.0, 5.0)]
    rows = {(r["device_kind"], r["strategy"], r["metric"]): r for r in bench_accuracy.prediction_errors(recs)}
    assert list(rows) == [("cpu", "layers", "ttft_ms"), ("cpu", "all", "ttft_ms"), ("rpc", "layers", "ttft_ms"),
                          ("rpc", "optimal", "ttft_ms"), ("rpc", "all", "ttft_ms")]
    lay = rows[("rpc", "layers", "ttft_ms")]
    assert lay["count"] == 5
    assert (lay["median"], lay["p90"], lay["max"], lay["bias"]) == pytest.approx((0.2, 0.42, 0.5, 0.0))
    opt = rows[("rpc", "optimal", "ttft_ms")]
    assert (opt["count"], opt["median"], opt["p90"], opt["max"], opt["bias"]) == pytest.approx(
        (2, 0.225, 0.245, 0.25, -0.025))
    alls = rows[("rpc", "all", "ttft_ms")]
    errs = [0.1, 0.2, 0.0, 0.5, 0.3, 0.2, 0.25]
    assert alls["count"] == 7 and alls["median"] == pytest.approx(0.2) and alls["max"] == pytest.approx(0.5)
    assert alls["p90"] == pytest.approx(0.38) == pytest.approx(float(np.percentile(errs, 90)))  # 0.3 + 0.4 * 0.2
    assert rows[("cpu", "all", "ttft_ms")]["median"] == pytest.approx(0.2)
    md = "\n".join(bench_accuracy.errors_markdown(bench_accuracy.prediction_errors(recs)))
    assert "| rpc | layers | ttft_ms | 5 | 20.0% | 42.0% | 50.0% | 0.0% |" in md
    assert "| rpc | optimal | ttft_ms | 2 | 22.5% | 24.5% | 25.0% | -2.5% |" in md
    for q in (0, 10, 50, 90, 100):
        assert bench_accuracy.percentile(errs, q) == pytest.approx(float(np.percentile(errs, q)))
    assert bench_accuracy.percentile([3.0], 90) == 3.0


def test_identical_placements_measured_twice_must_agree_within_5_percent() -> None:
    same = {"placement_key": "p1"}
    recs = [
        # layers and fit, the same placement: TTFT 4% apart (agrees), TPOT 6% apart (noisy)
        _rec("a", "ttft_ms", 100.0, 90.0, **same), _rec("a", "tpot_ms", 10.0, 9.0, **same),
        _rec("b", "ttft_ms", 104.0, 90.0, strategy="fit", series="fit", budget="75%", **same),
        _rec("b", "tpot_ms", 10.6, 9.0, strategy="fit", series="fit", budget="75%", **same),
        # measured in a later (resumed) run: another rpc-server port, the same device; 20% apart
        _rec("c", "tpot_ms", 12.0, 9.0, strategy="affinity", device="RPC[127.0.0.1:6000]", **same),
        # not the same measurement: another placement, another workload, other settings, no key
        _rec("d", "tpot_ms", 20.0, 9.0, placement_key="p2"),
        _rec("e", "tpot_ms", 20.0, 9.0, prompt=128, **same),
        _rec("f", "tpot_ms", 20.0, 9.0, threads=2, **same),
        _rec("g", "tpot_ms", 20.0, 9.0),
    ]
    pairs = bench_accuracy.compare_repeats(recs)
    got = {(p["a"], p["b"], p["metric"]): (round(p["diff"], 6), p["noisy"]) for p in pairs}
    assert got == {("a", "b", "ttft_ms"): (0.04, False), ("a", "b", "tpot_ms"): (0.06, True),
                   ("a", "c", "tpot_ms"): (0.2, True), ("b", "c", "tpot_ms"): (round(12 / 10.6 - 1, 6), True)}
    md = "\n".join(bench_accuracy.noisy_markdown(recs))
    assert "## Noisy" in md and "3 of 4 comparison(s)" in md
    assert "| m | 64 / 32 | tpot_ms | layers @50% | 10.00 | fit @75% | 10.60 | 6.0% |" in md
    quiet = [r for r in recs if r["config_id"] in "ab" and r["metric"] == "ttft_ms"]
    assert "## Noisy" not in "\n".join(bench_accuracy.noisy_markdown(quiet))
    assert any("noisy: m prompt 64 gen 32" in line for line in bench_accuracy.warning_lines(recs))


def test_configurations_whose_rounds_disagree_are_listed() -> None:
    recs = [
        _rec("a", "e2e_ms", 100.0, 90.0, rounds=3, round_spread=0.04),  # within 5%
        _rec("b", "e2e_ms", 120.0, 90.0, rounds=3, round_spread=0.5, strategy="fit", series="fit"),
        _rec("c", "e2e_ms", 110.0, 90.0, rounds=2, round_spread=0.08, strategy="optimal", series="optimal"),
        _rec("c", "tpot_ms", 11.0, 9.0, rounds=2, round_spread=0.08),  # e2e only
        _rec("d", "e2e_ms", 110.0, 90.0),  # one round: nothing to compare
    ]
    n, off = bench_accuracy.round_disagreements(recs)
    assert n == 3 and [r["config_id"] for r in off] == ["b", "c"]  # largest spread first
    md = "\n".join(bench_accuracy.rounds_markdown(recs))
    assert "2 of 3 configuration(s)" in md
    assert "| m | 64 / 32 | fit | 50% | 3 | 120.00 | 50.0% |" in md
    calm = "\n".join(bench_accuracy.rounds_markdown(recs[:1]))
    assert "## Rounds that disagree" not in calm and "all 1 configuration(s)" in calm
    assert bench_accuracy.rounds_markdown(recs[-1:]) == []


def test_placement_key_sees_what_the_load_does() -> None:
    plan = {"accelerator": "RPC[127.0.0.1:5000]", "placement": {"a": "RPC[127.0.0.1:5000]", "b": "CPU"},
            "n_gpu_layers": 1, "kv_layers": 1, "offload_min_batch": {"b": 32}, "strategy": "layers"}
    key = bench_accuracy.placement_key(plan)
    moved = {**plan, "accelerator": "RPC[127.0.0.1:6000]", "placement": {"b": "CPU", "a": "RPC[127.0.0.1:6000]"},
             "strategy": "fit", "predicted": {"e2e_ms": 1.0}}
    assert bench_accuracy.placement_key(moved) == key  # another port, order, strategy, prediction
    for change in ({"placement": {"a": "CPU", "b": "CPU"}}, {"n_gpu_layers": 2}, {"kv_layers": 0},
                   {"offload_min_batch": {"b": None}}):
        assert bench_accuracy.placement_key({**plan, **change}) != key, change


def test_measured_winner_and_optimal_behind() -> None:
    recs = [_rec("l", "e2e_ms", 100.0, 90.0), _rec("f", "e2e_ms", 95.0, 90.0, strategy="fit", series="fit"),
            _rec("o", "e2e_ms", 98.0, 80.0, strategy="optimal", series="optimal"),  # 3.2% behind fit
            _rec("l2", "e2e_ms", 100.0, 90.0, budget="75%"),
            _rec("o2", "e2e_ms", 102.9, 80.0, strategy="optimal", series="optimal", budget="75%"),  # 2.9%
            _rec("o3", "e2e_ms", 50.0, 80.0, strategy="optimal", series="optimal", budget="25%")]  # alone
    assert bench_accuracy.measured_winners(recs) == {("m", 64, 32, "50%"): "f", ("m", 64, 32, "75%"): "l2",
                                                     ("m", 64, 32, "25%"): "o3"}
    compared, behind = bench_accuracy.optimal_behind(recs)
    assert compared == 2 and len(behind) == 1
    b = behind[0]
    assert (b["budget"], b["best"], b["best_ms"], b["optimal_ms"]) == ("50%", "fit", 95.0, 98.0)
    assert b["behind"] == pytest.approx(98 / 95 - 1)
    assert b["same_placement"] is False
    md = "\n".join(bench_accuracy.optimal_markdown(recs))
    assert "in 1 of 2 cell(s)" in md and "| m | 64 / 32 | 50% | 98.0 (80.0) | fit | 95.0 (90.0) | +3.2% | no |" in md
    assert "very placement" not in md
    # the same placement under both strategies: the gap is marked as the run's noise
    same = [{**r, "placement_key": "k1"} if r["config_id"] in ("f", "o") else r for r in recs]
    assert bench_accuracy.optimal_behind(same)[1][0]["same_placement"] is True
    md = "\n".join(bench_accuracy.optimal_markdown(same))
    assert "| +3.2% | yes |" in md and "In 1 of them `optimal` loaded the very placement" in md


def test_configurations_measured_under_load_are_flagged() -> None:
    recs = [_rec("a", "e2e_ms", 1.0, 1.0, load_avg_start=0.4, load_avg_end=1.6),
            _rec("a", "ttft_ms", 1.0, 1.0, load_avg_start=0.4, load_avg_end=1.6),
            _rec("b", "e2e_ms", 1.0, 1.0, load_avg_start=1.5, load_avg_end=0.2),
            _rec("c", "e2e_ms", 1.0, 1.0, load_avg_start=2.5, load_avg_end=None),
            _rec("d", "e2e_ms", 1.0, 1.0)]  # an older run: not recorded
    busy = bench_accuracy.high_load(recs)
    assert [(b["config_id"], b["load"]) for b in busy] == [("c", 2.5), ("a", 1.6)]
    assert "redo: measured at load 2.50" in bench_accuracy.warning_lines(recs)[0]
    md = "\n".join(bench_accuracy.load_markdown(recs))
    assert "2 configuration(s)" in md and "redo: measured at load 1.60" in md
    assert bench_accuracy.load_markdown(recs[2:3]) == []
    # the limit scales with the machine's cores: a 16-core machine running the bench's 8 threads
    big = [_rec("e", "e2e_ms", 1.0, 1.0, load_avg_start=6.5, load_avg_end=8.0, cpu_count=16),
           _rec("f", "e2e_ms", 1.0, 1.0, load_avg_start=12.5, load_avg_end=9.0, cpu_count=16)]
    assert [(b["config_id"], b["limit"]) for b in bench_accuracy.high_load(big)] == [("f", 12.0)]
    assert "above 12)" in bench_accuracy.warning_lines(big)[0]


def test_configurations_measured_off_the_profiles_device_speed_are_listed() -> None:
    # a: as fast as profiled; b: the host 20% slower; c: the accelerator 30% faster; d: an older run
    # without a speed; e: an older run with the host's alone
    recs = [_rec("a", "tpot_ms", 10.0, 11.0, host_speed=1.02, acc_speed=0.95),
            _rec("a", "e2e_ms", 100.0, 90.0, host_speed=1.02, acc_speed=0.95),
            _rec("b", "tpot_ms", 10.0, 8.0, host_speed=0.8, acc_speed=1.0),
            _rec("b", "e2e_ms", 100.0, 70.0, host_speed=0.8, acc_speed=1.0),
            _rec("c", "tpot_ms", 10.0, 14.0, host_speed=1.05, acc_speed=1.3),
            _rec("c", "e2e_ms", 100.0, 150.0, host_speed=1.05, acc_speed=1.3),
            _rec("d", "tpot_ms", 10.0, 30.0), _rec("e", "tpot_ms", 10.0, 10.5, host_speed=1.0)]
    speeds, off = bench_accuracy.host_drift(recs)
    assert sorted(speeds["host_speed"]) == [0.8, 1.0, 1.02, 1.05] and sorted(speeds["acc_speed"]) == [0.95, 1.0, 1.3]
    assert [o["config_id"] for o in off] == ["c", "b"]  # the farthest first
    md = "\n".join(bench_accuracy.host_speed_markdown(recs))
    assert "the host 0.80-1.05 (median 1.01); the accelerator 0.95-1.30 (median 1.00)" in md
    assert "2 of 4 configuration(s)" in md and "- m layers @50% prompt 64 gen 32: 1.05 / 1.30 (c)" in md
    # near: a, e (TPOT 10%, 5%; e2e 10%); far: b and c (TPOT 20%, 40%; e2e 30%, 50%)
    assert "| within 10% | 2 | - | 7.5% / 9.5% | 10.0% / 10.0% |" in md
    assert "| more than 10% off | 2 | - | 30.0% / 38.0% | 40.0% / 48.0% |" in md
    assert bench_accuracy.host_speed_markdown(recs[6:7]) == []  # nothing recorded: no section


def test_predicted_passes_carry_every_numeric_key() -> None:
    predicted = {"c1": {"e2e_ms": 3.0, "passes": {"64": {"compute_ms": 2.0, "splits": 3, "new_ms": 0.5,
                                                         "note": "x", "flag": True},
                                                  "1": {"compute_ms": 1.0, "splits": 1},
                                                  "4x1": {"compute_ms": 1.5, "splits": 1}}},
                 "c2": {"e2e_ms": 1.0}}
    configs = {"c1": {"model_name": "m", "strategy": "optimal", "op_offload": True, "budget": "50%",
                      "prompt": 64, "gen": 8}}
    cols, rows = bench_accuracy.predicted_passes(predicted, configs)
    assert cols == ["config_id", "model", "strategy", "op_offload", "budget", "prompt", "gen", "n_tokens",
                    "n_seqs", "compute_ms", "splits", "new_ms"]
    # a decode pass of 4 sequences ("4x1": 4 sequences of 1 token) after the one-sequence passes of 4 or fewer
    assert [(r["n_tokens"], r["n_seqs"], r["compute_ms"], r.get("new_ms")) for r in rows] == [
        (1, 1, 1.0, None), (4, 4, 1.5, None), (64, 1, 2.0, 0.5)]
    assert rows[0]["strategy"] == "optimal" and rows[0]["budget"] == "50%"


def test_rpc_cpus_place_the_local_server_only(tmp_path: Path) -> None:
    from oallama.bench.harness import BenchOptions
    from oallama.errors import PlanError

    with pytest.raises(PlanError, match="--rpc-cpus places the --rpc-local server"):
        BenchOptions(models=[tmp_path / "m.gguf"], rpc_cpus=(0,)).check()


def test_a_worker_s_host_peak_is_its_own() -> None:
    """A process spawned after its parent held 400 MiB reports its own peak, not the parent's (Python's
    subprocess spawns by vfork, and getrusage's ru_maxrss keeps the parent's peak across the exec)."""
    held = bytearray(400 << 20)
    held[::4096] = b"\1" * len(range(0, len(held), 4096))  # touched: resident
    del held
    code = "from oallama.runtime.devices import peak_rss_bytes; print(peak_rss_bytes())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert 0 < int(r.stdout) < 300 << 20, r.stdout
