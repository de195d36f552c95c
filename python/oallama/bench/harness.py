"""`oallama bench`: TTFT/TPOT of placements on the same accelerator memory budget.

    oallama bench MODEL [MODEL ...] --gpu-budget 25%,50%,75% \\
        --strategies layers,fit,flexgen,affinity,optimal \\
        --prompt 32,64,128,256,512 --gen 32,64,128 --reps 5 -o DIR

The parent plans (one `plan.build_context` per model, workload and op-offload setting; the
profile is cached, so only the first is slow) and writes one plan file per configuration. Each
configuration then runs in a fresh `python -m oallama.bench.worker SPEC` process that loads
the model with `Llama(placement=plan)` and the run's shared settings (threads, batch/ubatch,
flash attention, mmap, context, op offload), does `warmup` discarded runs and `reps` timed
ones, and writes its raw result. The parent aggregates the raw results into records (JSON +
CSV, one schema), a Markdown summary and PNG plots (`bench_report`).

Layout of DIR:
    raw/<id>.spec.json   what the worker was asked to run (config, settings, plan summary)
    raw/<id>.plan.json   the plan file it loaded
    raw/<id>.json        its result; present = finished (written atomically)
    raw/<id>.log         its stderr
    raw/<id>.r<k>.*      the same in round k >= 2 (`--rounds`; `launch.py`)
    profiles/<key>.json  every profile the plans were costed with (`profile_key` in the records)
    results.json, results.csv, predicted.json, predicted_passes.csv, summary.md, *.png

A configuration's id is a hash of (model identity, device identity, strategy, budget, prompt,
gen, op offload, settings, build): a rerun skips finished ones, so an interrupted run resumes
where it stopped, and `--max-minutes` stops cleanly before a time limit. `--rounds N` runs the
whole grid N times (a configuration's processes minutes apart: the project's VM runs 1.4x slower
for seconds to minutes at a time, which neither the load average nor steal time shows); the
records report each configuration's median round and the spread of its rounds (`report.py`).

Timings measured with a loopback rpc-server as the "accelerator" only prove the harness: that
accelerator is another CPU process on the same machine. Every configuration records the 1-minute
load average at its start and end: one measured above `accuracy.load_limit` (1.5 per 2 cores) is flagged in the log
and in summary.md ("redo: measured at load X"), as are identical placements whose repeated
measurements disagree by more than 5% (`accuracy.compare_repeats`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._files import write_json
from ..errors import BudgetError, PlanError
from ..model import gguf_file
from ..options import add_arguments, format_default, from_args, option
from ..options import group as option_group
from ..planner.plan import BASELINES, STRATEGIES, parse_budget
from ..runtime import devices as devmod
from ..runtime import rpc
from ..runtime.planfile import ConfirmOptions
from . import accuracy
from . import profiles as bench_profiles
from .launch import RAW_SCHEMA, is_finished, launch, raw_stem

SCHEMA = "oallama.bench/1"
# run order within a budget (the paper's baselines first); optimal last: it takes the other
# plans as candidates
_ORDER = ("layers", "fit", "flexgen", "n-cpu-moe", "affinity")
ALL_STRATEGIES = tuple([s for s in _ORDER if s in STRATEGIES + BASELINES]
                       + [s for s in STRATEGIES + BASELINES if s not in (*_ORDER, "optimal")] + ["optimal"])
# strategies whose weights llama.cpp itself places: its default op offload applies to them
STOCK_STRATEGIES = ("layers", "fit")
OP_OFFLOAD_MODES = ("on", "off", "both")
GRIDS = ("full", "sweep")
# the paper's end-to-end workload (prompt 64, generate 32): the anchor of the sweep grid
PAPER_ANCHOR = (64, 32)
OUTPUT_RESERVE_S = 20.0  # seconds kept before --max-minutes for writing results and plots


def _log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# --- options and configurations ------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """Settings every configuration of a run shares (recorded with every figure; from BenchOptions)."""

    threads: int  # CPU threads for prompt and generation (n_threads = n_threads_batch)
    n_batch: int  # tokens per llama_decode call
    n_ubatch: int  # tokens per graph (physical batch); the planner plans for it
    flash_attn: bool
    mmap: bool
    reps: int  # timed repetitions per configuration
    warmup: int  # discarded runs before them


@dataclass(frozen=True)
class Config:
    """One measured configuration: a model, a placement strategy at a budget, a workload."""

    model: str  # path of the GGUF file (not part of the identity)
    model_name: str  # file stem
    model_identity: str  # gguf_file identity (tensor names/shapes/types) + file size
    device: str  # accelerator name at planning time (an rpc-server's port changes: not identity)
    device_identity: str  # profile.device_identity: what the measurement is valid for
    strategy: str
    budget: str  # as requested: "50%" (share of the weights) or "12GiB"
    prompt: int  # prompt tokens
    gen: int  # generated tokens
    op_offload: bool  # llama.cpp's op offload (host weights' ops streamed to the accelerator)
    n_ctx: int  # context size, from the workload (plan.Workload.n_ctx)
    settings: RunSettings
    build: str  # oallama version + llama.cpp commit
    confirm: str = ""  # optimal: how its plan was confirmed by measurement (`confirm_spec`; "off": predicted)

    @property
    def id(self) -> str:
        doc = asdict(self)
        for k in ("model", "model_name", "device") + (("confirm",) if not self.confirm else ()):
            doc.pop(k)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def series(self) -> str:
        return self.strategy if self.op_offload else f"{self.strategy} (op offload off)"

    @property
    def label(self) -> str:
        return f"{self.model_name} {self.series} @{self.budget} prompt {self.prompt} gen {self.gen}"


def default_results_dir() -> Path:
    """bench/results/<date>-<machine>: where a run writes unless told (-o)."""
    return Path("bench/results") / f"{time.strftime('%Y-%m-%d')}-{platform.node()}"


@dataclass
class BenchOptions:
    """Everything `oallama bench` takes; its flags are generated from these fields (`options`)."""

    models: list[Path] = option(positional=True, metavar="model", help="GGUF model file(s)")
    out: Path = option(flag="--output", short="-o", default_factory=default_results_dir,
                       default_help="bench/results/<date>-<machine>", help="results directory")
    budgets: list[str] = option(["25%", "50%", "75%"], flag="--gpu-budget",
                                help="comma-separated budgets: shares of the weights ('50%') or bytes ('12GiB')")
    strategies: list[str] = option(list(ALL_STRATEGIES), help=f"comma-separated, from {','.join(ALL_STRATEGIES)}")
    prompts: list[int] = option([32, 64, 128, 256, 512], flag="--prompt", help="prompt lengths (tokens)")
    gens: list[int] = option([32, 64, 128], flag="--gen", help="generation lengths (tokens)")
    grid: str = option("full", choices=GRIDS, help="full: every prompt x gen; sweep: prompts at the anchor gen and "
                       "gens at the anchor prompt (the paper's figures)")
    anchor: tuple[int, int] | None = option(None, metavar="PROMPT,GEN", help="(prompt, gen) the sweep grid is "
                                            "centred on", default_help=f"{format_default(PAPER_ANCHOR)} where listed")
    reps: int = option(5, help="timed repetitions per configuration")
    rounds: int = option(1, help="measure the whole grid this many times, each configuration once per round in "
                         "its own process (a configuration's rounds run minutes apart); records report its median "
                         "round (see bench/report.py)")
    warmup: int = option(1, help="discarded runs before them")
    threads: int | None = option(None, help="CPU threads", default_help="half the cores")
    ubatch: int = option(512, help="n_batch = n_ubatch (tokens)")
    flash_attn: bool = option(False, help="load with flash attention (the plans are made for it too)")
    mmap: bool = option(True, help="load with mmap")
    op_offload: str = option("on", choices=OP_OFFLOAD_MODES,
                             help="llama.cpp's op offload; both: layers and fit also run with it off")
    device: str | None = option(None, help="the accelerator", default_help="the first GPU")
    rpc_local: bool = option(False, help="without a GPU, start a loopback rpc-server as the accelerator (proves "
                             "the harness only)")
    rpc_threads: int = option(1, help="threads of that rpc-server")
    rpc_cpus: tuple[int, ...] | None = option(None, metavar="CPU,...", help="CPUs of that rpc-server; the client "
                                              "then runs on the others (a device of its own: where the kernel "
                                              "moves both, a visit of the server costs up to 3x more)",
                                              default_help="wherever the kernel puts them")
    max_minutes: float | None = option(None, help="stop launching (and stop a worker) before this many minutes; "
                                       "rerun to resume")
    config_timeout_s: float = option(1800.0, flag="--config-timeout", help="seconds one configuration may take "
                                     "(a worker running longer is killed and recorded as failed)")
    reprofile: bool = option(False, help="measure the profile afresh for this run instead of reusing a cached "
                             "one (the cache is left as it is)")
    confirm: ConfirmOptions = option_group(ConfirmOptions)  # optimal: the plan confirmed by measurement, as `plan` does
    plots: bool = option(True, help="write PNG plots")
    progress: bool = option(True, off="--quiet", help="show progress on stderr")

    def check(self) -> None:
        """Raise PlanError / BudgetError for bad input, before anything runs."""
        if not self.models:
            raise PlanError("name at least one model")
        unknown = [s for s in self.strategies if s not in ALL_STRATEGIES]
        if unknown or not self.strategies:
            raise PlanError(f"strategy '{','.join(unknown)}': choose from {', '.join(ALL_STRATEGIES)}")
        if not self.budgets:
            raise BudgetError("name at least one budget (--gpu-budget 50%)")
        for b in self.budgets:
            parse_budget(b, 1 << 40)
        for name, vals in (("--prompt", self.prompts), ("--gen", self.gens)):
            if not vals or any(v < 1 for v in vals):
                raise PlanError(f"{name}: token counts must be >= 1 (got {vals})")
        if self.grid not in GRIDS:
            raise PlanError(f"grid '{self.grid}': choose {' or '.join(GRIDS)}")
        if self.op_offload not in OP_OFFLOAD_MODES:
            raise PlanError(f"--op-offload '{self.op_offload}': choose on, off or both")
        if self.reps < 1 or self.warmup < 0 or self.rounds < 1:
            raise PlanError(f"--reps and --rounds must be >= 1 and --warmup >= 0 (got {self.reps}, {self.rounds}, "
                            f"{self.warmup})")
        if self.ubatch < 1 or (self.threads is not None and self.threads < 1):
            raise PlanError("--ubatch and --threads must be >= 1")
        if self.anchor is not None and (self.anchor[0] not in self.prompts or self.anchor[1] not in self.gens):
            raise PlanError(f"--anchor {self.anchor[0]},{self.anchor[1]}: must be one of the listed prompts and gens")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise PlanError("--max-minutes must be > 0")
        if self.rpc_cpus is not None:
            mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
            if not self.rpc_local:
                raise PlanError("--rpc-cpus places the --rpc-local server: use the two together")
            if not set(self.rpc_cpus) <= mine or not mine - set(self.rpc_cpus):
                raise PlanError(f"--rpc-cpus {format_default(self.rpc_cpus)}: this process may use CPUs "
                                f"{format_default(sorted(mine))}; name some of them, leaving the client at least one")

    def workloads(self) -> list[tuple[int, int]]:
        """(prompt, gen) pairs, the anchor first (what the paper's end-to-end figure uses)."""
        ap, ag = self.anchor or (PAPER_ANCHOR[0] if PAPER_ANCHOR[0] in self.prompts else self.prompts[0],
                                 PAPER_ANCHOR[1] if PAPER_ANCHOR[1] in self.gens else self.gens[0])
        if self.grid == "full":
            pairs = [(p, g) for g in self.gens for p in self.prompts]
        else:
            pairs = [(p, ag) for p in self.prompts] + [(ap, g) for g in self.gens]
        return list(dict.fromkeys([(ap, ag), *pairs]))

    def variants(self) -> list[tuple[str, bool]]:
        """(strategy, op_offload) pairs to run at each budget, in run order."""
        strategies = [s for s in ALL_STRATEGIES if s in self.strategies]
        if self.op_offload == "on":
            return [(s, True) for s in strategies]
        if self.op_offload == "off":
            # flexgen *is* op offload (every op streamed): it has no off variant
            return [(s, False) for s in strategies if s != "flexgen"]
        return [(s, True) for s in strategies] + [(s, False) for s in strategies if s in STOCK_STRATEGIES]


@dataclass
class BenchSummary:
    total: int  # configurations in the grid
    done_before: int  # finished before this run (skipped)
    launched: list[str] = field(default_factory=list)  # config ids run by this run (workers started)
    finished: list[str] = field(default_factory=list)  # of those, the ones with a result
    failed: dict[str, str] = field(default_factory=dict)  # id -> error
    remaining: int = 0  # not finished when the run ended (time limit, failures)
    outputs: dict[str, Path] = field(default_factory=dict)


# --- the accelerator ---------------------------------------------------------------------------


def _device_meta(dev: devmod.Device) -> dict[str, Any]:
    from ..planner.cost.profile import device_identity

    return {"device": dev.name, "device_kind": dev.kind, "device_description": dev.description,
            "device_backend": dev.backend, "device_identity": device_identity(dev),
            "device_memory_total": dev.memory_total}


def _listening_pid(endpoint: str) -> int | None:
    """pid of the local process listening on host:port (an rpc-server named by --device)."""
    return rpc.listening_pid(*devmod.parse_endpoint(endpoint))


def _accelerator(opts: BenchOptions) -> tuple[devmod.Device, Any]:
    """(device, rpc-server we started or None)."""
    if opts.device:
        return devmod.resolve(opts.device), None
    gpu = next((d for d in devmod.list_devices() if d.kind in ("gpu", "igpu")), None)
    if gpu is not None:
        if opts.rpc_local:
            _log(f"using {gpu.name} ({gpu.description}); --rpc-local is only for machines without a GPU")
        return gpu, None
    if not opts.rpc_local:
        raise PlanError("no GPU here: name an accelerator with --device (e.g. RPC[host:port]) or use --rpc-local")
    # the server's RSS is its "device memory": have glibc mmap every buffer over 64 KiB, so that
    # a buffer freed when one worker disconnects is returned to the system, and the next
    # worker's load shows up as RSS again (the dynamic threshold would keep it on the heap)
    saved = {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, [saved["GLIBC_TUNABLES"],
                                                          "glibc.malloc.mmap_threshold=65536"]))
    try:
        server = rpc.start_server(threads=opts.rpc_threads, cpus=opts.rpc_cpus)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    on = f", on CPU(s) {rpc.cpu_list(opts.rpc_cpus)}, the client on the others" if opts.rpc_cpus else ""
    _log(f"started a loopback rpc-server as the accelerator: {server.device_name} (pid {server.pid}, "
         f"{opts.rpc_threads} thread(s){on}); its timings only prove the harness")
    return devmod.resolve(server.device_name), server


# --- the run -----------------------------------------------------------------------------------


def _host_meta() -> dict[str, Any]:
    from ..planner.cost.profile import _cpu_name, build_info, cpu_detail

    b = build_info()
    try:
        import psutil

        mem_total = int(psutil.virtual_memory().total)
    except ImportError:  # pragma: no cover - psutil is a dependency of the benchmark
        mem_total = 0
    return {"machine": platform.node(), "cpu": _cpu_name(), "cpu_detail": cpu_detail(), "cpu_count": os.cpu_count() or 0,
            "host_memory_bytes": mem_total, "os": f"{platform.system()} {platform.release()}",
            "oallama_version": b["oallama"], "build_commit": b["llama_cpp_commit"],
            "build_patches": ";".join(b["patches"]), "cuda_build": b["cuda"]}


def _fmt_s(s: float) -> str:
    s = max(int(s), 0)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def build_configs(opts: BenchOptions, dev_identity: str, dev_name: str, settings: RunSettings,
                  build: str) -> list[Config]:
    from ..planner.plan import Workload

    infos = [(Path(m), gguf_file.check_model(m)) for m in opts.models]
    out = []
    for prompt, gen in opts.workloads():
        n_ctx = Workload(prompt, gen, "e2e", settings.n_ubatch).n_ctx
        for path, info in infos:
            ident = f"{info.identity()}:{path.stat().st_size}"
            moe = any("_exps." in t.name for t in info.tensors)
            for budget in opts.budgets:
                for strategy, oo in opts.variants():
                    if strategy == "n-cpu-moe" and not moe:  # a mixture-of-experts baseline only
                        continue
                    out.append(Config(str(path.resolve()), path.stem, ident, dev_name, dev_identity, strategy,
                                      budget.strip(), prompt, gen, oo, n_ctx, settings, build,
                                      confirm_spec(opts.confirm) if strategy == "optimal" else ""))
    return out


def run_bench(opts: BenchOptions) -> BenchSummary:
    """Plan and run every configuration of the grid that has no result yet; aggregate."""
    from ..planner.cost.profile import Settings
    from . import report as bench_report

    opts.check()
    for m in opts.models:
        gguf_file.check_model(m)
    t_start = time.monotonic()
    deadline = None
    if opts.max_minutes:
        # keep time for aggregating and plotting after the last configuration (seconds)
        reserve = min(OUTPUT_RESERVE_S if opts.plots else OUTPUT_RESERVE_S / 4, opts.max_minutes * 60 * 0.2)
        deadline = t_start + opts.max_minutes * 60 - reserve
    raw_dir = opts.out / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    dev, server = _accelerator(opts)
    pins = contextlib.ExitStack()
    try:
        # the client beside a pinned server, before the profile key is made (it names the CPUs)
        pins.enter_context(rpc.beside(opts.rpc_cpus if server is not None else None))
        threads = opts.threads or Settings(max((os.cpu_count() or 2) // 2, 1)).threads
        settings = RunSettings(threads, opts.ubatch, opts.ubatch, opts.flash_attn, opts.mmap, opts.reps, opts.warmup)
        host = _host_meta()
        build = f"{host['oallama_version']}+{host['build_commit']}"
        meta = {**host, **_device_meta(dev)}
        server_pid = server.pid if server is not None else None
        if server_pid is None and dev.kind == "rpc":
            server_pid = _listening_pid(dev.description)
        configs = build_configs(opts, meta["device_identity"], dev.name, settings, build)
        if len({c.id for c in configs}) != len(configs):
            raise PlanError("duplicate configurations (a budget, strategy, prompt or gen listed twice?)")
        rounds = range(1, opts.rounds + 1)
        pending = {r: [c for c in configs if not is_finished(raw_dir, c.id, r)] for r in rounds}
        n_pending = sum(len(v) for v in pending.values())
        summary = BenchSummary(len(configs) * opts.rounds, len(configs) * opts.rounds - n_pending)
        if opts.progress:
            per = f" x {opts.rounds} rounds" if opts.rounds > 1 else ""
            _log(f"{len(configs)} configurations ({len(opts.models)} model(s) x {len(opts.workloads())} workload(s) "
                 f"x {len(opts.budgets)} budget(s) x {len(opts.variants())} strategy variant(s)){per} on {dev.name}; "
                 f"{summary.done_before} already done, {n_pending} to run; threads {threads}, "
                 f"ubatch {opts.ubatch}, reps {opts.reps} (+{opts.warmup} warm-up)")
        try:
            for r in rounds:  # the whole grid once per round: a configuration's rounds run minutes apart
                if pending[r] and not _run_pending(opts, pending[r], summary, settings, meta, dev.name, server_pid,
                                                   raw_dir, deadline, r):
                    break
        finally:
            summary.remaining = sum(not is_finished(raw_dir, c.id, r) for c in configs for r in rounds)
            summary.outputs = bench_report.write_outputs(opts.out, plots=opts.plots)
            for line in accuracy.warning_lines(bench_report.read_records(summary.outputs["json"])):
                _log(line)
            if opts.progress:
                state = "complete" if summary.remaining == 0 else (
                    f"incomplete: {summary.remaining} configuration(s) left (run the same command again to resume)")
                _log(f"ran {len(summary.launched)} configuration(s) ({len(summary.failed)} failed), skipped "
                     f"{summary.done_before} finished; {state}; wrote {opts.out} in "
                     f"{_fmt_s(time.monotonic() - t_start)}")
        return summary
    finally:
        pins.close()
        if server is not None:
            server.stop()


def _run_pending(opts: BenchOptions, pending: list[Config], summary: BenchSummary, settings: RunSettings,
                 meta: dict[str, Any], acc: str, server_pid: int | None, raw_dir: Path,
                 deadline: float | None, rnd: int = 1) -> bool:
    """Plan and run `pending` as round `rnd`; False when the time limit stopped it."""
    from ..planner import plan as planmod

    profiles: dict[tuple[str, int, bool], Any] = {}  # --reprofile: measured once per (model, n_ctx, op offload)
    groups: dict[tuple[str, int, int, bool], list[Config]] = {}
    for c in pending:
        groups.setdefault((c.model, c.prompt, c.gen, c.op_offload), []).append(c)
    durations: list[float] = []
    i = 0
    where = f", round {rnd}/{opts.rounds}" if opts.rounds > 1 else ""
    for (model, prompt, gen, oo), group in groups.items():
        if deadline is not None and time.monotonic() > deadline:
            _log(f"stopping before the time limit ({opts.max_minutes:g} min)")
            return False
        wl = planmod.Workload(prompt, gen, "e2e", settings.n_ubatch, flash_attn="on" if settings.flash_attn else "off")
        if opts.reprofile and (model, wl.n_ctx, oo) not in profiles:
            profiles[(model, wl.n_ctx, oo)] = bench_profiles.measure(model, acc, wl.n_ctx, settings.threads, oo,
                                                                     opts.progress, settings.flash_attn)
        profile = profiles.get((model, wl.n_ctx, oo))
        ctx = planmod.build_context(model, acc, wl, profile=profile, threads=settings.threads, op_offload=oo,
                                    progress=opts.progress)
        profile_key = bench_profiles.save(opts.out, ctx.profile)
        for budget in dict.fromkeys(c.budget for c in group):
            todo = [c for c in group if c.budget == budget]
            plans = _make_plans(ctx, budget, {c.strategy for c in todo}, oo, opts.confirm, settings, opts.progress)
            for c in todo:
                i += 1
                est = statistics.mean(durations) if durations else 0.0
                if deadline is not None and time.monotonic() + est * 1.1 > deadline:
                    _log(f"stopping before the time limit ({opts.max_minutes:g} min): "
                         f"{len(pending) - i + 1} configuration(s) left")
                    return False
                p = plans.get(c.strategy)
                if isinstance(p, str):  # planning failed
                    summary.failed[c.id] = p
                    write_json(raw_dir / f"{raw_stem(c.id, rnd)}.failed.json",
                               {"schema": RAW_SCHEMA, "id": c.id, "round": rnd, "status": "failed",
                                "config": _config_doc(c), "error": p})
                    _log(f"[{i}/{len(pending)}{where}] {c.label}: planning failed: {p}")
                    continue
                t0 = time.monotonic()
                if opts.progress:
                    eta = f", ETA {_fmt_s(est * (len(pending) - i + 1))}" if durations else ""
                    _log(f"[{i}/{len(pending)}{where}] {c.label} ({c.id}){eta}")
                err = launch(raw_dir, c.id, rnd, config=_config_doc(c), plan=p,
                             plan_doc={**_plan_doc(p), "profile_host_speed": _profile_host_speed(ctx.profile)}, meta=meta,
                             server_pid=server_pid, profile_key=profile_key, timeout_s=opts.config_timeout_s,
                             deadline=deadline)
                summary.launched.append(c.id)
                dt = time.monotonic() - t0
                durations.append(dt)
                if err is None:
                    summary.finished.append(c.id)
                    res = json.loads((raw_dir / f"{raw_stem(c.id, rnd)}.json").read_text())
                    if opts.progress:
                        r = res["samples"]
                        _log(f"    done in {dt:.1f} s: TTFT {statistics.median(r['ttft_ms']):.1f} ms, "
                             f"TPOT {statistics.median(r['tpot_ms']):.2f} ms (predicted "
                             f"{p.predicted['ttft_ms']:.1f} / {p.predicted['tpot_ms']:.2f})")
                    loads = [x for x in (res.get("load_avg_start"), res.get("load_avg_end")) if x is not None]
                    lim = accuracy.load_limit(os.cpu_count())
                    if loads and max(loads) > lim:
                        _log(f"    {accuracy.load_warning(max(loads), c.label, lim)}")
                elif err == "deadline":
                    _log(f"    stopped at the time limit ({opts.max_minutes:g} min); it reruns next time")
                    return False
                else:
                    summary.failed[c.id] = err
                    _log(f"    FAILED after {dt:.1f} s: {err}")
    return True


def confirm_spec(opts: ConfirmOptions) -> str:
    """How optimal's plans are confirmed, as its configurations' identity records it."""
    if not opts.confirm:
        return "off"
    bound = "auto" if opts.confirm_time is None else f"{opts.confirm_time:g} s"
    return f"time {bound}, rounds {opts.confirm_rounds}, steps {opts.confirm_steps}"


def _make_plans(ctx: Any, budget: str, wanted: set[str], op_offload: bool, confirm: ConfirmOptions | None = None,
                settings: RunSettings | None = None, progress: bool = False) -> dict[str, Any]:
    """strategy -> Plan (or an error message). optimal gets every other plan as a candidate and,
    with `confirm` on, is the plan its confirmation kept (loaded as the worker loads, `settings`)."""
    from ..errors import OallamaError
    from ..planner import plan as planmod

    need = set(wanted)
    if "optimal" in need:
        need |= {s for s in ALL_STRATEGIES if s != "optimal"}
    if not op_offload:
        need.discard("flexgen")
    out: dict[str, Any] = {}
    for s in ALL_STRATEGIES:
        if s not in need:
            continue
        try:
            cands = [p for p in out.values() if not isinstance(p, str)] if s == "optimal" else []
            out[s] = planmod.make_plan(ctx, s, budget, candidates=cands)
        except (OallamaError, RuntimeError) as e:
            out[s] = f"{type(e).__name__}: {e}"
    opt = out.get("optimal")
    if confirm is not None and confirm.confirm and opt is not None and not isinstance(opt, str):
        load = {} if settings is None else {
            "n_batch": settings.n_batch, "n_ubatch": settings.n_ubatch, "n_threads": settings.threads,
            "n_threads_batch": settings.threads, "flash_attn": settings.flash_attn, "use_mmap": settings.mmap,
            "op_offload": op_offload}
        made = {s: p for s, p in out.items() if not isinstance(p, str)}
        try:
            out["optimal"] = planmod.confirmed(ctx, budget, confirm, load=load, plans=made, progress=progress)[0]
        except (OallamaError, RuntimeError) as e:
            out["optimal"] = f"confirmation: {type(e).__name__}: {e}"
    return out


def _config_doc(c: Config) -> dict[str, Any]:
    d = asdict(c)
    d["id"] = c.id
    d["series"] = c.series
    return d


def _winner(p: Any) -> str:
    """The strategy whose placement a plan carries: optimal keeps a baseline's when the solver
    found nothing that fits and is predicted faster (plan.extra["winner"])."""
    w = p.extra.get("winner")
    return str(w) if w in ALL_STRATEGIES else str(p.strategy)


def _profile_host_speed(profile: Any) -> dict[str, dict[str, float]] | None:
    """The reference ops' times when `profile` was measured (per device role, before and after
    averaged): what the worker's own measurement is compared with. None for a profile from before
    they were recorded."""
    from ..planner.cost import hostspeed

    hs = getattr(profile, "host_speed", None) or {}
    got = [hs[k] for k in ("before", "after") if isinstance(hs.get(k), dict)]
    return hostspeed.mean(got) if got else None


def _plan_doc(p: Any) -> dict[str, Any]:
    from ..planner.cost.schedmodel import NEVER

    return {"predicted": p.predicted,  # ttft_ms, tpot_ms, e2e_ms and the per-pass breakdown
            "memory": p.memory, "budget_bytes": p.budget_bytes, "n_gpu_layers": p.n_gpu_layers,
            "load": p.load_mode, "kv_layers": p.placement.kv_layers, "plan_seconds": p.plan_s,
            "weights_on_acc": len(p.placement.on_acc),
            "streamed_weights": sum(b < NEVER for b in p.offload_policy().values()),
            "from": _winner(p), "confirm_s": (p.extra.get("confirmation") or {}).get("seconds"),
            "model_weight_bytes": int(p.model["weight_bytes"]),
            "model_n_layer": int(p.model["n_layer"]), "model_architecture": p.model.get("architecture", "")}


# --- CLI ---------------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    import signal

    opts = from_args(BenchOptions, args)

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # `timeout`/kill: stop the worker and the rpc-server, keep results

    previous = signal.signal(signal.SIGTERM, _term)
    try:
        s = run_bench(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps({"total": s.total, "done_before": s.done_before, "launched": len(s.launched),
                      "finished": len(s.finished), "failed": len(s.failed), "remaining": s.remaining,
                      "outputs": {k: str(v) for k, v in s.outputs.items()}}))
    return 1 if s.failed else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from . import report as bench_report

    paths = [Path(d) for d in args.dirs]
    for d in paths:
        if not d.is_dir():
            raise PlanError(f"{d}: not a directory")
    dirs = list(dict.fromkeys([*(d for d in paths if (d / "raw").is_dir()),
                               *(r.parent.parent for d in paths for r in d.rglob("raw/*.spec.json"))]))
    for d in dirs:
        if not args.catalogue_only:
            outs = bench_report.write_outputs(d, plots=not args.no_plots)
            print(f"{d}: wrote {', '.join(p.name for p in outs.values())}")
    if not args.catalogue_only:
        # prediction error, measured winners, load and repeat checks of every results directory
        # (committed ones without raw/ too: from their results.json)
        for d in bench_report.result_dirs(paths):
            print(f"\n# {d}\n")
            print("\n".join(accuracy.accuracy_markdown(bench_report.read_records(d / "results.json"))))
    if args.catalogue or args.catalogue_only:
        from . import catalogue

        print(f"wrote the catalogue {catalogue.write_catalogue(paths[0])} ({paths[0]}'s result sets)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="TTFT/TPOT of placement strategies on the same accelerator budget",
                       description="Benchmark placements: every configuration in a fresh process, resumable.")
    add_arguments(p, BenchOptions)
    p.set_defaults(func=_cmd_bench)

    r = sub.add_parser("bench-report", help="regenerate bench results (JSON/CSV/Markdown/PNG) and the results catalogue")
    r.add_argument("dirs", nargs="+", help="results directories (bench/results/<date>-<machine>), or their parent")
    r.add_argument("--catalogue", action="store_true", help="also write README.md in the first directory given: one "
                   "line per result set under it (bench/results/README.md)")
    r.add_argument("--catalogue-only", action="store_true", help="only write the catalogue")
    r.add_argument("--no-plots", action="store_true")
    r.set_defaults(func=_cmd_report)


__all__ = ["SCHEMA", "BenchOptions", "BenchSummary", "Config", "RunSettings", "run_bench"]
