"""The benchmark harness (`oallama bench`), smoke-tested on the tiny model with a loopback
rpc-server as the accelerator: record schema, CSV, Markdown, plots, resume, clean stop, bad
input. No timing assertions: on CPU + rpc-server the timings mean nothing."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oallama import cli
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
    for metrics in by_cfg.values():
        for m in TIMED:
            assert metrics[m]["n"] == 1 and metrics[m]["predicted"] is not None and metrics[m]["median"] > 0
        assert metrics["device_planned_bytes"]["source"].startswith("llama.cpp accounting")
        assert metrics["device_peak_bytes"]["source"].startswith("rpc-server")
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
    assert [s for s, _ in o.variants()] == ["layers", "fit", "flexgen", "affinity", "optimal"]
    o.op_offload = "both"
    assert [(s, oo) for s, oo in o.variants() if not oo] == [("layers", False), ("fit", False)]
    o.op_offload = "off"
    assert all(not oo for _, oo in o.variants()) and "flexgen" not in [s for s, _ in o.variants()]


def test_readme_section_is_replaced_between_markers(smoke: dict[str, Any], tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# oallama\n\nIntro.\n")
    bench_report.update_readme(readme, [smoke["out"]])
    text = readme.read_text()
    assert text.startswith("# oallama\n\nIntro.\n\n## Results\n\n<!-- bench:begin -->\n")
    # an rpc-server run gets no speed-up column (its ratio would read as a claim)
    assert "| model | prompt / gen | budget | layers | optimal |\n" in text and "No GPU results yet" in text
    assert "| tiny-q8_0 | 32 / 4 | 75% |" in text
    readme.write_text(text.replace("Intro.", "Intro, edited.") + "\n## Later\n\nMore.\n")
    bench_report.update_readme(readme, [smoke["out"]])
    again = readme.read_text()
    assert again.count(bench_report.README_BEGIN) == 1 and again.count("## Results") == 1
    assert "Intro, edited." in again and again.endswith("<!-- bench:end -->\n\n## Later\n\nMore.\n")
