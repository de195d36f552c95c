#!/usr/bin/env python3
"""Benchmark of the distributed planner (issue 7): solver time, and measured vs predicted
TTFT / per-token latency of the MILP plan against llama.cpp's memory-proportional split and an
equal split, on loopback and on emulated networks (bench/scripts/netem_scenario.py).

    python bench/scripts/bench_distributed.py solver  -o DIR      80 blocks x 8 devices: time to solve
    python bench/scripts/bench_distributed.py loopback -o DIR     two rpc-servers on loopback (no root)
    sudo python bench/scripts/bench_distributed.py scenarios -o DIR [bench/scripts/scenarios/*.json]
                                                            each scenario in its namespaces
    python bench/scripts/bench_distributed.py report -o DIR       results.csv + summary.md from the JSON
    sudo python bench/scripts/bench_distributed.py all            all of it, into
                                                            bench/results/<date>-<host>/distributed/

(`client` is what runs inside a scenario's client namespace.) The model is a synthetic GGUF:
llama-shaped, n_embd 1024, 16 blocks, q8_0 (~220 MB), written once under the cache folder.
Emulated devices share this host's CPU and RAM: each rpc-server gets the scenario's thread
count, and the memory a device offers is the scenario's (written into the devices file the
planner reads). Timings are medians over --reps generations after a warm-up, each request
after 1 s of idle link (a user's next prompt: a CUBIC or Reno kernel restarts slow start, BBR does
not; the devices file records the client's settings and the model follows them).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

import oallama  # noqa: F401  (points llama_cpp at oallama's libraries)
from oallama import cluster as D
from oallama.cluster import probe
from oallama.cluster.problem import flops_at
from oallama.model import synthetic
from oallama.runtime import rpc
from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)

HERE = Path(__file__).resolve().parent
STRATEGIES = ("milp", "memory", "equal")
MODEL_PRESET = "mid"
N_PROMPT, N_GEN, N_CTX = 32, 16, 256
IDLE_S = 1.0  # pause before each timed request (s): longer than TCP's retransmission timeout (a CUBIC or
# Reno kernel restarts slow start, as modelled; BBR keeps its window)


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "gpu": "none",
            "python": platform.python_version(), "platform": platform.platform(), "commit": git_commit()}


def default_out() -> Path:
    return HERE.parent / "bench" / "results" / f"{date.today().isoformat()}-{platform.node()}" / "distributed"


def cache_dir() -> Path:
    base = os.environ.get("OALLAMA_CACHE") or os.path.join(os.path.expanduser("~/.cache"), "oallama")
    return Path(base) / "bench-distributed"


def bench_model() -> Path:
    """A llama-shaped q8_0 model big enough that compute and transfers both matter here (the "mid"
    preset: n_embd 1024, 16 blocks of 12.5 MB)."""
    path = cache_dir() / f"{MODEL_PRESET}-q8_0.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_model(path, MODEL_PRESET, "q8_0", progress=False)
    return path


# --- solver ----------------------------------------------------------------------------------


def _time(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_solver(out: Path, seeds: int = 3, time_limit: float = 20.0) -> dict[str, Any]:
    """80 blocks x 8 devices: (a) the blocks of an 80-layer qwq-32b-shaped Q4_K_M model (mixed
    Q4_K / Q6_K block sizes, FLOPs and activations from llama.cpp's graph, a metadata-only
    load of a shape-only file) and (b) identical synthetic blocks, on random heterogeneous
    devices; every method, contiguous and not."""
    shape = cache_dir() / "qwq-32b-80L-q4_k_m-shape.gguf"
    if not shape.exists():
        shape.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_model(shape, "qwq-32b", "q4_k_m", n_layer=80, shape_only=True, progress=False)
    real, t_cost = _time(lambda: D.model_cost(shape, (1, 64), n_ctx=4096))
    rows = []
    for seed in range(seeds):
        for kind in ("model-80L", "uniform"):
            cost, cluster = D.synthetic_instance(80, 8, seed, uniform=True)
            if kind == "model-80L":
                # scale the synthetic devices' memory to this model's blocks (same slack)
                ratio = sum(b.memory_bytes for b in real.blocks) / sum(b.memory_bytes for b in cost.blocks)
                cluster = replace(cluster, devices=[replace(d, memory_bytes=int(d.memory_bytes * ratio))
                                                    for d in cluster.devices])
                cost = real
            for contiguous in (True, False):
                p = D.build_problem(cost, cluster, D.DistOptions(contiguous=contiguous))
                methods = [("auto", "segments", True), ("milp", "segments", True), ("milp", "segments", False),
                           ("milp", "assignment", True)]
                ref = None
                for method, form, warm in methods:
                    method_name = "auto (=milp)" if method == "auto" and not contiguous else method
                    sol, t = _time(lambda m=method, f=form, w=warm, p=p: D.solve(
                        p, method=m, formulation=f, warm_start=w, time_limit_s=time_limit))
                    ref = ref if ref is not None else sol.terms.total
                    rows.append({"instance": kind, "seed": seed, "contiguous": contiguous, "method": method_name,
                                 "formulation": form if method != "auto" or not contiguous else "-",
                                 "warm_start": warm, "solver": sol.method, "status": sol.status, "time_s": t,
                                 "objective_ms": sol.terms.total, "gap": sol.mip_gap,
                                 "same_optimum": abs(sol.terms.total - ref) <= 1e-6 * abs(ref),
                                 "devices_used": len(set(sol.assign))})
                    print(f"solver {kind} seed {seed} {'contiguous' if contiguous else 'free':>10} {method_name:>12} "
                          f"{form:>10} warm={warm!s:5} {t * 1e3:8.1f} ms {sol.status}", file=sys.stderr, flush=True)
    doc = {"machine": _machine(), "model_cost_s": t_cost, "model": str(shape.name), "time_limit_s": time_limit,
           "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "solver.json").write_text(json.dumps(doc, indent=1))
    with open(out / "solver.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return doc


# --- client: probe, plan, run ----------------------------------------------------------------


def _prompt_tokens(n: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [1, *(int(t) for t in rng.integers(300, 3000, n - 1))]


def run_client(endpoints: list[str], memory: list[int] | None, label: str, out: Path, *, reps: int,
               scenario: dict[str, Any] | None = None, matmul: int = 4096, flops_only: bool = False) -> dict[str, Any]:
    """Probe the devices, plan with each strategy, run each plan and time it."""
    from oallama.runtime.generate import timed_generate

    model = bench_model()
    print(f"[{label}] probing {', '.join(endpoints)}", file=sys.stderr, flush=True)
    popts = probe.ProbeOptions(matmul_k=matmul, matmul_m=matmul, tokens=(1, N_PROMPT), client_threads=1)
    doc = probe.probe(endpoints, popts, progress=lambda m: print(m, file=sys.stderr, flush=True))
    if memory is not None:  # the emulated devices' memory (they all share this host's RAM)
        for d, mem in zip(doc["devices"], memory, strict=True):
            d["memory_free_measured"] = d["memory_free"]
            d["memory_free"] = mem
            d["memory_source"] = "scenario"
    out.mkdir(parents=True, exist_ok=True)
    devices_path = out / f"devices-{label}.json"
    devices_path.write_text(json.dumps(doc, indent=1))
    cluster = D.read_devices(devices_path)
    opts = D.DistOptions(n_prompt=N_PROMPT, n_gen=N_GEN, n_ctx=N_CTX)
    flops_cost = D.model_cost(model, (1, N_PROMPT), n_ctx=N_CTX)
    # the blocks timed in the real graph on the client (1 thread, as it runs them), unless --flops-only
    cost = flops_cost if flops_only else D.time_blocks(flops_cost, threads=1, n_prompt=N_PROMPT,
                                                                             matmul=cluster.matmul)
    tokens = _prompt_tokens(N_PROMPT)
    results = []
    for strategy in STRATEGIES:
        plan = D.plan(cost, cluster, opts) if strategy == "milp" else D.baseline_plan(strategy, cost, cluster, opts)
        plan.write(out / f"plan-{label}-{strategy}.json")
        pred = plan.predicted()
        pred_flops = D.predict(flops_cost, cluster, plan.assign, opts)
        terms = plan.objective_terms()
        print(f"[{label}] {strategy}: {plan.segments()}", file=sys.stderr, flush=True)
        llm, t_load = _time(lambda p=plan: D.load(p, n_ctx=N_CTX, n_threads=1, n_threads_batch=1, verbose=False))
        try:
            timed_generate(llm, tokens, 4)  # warm-up
            gens = []
            for _ in range(reps):
                time.sleep(IDLE_S)  # a request after an idle link (problem.restarts_after_idle)
                gens.append(timed_generate(llm, tokens, N_GEN))
        finally:
            llm.close()
        ttft = [g.ttft_s for g in gens]
        tpot = [g.tpot_s for g in gens]
        row = {
            "scenario": label, "strategy": strategy,
            "segments": [{"device": d, "first": a, "last": b} for d, a, b in plan.segments()],
            "devices_used": len(plan.pipeline_devices()), "fits": plan.fits() is None, "load_s": t_load,
            "predicted_ttft_s": pred.ttft_s, "predicted_tpot_s": pred.tpot_s, "predicted_stages": pred.stages,
            "predicted_flops_only_ttft_s": pred_flops.ttft_s, "predicted_flops_only_tpot_s": pred_flops.tpot_s,
            "load_avg": os.getloadavg()[0],
            "measured_ttft_s": statistics.median(ttft), "measured_tpot_s": statistics.median(tpot),
            "measured_ttft_samples_s": ttft, "measured_tpot_samples_s": tpot,
            "objective_ms": terms.total, "terms_ms": {"compute": terms.compute, "data": terms.data,
                                                      "complexity": terms.complexity, "qos": terms.qos},
            "solver": asdict_solution(plan.solution),
        }
        print(f"[{label}] {strategy}: TTFT {row['measured_ttft_s'] * 1e3:.1f} ms (pred {pred.ttft_s * 1e3:.1f}), "
              f"TPOT {row['measured_tpot_s'] * 1e3:.2f} ms (pred {pred.tpot_s * 1e3:.2f})", file=sys.stderr, flush=True)
        results.append(row)
    res = {"label": label, "machine": _machine(), "model": {"path": model.name, "n_blocks": cost.n_blocks,
                                                            "block_MiB": cost.blocks[0].memory_bytes / 2**20},
           "workload": {"n_prompt": N_PROMPT, "n_gen": N_GEN, "n_ctx": N_CTX, "reps": reps, "client_threads": 1},
           "scenario": scenario, "devices_file": devices_path.name, "results": results,
           "block_times": cost.times.to_json() if cost.times is not None else None}
    (out / f"result-{label}.json").write_text(json.dumps(res, indent=1))
    return res


def asdict_solution(sol: D.Solution | None) -> dict[str, Any] | None:
    if sol is None:
        return None
    return {"method": sol.method, "status": sol.status, "time_s": sol.time_s}


def run_cpu_reference(reps: int) -> dict[str, Any]:
    """The whole model on this process's CPU (1 thread): what one machine with enough memory
    does, and how much of a token the planner's matmul-only compute term leaves out."""
    from oallama.runtime.generate import timed_generate
    from oallama.runtime.llama import Llama

    model = bench_model()
    llm = Llama(str(model), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, verbose=False)
    tokens = _prompt_tokens(N_PROMPT)
    try:
        timed_generate(llm, tokens, 4)
        gens = [timed_generate(llm, tokens, N_GEN) for _ in range(reps)]
    finally:
        llm.close()
    cost = D.model_cost(model, (1, N_PROMPT), n_ctx=N_CTX)
    client = probe.measure_client(probe.ProbeOptions(matmul_k=4096, matmul_m=4096, tokens=(1, N_PROMPT),
                                                     client_threads=1))
    fl = {int(k): v for k, v in client["flops"].items()}
    matmul = {n: (sum(b.flops[n] for b in cost.blocks) + cost.head_flops[n]) / flops_at(fl, n)
              for n in (1, N_PROMPT)}
    return {"measured_ttft_s": statistics.median(g.ttft_s for g in gens),
            "measured_tpot_s": statistics.median(g.tpot_s for g in gens),
            "matmul_only_ttft_s": matmul[N_PROMPT], "matmul_only_tpot_s": matmul[1]}


def run_loopback(out: Path, reps: int, flops_only: bool = False) -> dict[str, Any]:
    """Two rpc-servers on loopback, no shaping; memory capped so that both are needed; and the
    single-machine reference."""
    model = bench_model()
    need = sum(b.memory_bytes for b in D.model_cost(model, (1, N_PROMPT), n_ctx=N_CTX).blocks)
    ref = run_cpu_reference(reps)
    with rpc.start_server(threads=1) as a, rpc.start_server(threads=1) as b:
        mem = [int(need * 0.45 / 0.9), int(need * 0.75 / 0.9)]
        res = run_client([a.endpoint, b.endpoint], mem, "loopback", out, reps=reps, flops_only=flops_only,
                         scenario={"scenario": "loopback", "description": "two rpc-servers on 127.0.0.1, unshaped",
                                   "devices": [{"name": "d0", "memory_bytes": mem[0]},
                                               {"name": "d1", "memory_bytes": mem[1]}]})
    res["cpu_reference"] = ref
    (out / "result-loopback.json").write_text(json.dumps(res, indent=1))
    return res


def run_scenarios(out: Path, files: list[Path], reps: int, flops_only: bool = False) -> list[dict[str, Any]]:
    check = subprocess.run([sys.executable, str(HERE / "netem_scenario.py"), "check"], capture_output=True, text=True)
    caps = json.loads(check.stdout or "{}")
    (out / "netem-check.json").write_text(json.dumps(caps, indent=1))
    if not caps.get("shaper"):
        print(f"scenarios skipped: {caps.get('reason')}", file=sys.stderr)
        return []
    bench_model()  # written here, read inside the namespaces
    done = []
    for f in files:
        rc = subprocess.run([sys.executable, str(HERE / "netem_scenario.py"), "run", str(f), "--workdir",
                             str(out / "logs" / f.stem), "--", sys.executable, __file__, "client", "-o", str(out),
                             "--reps", str(reps), *(["--flops-only"] if flops_only else [])]).returncode
        if rc != 0:
            print(f"scenario {f.name}: exit {rc}", file=sys.stderr)
            continue
        done.append(json.loads((out / f"result-{json.loads(f.read_text())['name']}.json").read_text()))
    return done


# --- report ----------------------------------------------------------------------------------


def _pct(measured: float, predicted: float) -> str:
    return f"{(predicted - measured) / measured * 100:+.0f}%" if measured > 0 else "-"


def report(out: Path) -> None:
    rows: list[dict[str, Any]] = []
    runs = sorted(out.glob("result-*.json"))
    lines = ["# Distributed inference (issue 7): MILP plan vs llama.cpp's splits", ""]
    machine = _machine()
    lines += [f"Machine: `{machine['host']}`, {machine['cpu']}, {machine['cores']} cores, no GPU. "
              "All devices are rpc-servers on this one machine (sharing its 2 cores and its RAM); the network "
              "between the client and each device is emulated.", ""]
    check = out / "netem-check.json"
    if check.exists():
        caps = json.loads(check.read_text())
        if caps.get("shaper") == "tun":
            lines += ["Network emulation: **tc netem is not available in this kernel** (`" + str(caps.get("netem")) +
                      "`), so each link is a pair of TUN devices joined by `bench/scripts/netem_scenario.py relay`, a "
                      "user-space netem (per-packet Bernoulli loss, delay +- uniform jitter with order kept, "
                      "serialising rate limit, 1000-packet queue, both directions). Namespaces and veth/TUN work "
                      "(root).", ""]
        elif caps.get("shaper") == "netem":
            lines += ["Network emulation: veth pairs shaped with tc netem on both ends.", ""]
        else:
            lines += [f"Network emulation: not possible here ({caps.get('reason')}); scenario runs skipped.", ""]
    for path in runs:
        res = json.loads(path.read_text())
        sc = res.get("scenario") or {}
        lines += [f"## {res['label']}", ""]
        if sc.get("description"):
            lines += [sc["description"], ""]
        lines += ["| device | memory MiB | link (rate, one-way delay, jitter, loss) | probed rtt ms | probed Mbit/s up/down "
                  "| probed jitter ms | probed loss | GFLOP/s @1 / @32 |", "|---|---|---|---|---|---|---|---|"]
        devdoc = json.loads((out / res["devices_file"]).read_text())
        for k, d in enumerate(devdoc["devices"]):
            ln = d["link"]
            spec = (sc.get("devices") or [{}] * (k + 1))[k] if k < len(sc.get("devices") or []) else {}
            sl = spec.get("link") or {}
            link_txt = (f"{sl.get('rate_mbit') or 'unshaped'} Mbit/s, {sl.get('delay_ms', 0)} ms, "
                        f"+-{sl.get('jitter_ms', 0)} ms, {sl.get('loss_pct', 0)}%") if sl else "loopback"
            lines.append(f"| {d['name']} | {d['memory_free'] / 2**20:.0f} | {link_txt} | {ln['rtt_s'] * 1e3:.2f} | "
                         f"{ln['bandwidth_up_Bps'] * 8 / 1e6:.0f} / {ln['bandwidth_down_Bps'] * 8 / 1e6:.0f} | "
                         f"{ln['jitter_s'] * 1e3:.1f} | {ln['loss'] * 100:.2f}% | "
                         f"{d['flops']['1'] / 1e9:.1f} / {d['flops'][str(N_PROMPT)] / 1e9:.1f} |")
        timed = res.get("block_times") is not None
        lines += ["", "| strategy | blocks per device (pipeline order) | fits | TTFT measured ms | TTFT predicted | "
                  "FLOPs only | TPOT measured ms | TPOT predicted | FLOPs only | objective ms | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["results"]:
            segs = ", ".join(f"{s['device'].removeprefix('RPC[').removesuffix(']')}: {s['first']}-{s['last']}"
                             for s in r["segments"])
            fl_ttft = r.get("predicted_flops_only_ttft_s", r["predicted_ttft_s"])
            fl_tpot = r.get("predicted_flops_only_tpot_s", r["predicted_tpot_s"])
            lines.append(f"| {r['strategy']} | {segs} | {'yes' if r['fits'] else 'NO'} | "
                         f"{r['measured_ttft_s'] * 1e3:.1f} | {r['predicted_ttft_s'] * 1e3:.1f} "
                         f"({_pct(r['measured_ttft_s'], r['predicted_ttft_s'])}) | "
                         f"{fl_ttft * 1e3:.1f} ({_pct(r['measured_ttft_s'], fl_ttft)}) | {r['measured_tpot_s'] * 1e3:.2f} | "
                         f"{r['predicted_tpot_s'] * 1e3:.2f} ({_pct(r['measured_tpot_s'], r['predicted_tpot_s'])}) | "
                         f"{fl_tpot * 1e3:.2f} ({_pct(r['measured_tpot_s'], fl_tpot)}) | "
                         f"{r['objective_ms']:.0f} | {r.get('load_avg', float('nan')):.2f} |")
            rows.append({"scenario": res["label"], "strategy": r["strategy"], "devices_used": r["devices_used"],
                         "fits": r["fits"], "blocks_timed": timed, "measured_ttft_ms": r["measured_ttft_s"] * 1e3,
                         "predicted_ttft_ms": r["predicted_ttft_s"] * 1e3,
                         "flops_only_ttft_ms": fl_ttft * 1e3,
                         "measured_tpot_ms": r["measured_tpot_s"] * 1e3,
                         "predicted_tpot_ms": r["predicted_tpot_s"] * 1e3,
                         "flops_only_tpot_ms": fl_tpot * 1e3, "objective_ms": r["objective_ms"],
                         "load_avg": r.get("load_avg"),
                         "load_s": r["load_s"], "segments": " ".join(f"{s['device']}:{s['first']}-{s['last']}"
                                                                      for s in r["segments"])})
        by = {r["strategy"]: r for r in res["results"]}
        same = [s for s in ("memory", "equal") if s in by and "milp" in by and by[s]["segments"] == by["milp"]["segments"]]
        if same:
            lines += ["", f"The MILP plan is the same as {' and '.join(same)}'s here: their difference is measurement noise."]
        ref = res.get("cpu_reference")
        if ref:
            lines += ["", f"Single machine (the whole model on the client CPU, 1 thread): TTFT "
                          f"{ref['measured_ttft_s'] * 1e3:.1f} ms, TPOT {ref['measured_tpot_s'] * 1e3:.2f} ms; the "
                          f"planner's compute term (weight matmuls only, at the probed FLOP/s) accounts for "
                          f"{ref['matmul_only_ttft_s'] * 1e3:.1f} ms and {ref['matmul_only_tpot_s'] * 1e3:.2f} ms of them."]
        if "milp" in by:
            best = min(("memory", "equal"), key=lambda s: by[s]["measured_tpot_s"] if s in by else 1e9)
            if best in by:
                lines += ["", f"MILP vs best baseline ({best}): TPOT x{by[best]['measured_tpot_s'] / by['milp']['measured_tpot_s']:.2f}, "
                          f"TTFT x{by[best]['measured_ttft_s'] / by['milp']['measured_ttft_s']:.2f} (>1: MILP faster)."]
        w = res["workload"]
        lines += ["", f"Workload: prompt {w['n_prompt']} tokens, {w['n_gen']} generated, median of {w['reps']} runs "
                      f"after a warm-up, each after 1 s idle; client 1 thread; model {res['model']['path']} ({res['model']['n_blocks']} "
                      f"blocks of {res['model']['block_MiB']:.1f} MiB incl. KV cache).", ""]
    if rows:
        def errs(kind: str, col: str) -> str:
            e = [abs(r[f"{col}_{kind}_ms"] - r[f"measured_{kind}_ms"]) / r[f"measured_{kind}_ms"] * 100 for r in rows]
            signed = [(r[f"{col}_{kind}_ms"] - r[f"measured_{kind}_ms"]) / r[f"measured_{kind}_ms"] * 100 for r in rows]
            return (f"median |error| {statistics.median(e):.1f}%, p90 {float(np.percentile(e, 90)):.1f}%, "
                    f"max {max(e):.1f}% (signed {min(signed):+.0f}% to {max(signed):+.0f}%)")

        lines += ["## Reading the predictions", "",
                  f"Over all {len(rows)} runs: TTFT {errs('ttft', 'predicted')}; TPOT {errs('tpot', 'predicted')}.", "",
                  f"With the FLOP model alone (weight-matmul FLOPs over probed FLOP/s, the patent's T_compute): TTFT "
                  f"{errs('ttft', 'flops_only')}; TPOT {errs('tpot', 'flops_only')}.", "",
                  "Predicted = the client's part of the pass + each block's compute on its device + one latency "
                  "and one transfer per link crossing (TCP slow start in the prompt's pass where the client's kernel "
                  "restarts a window after an idle link, lost segments' recovery on a lossy link). With the blocks timed (`oallama.cluster.timing`), a block's compute "
                  "is its time in the model's real graph on the client (1 thread here), scaled by the device's "
                  "probed FLOP/s over the client's, plus what an rpc-server adds per block; the client's part is "
                  "the real pass's time outside its blocks (embedding, output head, graph, sampling); a visit of a "
                  "device moves the bytes counted on a loopback connection (positions, mask, the prompt's graph, "
                  "the prompt's last activation whole), not only the activations. The FLOP model sees none of "
                  "these.", ""]
    solver = out / "solver.json"
    if solver.exists():
        doc = json.loads(solver.read_text())
        lines += ["## Solver: 80 blocks x 8 devices", "",
                  f"`model-80L`: the blocks of {doc['model']} (qwq-32b shapes, 80 layers, Q4_K_M: block sizes vary "
                  f"with the Q4_K/Q6_K mix; llama.cpp's graph read in {doc['model_cost_s']:.1f} s). `uniform`: identical "
                  "synthetic blocks. Random heterogeneous devices (5-200 GFLOP/s, 2-120 MB/s, 0.2-20 ms, jitter, "
                  f"loss); time limit {doc['time_limit_s']:.0f} s. Median (max) over seeds:", "",
                  "| instance | variant | method | formulation | warm start | median s | max s | all optimal | "
                  "same optimum |", "|---|---|---|---|---|---|---|---|---|"]
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in doc["rows"]:
            groups.setdefault((r["instance"], r["contiguous"], r["method"], r["formulation"], r["warm_start"]), []).append(r)
        for (inst, contig, method, form, warm), rs in groups.items():
            ts = [r["time_s"] for r in rs]
            lines.append(f"| {inst} | {'contiguous' if contig else 'free'} | {method} | {form} | {warm} | "
                         f"{statistics.median(ts):.3f} | {max(ts):.3f} | "
                         f"{all(r['status'] == 'Optimal' for r in rs)} | {all(r['same_optimum'] for r in rs)} |")
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    if rows:
        with open(out / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {out / 'summary.md'}", file=sys.stderr)


# --- CLI ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["solver", "loopback", "scenarios", "client", "report", "all"])
    ap.add_argument("files", nargs="*", type=Path, help="scenario files (default bench/scripts/scenarios/*.json)")
    ap.add_argument("-o", "--out", type=Path, default=None, help="results folder")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=3, help="solver instances per kind")
    ap.add_argument("--time-limit", type=float, default=20.0, help="HiGHS time limit per solve, s")
    ap.add_argument("--flops-only", action="store_true", help="plan with the FLOP model: do not time the blocks")
    args = ap.parse_args()
    out = args.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    files = args.files or sorted((HERE / "scenarios").glob("*.json"))
    if args.what == "client":
        sc = json.loads(Path(os.environ["OALLAMA_SCENARIO"]).read_text())
        run_client([d["endpoint"] for d in sc["devices"]], [d["memory_bytes"] for d in sc["devices"]],
                   sc["scenario"], out, reps=args.reps, scenario=sc, flops_only=args.flops_only)
        return 0
    if args.what in ("solver", "all"):
        run_solver(out, args.seeds, args.time_limit)
    if args.what in ("loopback", "all"):
        run_loopback(out, args.reps, flops_only=args.flops_only)
    if args.what in ("scenarios", "all"):
        run_scenarios(out, files, args.reps, flops_only=args.flops_only)
    if args.what in ("report", "all", "solver", "loopback", "scenarios"):
        report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
