"""Confirm a plan by measurement: the final choice is measured, not predicted.

The cost model ranks placements; where two are close, or the model is wrong about one, only a run
tells. `confirm` shortlists the planner's best plan, llama.cpp's own placements for the budget
(`layers`, `fit`, and `n-cpu-moe` for a mixture of experts; on the CPU alone its default load) and
the next distinct plans, loads them (all at once when memory allows, else one at a time), runs the
workload on each in alternated rounds -- its prompt at its stated length, then decode steps, each
round on a fresh load of every candidate -- and keeps the measured fastest. A plan departs from the best of llama.cpp's placements only when it
measured faster than it by more than the rounds' spread (and more than `TIE`), over at least
`MIN_ROUNDS` rounds: where nothing is shown faster, llama.cpp's own placement is kept, and the rounds
stop as soon as no round to come could change that (`settled`). A placement
over the budget by llama.cpp's accounting is never kept: `-ngl 0` still puts op offload's compute
buffers on the accelerator, 296-332 MiB beside budgets of 138-277 MiB on an H200
(bench/results/2026-11-27-h200-heldout). It is measured, as the reference the others are compared
with, and the fastest placement within the budget is kept. The result,
every candidate's predicted and measured times, goes into the plan file (`extra["confirmation"]`)
and a cache keyed by everything it depends on::

    plans = {s: make_plan(ctx, s, "50%", candidates=[...]) for s in ("layers", "fit", "affinity", "optimal")}
    conf = confirm(ctx, plans, ConfirmOptions())  # time bound: auto, from the shortlist's predicted runs
    conf.plan                     # the kept plan, strategy "optimal", extra["winner"]: whose placement
    conf.to_json()["candidates"]  # per candidate: predicted and measured TTFT/TPOT/objective, rounds

Measured per round and candidate: TTFT (the prompt's passes and the first token's sampling) and
TPOT (the mean of `confirm_steps` decode steps); the objective as the planner costs it: e2e =
TTFT + (gen - 1) x TPOT. Candidates are compared round by round (paired ratios: the machine's
drift between rounds cancels), the order reversed every other round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import cache_base, write_json
from ..errors import OallamaError, PlanError
from ..runtime.planfile import ConfirmOptions
from .verdict import (
    CENSORED,
    CHALLENGERS,
    LLAMA_CPP_OWN,
    MIN_ROUNDS,
    TIE,
    Candidate,
    Plan,
    decide,
    first_dropped,
    over_budget,
    over_budget_bytes,
    settled,
)

if TYPE_CHECKING:
    from .context import PlanContext


MAX_CANDIDATES = 4  # distinct placements measured, at most
PREDICTION_SLACK = 1.3  # a pass's time before it was measured: its prediction times this (they ran up to 21% slow)
LOAD_S = 0.5  # a load's fixed time before one was measured (s) ...
LOAD_BYTES_PER_S = 1.0e9  # ... and its speed (bytes of weights per second)
# the automatic time bound (--confirm-time unset): the shortlist's estimate for MIN_ROUNDS times this,
# within these seconds. A fixed 60 s measured nothing for a 4-7B model's 512-token prompt at 2 threads
# (a run 10-25 s: bench/results/2026-11-29-vm-paired-nodes), and then the plan is a prediction again
AUTO_MARGIN = 1.5
AUTO_BOUND_S = (60.0, 600.0)
MEMORY_MARGIN = 0.9  # of the free memory the candidates loaded at once may fill
VERSION = 3  # of the method: part of the cache key (2: a too-slow baseline's first run stands for it; 3: every
# round on fresh loads, TIE 3%)


@dataclass
class Confirmation:
    """What `confirm` did and kept."""

    chosen: Candidate
    candidates: list[Candidate]
    plan: Plan  # the kept placement as the requested strategy's plan, the confirmation in its extra
    reason: str
    seconds: float
    rounds: int  # complete rounds measured
    mode: str  # "together" (every candidate loaded at once), "in turn", "cached", "none" (nothing to measure)
    options: ConfirmOptions
    bound_s: float | None  # s, the time bound it measured under (--confirm-time or automatic; None: nothing measured)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)  # label -> vs the kept baseline

    def to_json(self) -> dict[str, Any]:
        wl = self.plan.workload
        return {"version": VERSION, "chosen": self.chosen.labels, "reason": self.reason, "seconds": self.seconds,
                "rounds": self.rounds, "mode": self.mode, "objective": wl.objective,
                "measured_as": f"prompt {wl.prompt} tokens, then {min(self.options.confirm_steps, max(wl.gen - 1, 1))} "
                               "decode steps per round",
                "time_bound_s": self.bound_s, "time_bound": "set" if self.options.confirm_time is not None else "auto",
                "max_rounds": self.options.confirm_rounds,
                "candidates": [{"labels": c.labels, "baseline": c.baseline, "key": load_key(c.plan), "too_slow": c.too_slow,
                                "predicted": {m: c.plan.predicted[m] for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
                                "predicted_objective_ms": c.predicted_ms, "measured": c.measured(),
                                "runs": c.runs, "warmup": c.warmup, "load_s": c.load_s, "error": c.error,
                                **self.ratios.get(c.label, {})} for c in self.candidates]}


# --- the shortlist ------------------------------------------------------------------------------


def load_key(plan: Plan | Mapping[str, Any]) -> str:
    """Two plans (or plan files' documents) with the same key load the same: which weight on which
    device, whole layers by n_gpu_layers, the KV layers, per-weight streaming thresholds, host layouts."""
    doc = plan if isinstance(plan, Mapping) else plan.to_json()
    acc = doc.get("accelerator")
    what = {"placement": {w: ("<acc>" if d == acc else d) for w, d in sorted(doc["placement"].items())},
            "n_gpu_layers": doc["n_gpu_layers"], "kv_layers": doc["kv_layers"],
            "offload_min_batch": doc["offload_min_batch"], "layouts": doc["layouts"],
            "dual_max_batch": doc["dual_max_batch"]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def shortlist(ctx: PlanContext, plans: Mapping[str, Plan], limit: int = MAX_CANDIDATES) -> list[Candidate]:
    """The distinct placements worth measuring, baselines first: every distinct one of llama.cpp's
    own placements among `plans`, then oallama's, by predicted objective, up to `limit` in all.
    Plans that load the same placement are one candidate (its labels name them all)."""
    by_key: dict[str, Candidate] = {}
    order = [s for s in LLAMA_CPP_OWN if s in plans] + [s for s in plans if s not in LLAMA_CPP_OWN]
    for s in order:
        p = plans[s]
        k = load_key(p)
        if k in by_key:
            by_key[k].labels.append(s)
            continue
        by_key[k] = Candidate([s], p, s in LLAMA_CPP_OWN, float(p.predicted[f"{ctx.workload.objective}_ms"]))
    cands = list(by_key.values())
    base = [c for c in cands if c.baseline]
    rest = sorted((c for c in cands if not c.baseline),
                  key=lambda c: (c.predicted_ms, CHALLENGERS.index(c.labels[0]) if c.labels[0] in CHALLENGERS else 9))
    if not base:
        raise PlanError("confirmation needs one of llama.cpp's own placements among the plans "
                        f"({', '.join(LLAMA_CPP_OWN)}); got {', '.join(plans)}")
    return base + rest[:max(limit - len(base), 1)]


# --- measuring ------------------------------------------------------------------------------------


def _say(progress: bool, msg: str, end: str = "\n") -> None:
    if progress:
        print(f"\rconfirm: {msg}".ljust(100) if end == "" else f"confirm: {msg}", end=end, file=sys.stderr,
              flush=True)


def _bar(done: int, total: int, width: int = 20) -> str:
    n = round(width * done / max(total, 1))
    return "[" + "#" * n + "-" * (width - n) + "]"


def _available_host_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _host_bytes(ctx: PlanContext, plan: Plan) -> int:
    """Host memory a load of `plan` takes for its weights (bytes; both layouts' copies where dual)."""
    on_acc = plan.placement.on_acc
    host = sum(b for w, b in ctx.weight_bytes.items() if w not in on_acc)
    return host * (2 if plan.placement.dual_max_batch else 1)


def _fits_together(ctx: PlanContext, cands: Sequence[Candidate]) -> tuple[bool, str]:
    from ..runtime import devices as devmod

    need_host = sum(_host_bytes(ctx, c.plan) for c in cands)
    avail = _available_host_bytes()
    if need_host > MEMORY_MARGIN * avail:
        return False, f"{need_host / 2**30:.1f} GiB of host weights for {len(cands)} loads, {avail / 2**30:.1f} free"
    if ctx.acc is not None:
        need_acc = sum(int(c.plan.memory.get("total", 0)) for c in cands)
        free, _ = devmod.device_memory(ctx.acc)
        if free > 0 and need_acc > MEMORY_MARGIN * free:
            return False, f"{need_acc / 2**30:.2f} GiB on {ctx.acc} for {len(cands)} loads, {free / 2**30:.2f} free"
    return True, ""


class _Runner:
    """Loads candidates and times one run of the workload on a loaded one."""

    def __init__(self, ctx: PlanContext, load: Mapping[str, Any], steps: int, tmp: Path) -> None:
        self.ctx, self.load, self.steps, self.tmp = ctx, dict(load), steps, tmp
        self.prompt: list[int] | None = None
        self.loads_s: list[float] = []  # every load's time (s)

    def open(self, c: Candidate) -> Any:
        """A fresh load of c, warmed by one token of prompt and one decode step (every weight read
        once, its pages mapped): load and warm-up timed together as its load time."""
        from ..runtime.generate import prompt_tokens, timed_generate
        from ..runtime.llama import Llama

        path = c.plan.save(self.tmp / f"candidate-{load_key(c.plan)}.json")
        t0 = time.perf_counter()
        llm = Llama(str(self.ctx.model.path), placement=str(path), **self.load)
        try:
            if self.prompt is None:
                self.prompt = prompt_tokens(llm, self.ctx.workload.prompt)
            timed_generate(llm, self.prompt[:1], 2)
        except BaseException:
            llm.close()
            raise
        c.load_s = time.perf_counter() - t0
        self.loads_s.append(c.load_s)
        return llm

    def run(self, llm: Any) -> dict[str, float]:
        from ..runtime.generate import timed_generate, timed_parallel

        wl = self.ctx.workload
        assert self.prompt is not None  # set by open
        g = (timed_parallel(llm, self.prompt, wl.parallel, self.steps + 1) if wl.parallel > 1
             else timed_generate(llm, self.prompt, self.steps + 1))
        ttft, tpot = g.ttft_s * 1e3, g.tpot_s * 1e3
        obj = {"ttft": ttft, "tpot": tpot}.get(wl.objective, wl.parallel * ttft + (wl.gen - 1) * tpot)
        seqs = len(g.tokens) if wl.parallel > 1 else 1  # sequences generated
        return {"ttft_ms": ttft, "tpot_ms": tpot, "objective_ms": obj, "sequences": float(seqs)}

    def predicted_run_s(self, c: Candidate) -> float:
        pred = c.plan.predicted
        return PREDICTION_SLACK * (self.ctx.workload.parallel * float(pred["ttft_ms"])
                                   + self.steps * float(pred["tpot_ms"])) / 1e3

    def load_s(self) -> float:
        """A load's time (s): the longest measured so far, before any LOAD_S + the weights at LOAD_BYTES_PER_S."""
        if self.loads_s:
            return max(self.loads_s)
        return LOAD_S + self.ctx.model.weight_bytes / LOAD_BYTES_PER_S


def _last_run_s(c: Candidate, runner: _Runner) -> float:
    """A run's time (s): the slowest measured (its warm-up before a round), else predicted."""
    done = [r for r in c.runs if r is not None] or ([c.warmup] if c.warmup is not None else [])
    if not done:
        return runner.predicted_run_s(c)
    n = runner.ctx.workload.parallel  # prompts
    r = max(done, key=lambda r: n * r["ttft_ms"] + runner.steps * r["tpot_ms"])
    return (n * r["ttft_ms"] + runner.steps * r["tpot_ms"]) / 1e3


def time_bound(opts: ConfirmOptions, est_s: float) -> float:
    """The confirmation's time bound (s): --confirm-time where given, else AUTO_MARGIN x `est_s` (the
    shortlist's estimated time for MIN_ROUNDS, loads included) within AUTO_BOUND_S."""
    if opts.confirm_time is not None:
        return opts.confirm_time
    lo, hi = AUTO_BOUND_S
    return min(max(AUTO_MARGIN * est_s, lo), hi)


def _measure(ctx: PlanContext, cands: list[Candidate], opts: ConfirmOptions, load: Mapping[str, Any],
             progress: bool, t0: float, bound: float) -> tuple[int, str]:
    """Fill the candidates' runs (one entry per round each, None where it did not run); (complete
    rounds, mode). Nothing starts that its estimate says would end past the time bound (`bound` s after t0)."""
    deadline = t0 + bound
    steps = min(opts.confirm_steps, max(ctx.workload.gen - 1, 1))
    together, why_not = _fits_together(ctx, cands)
    mode = "together" if together else "in turn"

    def left() -> float:
        return deadline - time.perf_counter()

    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="oallama-confirm-") as tmp:
        runner = _Runner(ctx, load, steps, Path(tmp))
        llms: dict[int, Any] = {}  # candidate -> its load (together: all of them at once)
        used: set[int] = set()  # candidates whose load ran a recorded round: the next round loads afresh
        stack.callback(lambda: [llm.close() for llm in llms.values()])

        def load_s(i: int) -> float:  # s, before candidate i's next round can run
            return 0.0 if i in llms and i not in used else runner.load_s()

        def visit(i: int, record: bool = True) -> tuple[bool, dict[str, float] | None]:
            """(in time, a run of candidate i on a fresh load -- its own after the warm-up; None: it
            failed). A load's speed is its own: identical placements loaded twice differ in decode by
            up to 7% here (bench/results/2026-11-27-vm-confirm-ties), the same in every round of both loads, so only
            fresh loads make the rounds' spread show it."""
            c = cands[i]
            if _last_run_s(c, runner) + load_s(i) > left():
                return False, None
            try:
                if i in used:
                    used.discard(i)
                    llms.pop(i).close()
                if i not in llms:
                    llms[i] = runner.open(c)
                run = runner.run(llms[i])
                if record:
                    used.add(i)
                return True, run
            except OallamaError as e:
                c.error = f"{type(e).__name__}: {e}"
                _say(progress, f"'{c.label}' failed: {c.error}")
                return True, None
            finally:
                if not together and i in llms:
                    used.discard(i)
                    llms.pop(i).close()

        # the cheapest first: a candidate predicted too slow for what is left of the bound is not run
        order = sorted(range(len(cands)), key=lambda i: runner.predicted_run_s(cands[i]))
        if together:  # each loaded and run once, unrecorded: a first run allocates
            for k, i in enumerate(order):
                c = cands[i]
                _say(progress, f"{_bar(0, opts.confirm_rounds)} loading '{c.label}' ({k + 1}/{len(cands)})", end="")
                in_time, c.warmup = visit(i, record=False)
                if not in_time:
                    c.too_slow = True
                    _say(progress, f"'{c.label}' not run: about {_last_run_s(c, runner):.0f} s a run (predicted), "
                                   f"{max(left(), 0.0):.0f} s of the bound left")
        else:
            _say(progress, f"one load at a time ({why_not})")
            for i in order:
                if _last_run_s(cands[i], runner) + runner.load_s() > bound:
                    cands[i].too_slow = True
        rounds = 0

        def need(live: list[int]) -> float:  # s, a round of these candidates
            return sum(_last_run_s(cands[i], runner) + load_s(i) for i in live)

        for r in range(opts.confirm_rounds):
            live = [i for i, c in enumerate(cands) if c.error is None and not c.too_slow]

            # a round does not fit: a baseline over CENSORED x slower than a plan of oallama's is dropped
            # from the rounds (its first run stands for it: `decide`), so that the others can be measured
            while need(live) > left() and r == 0:
                base = [i for i in live if cands[i].baseline]
                others = [i for i in live if not cands[i].baseline]
                if not base or not others:
                    break
                slow = max(base, key=lambda i: _last_run_s(cands[i], runner))
                if _last_run_s(cands[slow], runner) < CENSORED * min(_last_run_s(cands[i], runner) for i in others):
                    break
                cands[slow].too_slow = True
                live.remove(slow)
                _say(progress, f"'{cands[slow].label}' dropped from the rounds: {_last_run_s(cands[slow], runner):.0f} s "
                               f"a run, {max(left(), 0.0):.0f} s of the bound left")
            censored = any(c.baseline and c.too_slow for c in cands)  # a lone candidate still measures against it
            if not live or (len(live) < 2 and not censored) or need(live) > left():
                break
            got: dict[int, dict[str, float] | None] = {}
            complete = True
            for i in live if r % 2 == 0 else reversed(live):
                in_time, got[i] = visit(i)
                complete = complete and in_time
            for i, c in enumerate(cands):
                c.runs.append(got.get(i))
            if not complete:
                break
            rounds += 1
            _say(progress, f"{_bar(rounds, opts.confirm_rounds)} round {rounds}/{opts.confirm_rounds}, "
                           f"{time.perf_counter() - t0:.0f} s", end="")
            if rounds < opts.confirm_rounds and settled(cands, opts.confirm_rounds - rounds):
                break  # no round to come could change the decision
        if progress:
            print(file=sys.stderr)
    return rounds, mode


# --- confirm --------------------------------------------------------------------------------------


def _cache_path(ctx: PlanContext, cands: Sequence[Candidate], opts: ConfirmOptions,
                load: Mapping[str, Any]) -> Path:
    what = {"version": VERSION, "model": ctx.model.identity(), "profile": ctx.profile.key, "acc": ctx.acc,
            "workload": asdict(ctx.workload), "budget": cands[0].plan.budget_bytes,
            "candidates": [[c.labels, load_key(c.plan)] for c in cands],
            "steps": opts.confirm_steps, "rounds": opts.confirm_rounds,
            "load": {k: load[k] for k in sorted(load) if isinstance(load[k], (int, float, str, bool, type(None)))}}
    key = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_base() / "confirmations" / f"{key}.json"


def _from_cache(path: Path, cands: list[Candidate]) -> dict[str, Any] | None:
    """A cached confirmation's runs restored into `cands` (its document; None: unreadable, or of other
    candidates: measure again)."""
    try:
        doc = json.loads(path.read_text())
        by_label = {c.label: c for c in cands}
        entries = {" = ".join(e["labels"]): e for e in doc["candidates"]}
        if set(entries) != set(by_label):
            return None
        for label, e in entries.items():
            c = by_label[label]
            c.runs, c.load_s, c.error, c.too_slow = list(e["runs"]), e["load_s"], e["error"], bool(e.get("too_slow"))
            c.warmup = e.get("warmup")
        return dict(doc)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def confirm(ctx: PlanContext, plans: Mapping[str, Plan], opts: ConfirmOptions | None = None, *,
            load: Mapping[str, Any] | None = None, requested: str = "optimal", progress: bool = True,
            cache: bool = True, candidates: list[Candidate] | None = None) -> Confirmation:
    """Measure the shortlist of `plans` (or the given `candidates`) and keep the fastest (see the
    module docstring). `load`: llama_cpp.Llama arguments of the loads (default: the workload's
    context and ubatch, the profile's threads, mmap and op offload); `requested`: the strategy whose
    plan the result stands for. opts.confirm False: nothing is measured, the plan predicted
    fastest of the shortlist is kept."""
    opts = opts or ConfirmOptions()
    t0 = time.perf_counter()
    cands = candidates if candidates is not None else shortlist(ctx, plans)
    st = ctx.profile.settings
    load = {"n_ctx": ctx.workload.n_ctx, "n_batch": ctx.workload.n_ubatch, "n_ubatch": ctx.workload.n_ubatch,
            "n_threads": st.threads, "n_threads_batch": st.threads, "use_mmap": st.mmap, "op_offload": st.op_offload,
            **ctx.llama_kwargs(), "seed": 1234, "verbose": False, **(load or {})}
    steps = min(opts.confirm_steps, max(ctx.workload.gen - 1, 1))

    bound: float | None = opts.confirm_time  # s: set below where something is measured

    def finish(chosen: Candidate, reason: str, rounds: int, mode: str,
               ratios: dict[str, dict[str, float]]) -> Confirmation:
        conf = Confirmation(chosen, cands, chosen.plan, reason, time.perf_counter() - t0, rounds, mode, opts, bound,
                            ratios)
        conf.plan = _as_requested(chosen, requested, conf)
        return conf

    if len(cands) == 1:
        reason = f"every shortlisted plan loads the same placement ({cands[0].label}): nothing to measure"
        if over := over_budget(cands[0]):  # nothing within the budget was shortlisted: said, not hidden
            reason += f"; it is {over / 2**20:.0f} MiB over the budget"
        _say(progress, reason)
        return finish(cands[0], reason, 0, "none", {})
    if not opts.confirm:
        within = [c for c in cands if over_budget(c) == 0] or cands
        best = min(within, key=lambda c: c.predicted_ms)
        return finish(best, "not confirmed (--no-confirm): the predicted fastest within the budget", 0, "none", {})
    path = _cache_path(ctx, cands, opts, load)
    if cache and not opts.reconfirm and path.exists():
        doc = _from_cache(path, cands)
        if doc is not None:
            chosen, reason, ratios = decide(cands)
            _say(progress, f"reusing {path} ({reason}; --reconfirm measures again)")
            return finish(chosen, reason, int(doc.get("rounds", 0)), "cached", ratios)
    runner = _Runner(ctx, load, steps, Path("."))

    def estimate() -> float:  # s: MIN_ROUNDS rounds and a warm-up run, each round on a fresh load of every candidate
        return MIN_ROUNDS * len(cands) * runner.load_s() + (1 + MIN_ROUNDS) * sum(map(runner.predicted_run_s, cands))

    est = estimate()
    bound = time_bound(opts, est)
    while est > bound and len(cands) > 2:
        cands.pop(first_dropped(cands))
        est = estimate()
    names = ", ".join(f"'{c.label}' ({c.predicted_ms:.0f} ms predicted)" for c in cands)
    _say(progress, f"measuring {len(cands)} plans, {ctx.workload.objective} of prompt {ctx.workload.prompt} + "
                   f"{steps} decode steps per round: {names}; up to {opts.confirm_rounds} rounds, about "
                   f"{est:.0f} s for {MIN_ROUNDS} (bound {bound:.0f} s{' (auto)' if opts.confirm_time is None else ''}, "
                   "--confirm-time)")
    rounds, mode = _measure(ctx, cands, opts, load, progress, t0, bound)
    chosen, reason, ratios = decide(cands)
    if MIN_ROUNDS <= rounds < opts.confirm_rounds and settled(cands, opts.confirm_rounds - rounds):
        reason += f"; settled after {rounds} of up to {opts.confirm_rounds} rounds: no round to come could change it"
    if rounds < MIN_ROUNDS:
        reason += (f"; only {rounds} round(s) fit in the time bound of {bound:.0f} s (about {est:.0f} s "
                   f"needed: raise --confirm-time)")
    conf = finish(chosen, reason, rounds, mode, ratios)
    _say(progress, f"{reason} ({conf.seconds:.0f} s)")
    if cache and rounds >= MIN_ROUNDS:  # a cut measurement is not kept: the next plan measures again
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, conf.to_json())
        except OSError as e:  # an unwritable cache costs the next plan a measurement, nothing more
            _say(progress, f"cannot cache the confirmation in {path}: {e.strerror or e}")
    return conf


def _as_requested(chosen: Candidate, requested: str, conf: Confirmation) -> Plan:
    """The kept placement as `requested`'s plan (strategy `requested`; extra["winner"]: the strategy
    whose placement it is, extra["confirmation"]: the whole measurement)."""
    p = chosen.plan
    extra = dict(p.extra)
    if requested not in chosen.labels:
        extra = {**extra, "winner": chosen.labels[0], "winner_details": dict(p.extra)}
    extra["confirmation"] = conf.to_json()
    extra["confirmation"]["seconds"] = conf.seconds
    return dataclasses.replace(p, strategy=requested, extra=extra)  # type: ignore[type-var]


__all__ = ["AUTO_BOUND_S", "AUTO_MARGIN", "CENSORED", "CHALLENGERS", "LLAMA_CPP_OWN", "MIN_ROUNDS", "TIE", "Candidate", "ConfirmOptions", "Confirmation",
           "Plan", "confirm", "decide", "first_dropped", "load_key", "over_budget", "over_budget_bytes", "settled",
           "shortlist", "time_bound"]
