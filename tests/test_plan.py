"""The planner: budgets, the scheduler model against ggml's real scheduler, the exact MILP
against brute force, the paper's Algorithm 1 on a hand-computed example, and the whole
inspect -> profile -> plan -> load flow on an rpc-server device."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import (
    assert_memory_as_planned,
    greedy_tokens,
    planned_context,
    post_json,
    sched_model_mismatches,
    stock_context,
    stock_memory,
    stock_placement,
    stock_server,
)
from oallama import BudgetError, Llama, PlanError, UnknownDeviceError, _core
from oallama.planner.cost.calfit import DeviceCalibration, OpFit
from oallama.planner.cost.profile import Link, Profile
from oallama.planner.cost.schedmodel import HOST, NEVER, PassModel, Placement
from oallama.planner.graph import GraphSession
from oallama.planner.plan import (
    STRATEGIES,
    Workload,
    affinity_order,
    build_context,
    make_plan,
    parse_budget,
    place_layers,
    with_stock_memory,
)
from oallama.planner.solvers import chaindp, optimal
from oallama.planner.strategies import guided_search
from oallama.planner.verify import measure_memory
from oallama.planner.workload import Ubatch
from oallama.runtime import devices, rpc

GiB, MiB = 2**30, 2**20


# --- budgets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("12GiB", 12 * GiB), ("512MiB", 512 * MiB), ("1.5GiB", int(1.5 * GiB)), ("8000000000", 8_000_000_000),
    ("100%", 1000), ("50%", 500), ("12.5%", 125), (4096, 4096)])
def test_budget_parses(text: str | int, expected: int) -> None:
    assert parse_budget(text, 1000) == expected


@pytest.mark.parametrize("text", ["12 GB", "12GB", "12 GiB", "150%", "0%", "-5%", "-1", "0", 0, -3, "lots", "",
                                  "12TB", True, 1.5])
def test_budget_rejects_with_a_clear_error(text: object) -> None:
    with pytest.raises(BudgetError, match="budget"):
        parse_budget(text, 1000)  # type: ignore[arg-type]


def test_budget_error_explains_decimal_units() -> None:
    with pytest.raises(BudgetError, match=r"binary units.*12GiB"):
        parse_budget("12 GB", 1000)


def test_workload_checks_its_fields() -> None:
    with pytest.raises(PlanError, match="objective 'fast'"):
        Workload(objective="fast")
    assert Workload(prompt=700, n_ubatch=512).ubatches() == [512, 188]
    assert Workload(prompt=64, gen=10).pass_weights() == {Ubatch(64): 1.0, Ubatch(1): 9.0}
    assert Workload(prompt=64, gen=10, objective="tpot").pass_weights() == {Ubatch(1): 1.0}
    # 4 sequences, prompt 68 in ubatches of 64: its last 4 tokens and the decode pass are other passes
    assert Workload(prompt=68, gen=10, n_ubatch=64, parallel=4).pass_weights() == {
        Ubatch(64): 4.0, Ubatch(4): 4.0, Ubatch(4, 4): 9.0}
    assert [str(u) for u in (Ubatch(512), Ubatch(4, 4), Ubatch(8, 4))] == ["512", "4x1", "4x2"]
    assert [Ubatch.parse(t) for t in ("512", "4x1", "4x2")] == [Ubatch(512), Ubatch(4, 4), Ubatch(8, 4)]


# --- the scheduler model is ggml's scheduler ------------------------------------------------------


@pytest.fixture(scope="session")
def shape_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Metadata-complete models with real shapes (zero data: graphs and scheduling only)."""
    from oallama.model import synthetic

    d = tmp_path_factory.mktemp("shape")
    out = {}
    for preset, qtype in [("tiny", "f16"), ("tiny", "q4_k_m"), ("qwq-32b", "q4_k_m"), ("minicpm3-4b", "q4_k_m")]:
        out[f"{preset}-{qtype}"] = synthetic.write_model(d / f"{preset}-{qtype}.gguf", preset, qtype, n_layer=2,
                                                         shape_only=True, progress=False)
    return out


@pytest.mark.parametrize("n_tokens", [1, 40])
@pytest.mark.parametrize("model", ["tiny-f16", "tiny-q4_k_m", "qwq-32b-q4_k_m", "minicpm3-4b-q4_k_m"])
def test_sched_model_matches_the_real_scheduler(shape_models: dict[str, Path], rpc_server: rpc.RpcServer,
                                                model: str, n_tokens: int) -> None:
    acc = rpc_server.device_name
    devices.resolve(acc)
    assert not sched_model_mismatches(shape_models[model], acc, n_tokens, f"{model}-{n_tokens}")


# --- planning contexts --------------------------------------------------------------------------

WORKLOAD = Workload(prompt=40, gen=8, objective="e2e", n_ubatch=64)


@pytest.fixture(scope="session")
def tiny_f16(synth_model) -> Path:
    return synth_model("tiny", "f16", n_layer=2)


@pytest.fixture(scope="session")
def measured_ctx(tiny_f16: Path, rpc_server: rpc.RpcServer):
    from oallama.planner.cost.measure import profile_model

    prof = profile_model(tiny_f16, [HOST, rpc_server.device_name], threads=1, repeats=2, progress=False)
    return build_context(tiny_f16, rpc_server.device_name, WORKLOAD, profile=prof, threads=1, progress=False)


def _host_us(prof: Profile, key: str) -> float:
    """The CPU's time for an op key (us): measured, or interpolated between its column counts (the
    accelerator is also timed at the workload's own pass sizes, planner.cost.opsizes; the CPU is not)."""
    if key in prof.ops[HOST]:
        return float(prof.ops[HOST][key]["median_us"])
    sig, n = key.rsplit(":", 1)
    pts = sorted((int(k.rsplit(":", 1)[1]), float(v["median_us"])) for k, v in prof.ops[HOST].items()
                 if k.rsplit(":", 1)[0] == sig)
    return float(np.interp(int(n), [c for c, _ in pts], [t for _, t in pts]))


def favourable(prof: Profile, acc: str, speedup: float = 20.0) -> Profile:
    """The measured profile with the accelerator `speedup` x faster than the CPU at every op and its
    copies and launches cheaper than its fastest op: what a GPU beside a slow CPU looks like, so that
    plans put real work on the rpc-server. Derived from the CPU's own times, so it holds however
    loaded the machine was while the rpc-server's times were measured."""
    p = copy.deepcopy(prof)
    for key, stats in p.ops[acc].items():
        stats["median_us"] = _host_us(p, key) / speedup
    floor = min(stats["median_us"] for stats in p.ops[acc].values())  # us
    for direction in p.links[acc]:
        p.links[acc][direction] = Link(floor, 10_000.0)  # a line: no measured curve
    p.devices[acc]["launch_us"] = p.devices[acc]["issue_us"] = floor
    cal = p.calibration
    if cal is not None:  # every other op, too, `speedup` x the CPU's
        host = cal.devices[HOST]
        ops = {op: OpFit(f.a_us / speedup, f.b_us / speedup, f.n) for op, f in host.ops.items()}
        cal.devices[acc] = DeviceCalibration(host.node_overhead_us / speedup, ops, host.matmul_scale)
        # the real rpc-server's scattered pass would price this imagined device's splits at the
        # real one's speed, and its dispatcher's syncs (what a plan that leaves it unattached saves): it has none
        cal.scatter = {}
        cal.detached = {}
    return p


@pytest.fixture(scope="session")
def fast_ctx(tiny_f16: Path, rpc_server: rpc.RpcServer, measured_ctx):
    prof = favourable(measured_ctx.profile, rpc_server.device_name)
    return build_context(tiny_f16, rpc_server.device_name, WORKLOAD, profile=prof, threads=1, progress=False)


# --- the MILP is exact --------------------------------------------------------------------------


def _objective(ctx, p: Placement) -> float:
    return sum(w * ctx.passes[n].cost(p).total_us for n, w in ctx.workload.pass_weights().items())


@pytest.mark.parametrize("method", ["milp", "dp"])
@pytest.mark.parametrize("budget_share", [0.3, 0.7])
@pytest.mark.parametrize("which", ["fast", "measured"])
def test_optimal_equals_brute_force(which: str, budget_share: float, method: str, fast_ctx, measured_ctx) -> None:
    ctx = fast_ctx if which == "fast" else measured_ctx
    free = ["blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
            "output.weight"]
    others = [w for w in ctx.weight_bytes if w not in free]
    budget = int(budget_share * sum(ctx.weight_bytes[w] for w in free)) + ctx.kv_bytes[1]
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    batches = sorted({k[4] for pm, _ in passes for k in pm.kinds[False].values() if k[0] == "w" and k[2]})
    # each free weight: on the accelerator, or on the host streamed from some batch on, or never
    options = ["acc", NEVER, *batches]
    best = None
    for kv in (0, 1):
        for combo in itertools.product(options, repeat=len(free)):
            on = frozenset(w for w, o in zip(free, combo, strict=True) if o == "acc")
            # a streamed weight needs room for its copy in the accelerator's compute buffer
            stream = max((ctx.weight_bytes[w] for w, o in zip(free, combo, strict=True) if o not in ("acc", NEVER)),
                         default=0)
            if sum(ctx.weight_bytes[w] for w in on) + sum(ctx.kv_bytes[i] for i in range(2 - kv, 2)) + stream > budget:
                continue
            policy = {w: o for w, o in zip(free, combo, strict=True) if o != "acc"}
            policy.update({w: NEVER for w in others})
            cost = _objective(ctx, Placement(on, kv, policy))
            if best is None or cost < best[0]:
                best = (cost, on, kv)
    sol = optimal.solve(passes, weight_bytes=ctx.weight_bytes, kv_bytes=ctx.kv_bytes, budget=budget,
                        fixed={w: False for w in others}, no_stream=others, method=method)
    assert sol is not None and best is not None and sol.method == method
    assert sol.objective_us == pytest.approx(best[0], rel=1e-6, abs=1e-6)
    assert _objective(ctx, sol.placement) == pytest.approx(sol.objective_us, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("full", [False, True], ids=["partial", "full"])
@pytest.mark.parametrize("budget_share", [0.25, 0.6])
@pytest.mark.parametrize("which", ["fast", "measured"])
def test_the_dynamic_program_and_the_milp_agree(which: str, budget_share: float, full: bool, stream: bool, fast_ctx,
                                                measured_ctx) -> None:
    """Both solvers are exact on the same program, over every weight of a real graph: equal optima,
    each the predicted time of its own placement (the MILP once counted a copy twice where a reader
    on a fixed device and one on a varying device both needed it: every full-offload program)."""
    ctx = fast_ctx if which == "fast" else measured_ctx
    budget = int(budget_share * sum(ctx.weight_bytes.values())) + sum(ctx.kv_bytes.values())
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    kw = {"weight_bytes": ctx.weight_bytes, "kv_bytes": ctx.kv_bytes, "budget": budget, "full": full, "stream": stream}
    milp = optimal.solve(passes, **kw, method="milp", time_limit=120)
    dp = optimal.solve(passes, **kw, method="dp")
    assert milp is not None and dp is not None
    assert milp.status == "Optimal" and dp.method == "dp"
    assert dp.objective_us == pytest.approx(milp.objective_us, rel=1e-9, abs=1e-6)
    for sol in (milp, dp):
        assert _objective(ctx, sol.placement) == pytest.approx(sol.objective_us, rel=1e-9, abs=1e-6)
        assert ctx.acc_bytes(sol.placement) <= budget


def test_the_dynamic_program_stops_at_its_limits(fast_ctx) -> None:
    ctx = fast_ctx
    passes = [(ctx.passes[n], w) for n, w in ctx.workload.pass_weights().items()]
    kw = {"weight_bytes": ctx.weight_bytes, "kv_bytes": ctx.kv_bytes, "budget": sum(ctx.weight_bytes.values()) // 2}
    with pytest.raises(chaindp.NotDecomposable, match="front entries"):
        chaindp.solve(passes, **kw, max_entries=1)
    with pytest.raises(chaindp.NotDecomposable, match=r"time limit|s passed"):
        chaindp.solve(passes, **kw, time_limit=0.0)
    # auto falls back to HiGHS and still returns the optimum
    auto = optimal.solve(passes, **kw)
    milp = optimal.solve(passes, **kw, method="milp")
    assert auto is not None and milp is not None
    assert auto.objective_us == pytest.approx(milp.objective_us, rel=1e-9)
    with pytest.raises(ValueError, match="method 'fast'"):
        optimal.solve(passes, **kw, method="fast")


def test_the_walk_checks_its_input() -> None:
    from oallama import _core

    one = np.zeros(1, dtype=np.int64)
    ok = (one, one, one, one, np.zeros(1), 1, one, np.zeros(1))
    assert _core.pareto_walk([ok], 0, 5.0, 10, float("inf"), 10, 10.0)[0] == 5.0
    with pytest.raises(ValueError, match="stage 0: edge arrays differ in length"):
        _core.pareto_walk([(one, np.zeros(2, dtype=np.int64), one, one, np.zeros(1), 1, one, np.zeros(1))],
                          0, 0.0, 10, float("inf"), 10, 10.0)
    with pytest.raises(ValueError, match="stage 1: edge 0 names a state out of range"):
        _core.pareto_walk([ok, (one + 3, one, one, one, np.zeros(1), 1, one, np.zeros(1))], 0, 0.0, 10,
                          float("inf"), 10, 10.0)
    # the budget: an edge fixing 20 bytes does not fit in 10
    assert _core.pareto_walk([(one, one, one + 20, one, np.zeros(1), 1, one, np.zeros(1))], 0, 0.0, 10,
                             float("inf"), 10, 10.0) is None


def test_the_solvers_objective_and_cutoff_include_the_constant_part() -> None:
    """The program's constant part (us) is HiGHS's objective offset: the objective it returns,
    the cutoff (another mode's optimum) and the relative MIP gap are of the predicted time itself."""
    prog = optimal._Program()
    a, b = prog.var(integer=True), prog.var(integer=True)
    prog.offset = 1000.0  # us whatever the placement
    prog.cost[a], prog.cost[b] = -3.0, -2.0  # us saved by each
    prog.leq_const(optimal._Lin(0.0, {a: 1.0, b: 1.0}), 1.0)  # room for one of them
    status, x, obj, gap = prog.solve(10.0)
    assert status == "Optimal" and obj == pytest.approx(997.0) and round(x[a]) == 1 and gap <= 1e-6
    assert prog.solve(10.0, cutoff=997.5)[2] == pytest.approx(997.0)
    assert prog.solve(10.0, cutoff=996.5)[2] == float("inf")  # nothing beats the cutoff


@pytest.mark.parametrize("budget", ["25%", "50%", "75%", "100%"])
@pytest.mark.parametrize("which", ["fast", "measured"])
def test_strategies_respect_the_budget_and_the_solvers_plan_is_never_worse(which: str, budget: str, fast_ctx,
                                                                          measured_ctx) -> None:
    ctx = fast_ctx if which == "fast" else measured_ctx
    limit = parse_budget(budget, ctx.model.weight_bytes)
    plans = {}
    for s in STRATEGIES:
        plans[s] = make_plan(ctx, s, budget, candidates=list(plans.values()))
        # llama.cpp's own accounting of the load (weights, KV, compute buffers on the accelerator)
        assert plans[s].memory["total"] <= limit, s
    # the solver's OWN plan, not a baseline the plan may carry instead: it exists (the solver
    # found a placement that llama.cpp's accounting shows to fit) and is predicted no slower
    # than any baseline, within the relative gap the solver reports (0 when proven optimal)
    key = f"{ctx.workload.objective}_ms"
    opt = plans["optimal"]
    own = opt.extra["solver_objective_ms"]
    assert own is not None, f"the solver returned no plan that fits: {opt.extra}"
    gap = float(opt.extra.get("mip_gap") or 0.0)
    for s in STRATEGIES:
        if s != "optimal":
            assert own * (1 - gap) <= plans[s].predicted[key] * (1 + 1e-9), (s, own, gap, plans[s].predicted[key])
    # the plan says which placement it carries: the solver's, or a baseline's (then exactly that one)
    winner = opt.extra["winner"]
    carried = own if winner == "solver" else plans[winner].predicted[key]
    assert opt.predicted[key] == pytest.approx(carried, rel=1e-9)
    assert opt.predicted[key] <= own


@pytest.mark.parametrize("answer", [0, 1, 5, 33])
@pytest.mark.parametrize("guessing", ["exact", "over", "under", "outside", "wild"])
def test_the_guided_search_finds_what_a_binary_search_finds(answer: int, guessing: str) -> None:
    hi = 33
    probes: list[int] = []

    def fits(n: int) -> bool:
        probes.append(n)
        return n <= answer

    shift = {"exact": 0, "over": 3, "under": -2, "outside": 99, "wild": 0}[guessing]
    wild = iter([17, 2, 30, 9, 1])

    def guess(lo: int, hi: int, last: int) -> int:  # a good guess names the answer, or lo + 1 once lo is it
        return next(wild) if guessing == "wild" else max(answer + shift, lo + 1)

    assert guided_search(0, hi, fits, guess) == answer
    bisect: list[int] = []
    lo, top = 0, hi
    while lo < top:  # the binary search it stands in for
        mid = (lo + top + 1) // 2
        bisect.append(mid)
        lo, top = (mid, top) if mid <= answer else (lo, mid - 1)
    assert len(probes) <= len(bisect) + 2, (probes, bisect)
    if guessing == "exact":
        assert len(probes) <= 2, probes


@pytest.mark.parametrize("budget", ["25%", "50%", "75%", "100%"])
def test_layers_is_the_largest_n_gpu_layers_whose_load_fits(budget: str, measured_ctx) -> None:
    ctx = measured_ctx
    limit = parse_budget(budget, ctx.model.weight_bytes)
    plan = make_plan(ctx, "layers", budget)
    # every n_gpu_layers loaded, as llama.cpp accounts it: the largest that fits, or 0
    fitting = [n for n in range(ctx.n_layer + 2)
               if measure_memory(ctx, place_layers(ctx, n), stock_layers=n)["total"] <= limit]
    assert plan.extra["n_gpu_layers"] == max(fitting, default=0)


# --- the paper's Algorithm 1, by hand ------------------------------------------------------------


def test_affinity_reproduces_a_hand_computed_example() -> None:
    # (name, T_c us, T_g us, M bytes):  B = (Tc - Tg) / M  ->  A 2, B 4, C 1, D 2
    ops = [("A", 10.0, 2.0, 4), ("B", 9.0, 1.0, 2), ("C", 5.0, 4.0, 1), ("D", 8.0, 6.0, 1)]
    # normalised G: B 1, A 1/3, D 1/3, C 0 -> order B, A, D, C (ties by name); limit 0.9 * 7.8 = 7.02:
    # B + A + D = 7 fit, C would make 8.  Then T': B pays 7 us of copies whenever A is on the GPU:
    # B -> (9 - 1 - 7) / 2 = 0.5; G: A 1, D 1, C 1/3, B 0 -> order A, D, C, B; fill A + D + C = 6,
    # B would make 8. Round 2 sees the same T' (A still on the GPU): the order is stable.
    seen = []

    def transfer(on: frozenset[str]) -> dict[str, float]:
        seen.append(on)
        return {"B": 7.0 if "A" in on else 0.0}

    order, on, rounds = affinity_order(ops, 0.9 * 7.8, transfer)
    assert seen == [frozenset("ABD"), frozenset("ACD")]
    assert order == ["A", "D", "C", "B"]
    assert on == frozenset("ACD")
    assert rounds == 2


# --- inspect -> profile -> plan -> load ---------------------------------------------------------


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a - b) ** 2).sum() / (b**2).sum())


@pytest.fixture(scope="session")
def cpu_reference(tiny_f16: Path):
    llm = Llama(str(tiny_f16), n_ctx=256, n_ubatch=64, n_threads=1, verbose=False, logits_all=True)
    prompt = llm.tokenize(b"Once upon a time, in a land far away, there lived" * 2)
    llm.eval(prompt)
    ref = np.array(llm.scores[: len(prompt)])
    text = llm(llm.detokenize(prompt).decode(), max_tokens=12, temperature=0)["choices"][0]["text"]
    llm.close()
    return prompt, ref, text


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flow_on_an_rpc_device_matches_cpu(strategy: str, tiny_f16: Path, rpc_server: rpc.RpcServer, fast_ctx,
                                          cpu_reference, tmp_path: Path) -> None:
    prompt, ref, text = cpu_reference
    # closed on failure too: an open load keeps its connection to the session's one-client rpc-server
    with contextlib.closing(Llama(str(tiny_f16), gpu_budget="60%", placement=strategy,
                                  device=rpc_server.device_name, workload=WORKLOAD, profile=fast_ctx.profile,
                                  n_ctx=256, n_ubatch=64, n_threads=1, verbose=False, logits_all=True)) as llm:
        plan = llm.plan
        assert plan is not None and plan["strategy"] == strategy
        on_acc = {w for w, d in plan["placement"].items() if d == rpc_server.device_name}
        assert on_acc, "the favourable profile should put weights on the rpc device"
        assert {w for w, d in llm.tensor_devices().items() if d == rpc_server.device_name} == on_acc
        policy = {w: b for w, b in plan["offload_min_batch"].items()}
        assert {w for w in llm.offload_policy()} == set(policy)
        llm.eval(prompt)
        assert _nmse(np.array(llm.scores[: len(prompt)]), ref) < 1e-4
        llm.reset()
        assert llm(llm.detokenize(prompt).decode(), max_tokens=12, temperature=0)["choices"][0]["text"] == text
    # the plan file reproduces the same load
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with contextlib.closing(Llama(str(tiny_f16), placement=str(path), n_ctx=256, n_ubatch=64, n_threads=1,
                                  verbose=False)) as again:
        assert {w for w, d in again.tensor_devices().items() if d == rpc_server.device_name} == on_acc
        assert again.plan == plan


@pytest.mark.parametrize("strategy", ["layers", "affinity", "optimal", "fit"])
def test_emitted_stock_command_places_as_planned(strategy: str, tiny_f16: Path, rpc_server: rpc.RpcServer, fast_ctx,
                                                tmp_path: Path) -> None:
    """`oallama plan --emit-ot`'s command on oallama's stock llama-server: the weights go where the
    plan says and the context has the settings it was costed at (both read from the server's own
    load log), and it generates what oallama's load generates."""
    plan = make_plan(fast_ctx, strategy, "60%")
    cmd = plan.stock_command()
    assert cmd[:3] == ["llama-server", "-m", str(tiny_f16)]
    assert cmd[cmd.index("--rpc") + 1] == rpc_server.endpoint and cmd[cmd.index("--device") + 1] == "RPC0"
    on_acc = {w for w, d in plan.assignment().items() if d == rpc_server.device_name}
    assert on_acc, "the favourable profile should put weights on the rpc device"
    prompt, n = "Once upon a time, in a land far away, there lived", 12
    wl = plan.workload  # loaded as the runtime loads a plan (bench/scripts/bench_prediction.py: real_runs)
    settings = {"n_ctx": wl.n_ctx, "n_batch": wl.n_ubatch, "n_ubatch": wl.n_ubatch, "n_threads": 1, "flash_attn": False}
    with contextlib.closing(Llama(str(tiny_f16), placement=str(plan.save(tmp_path / "plan.json")), verbose=False,
                                  **settings)) as llm:
        assert {w for w, d in llm.tensor_devices().items() if d == rpc_server.device_name} == on_acc
        want = greedy_tokens(llm, prompt, n)
    # the same command against a fresh rpc-server (the session's serves one client at a time)
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as other:
        args = [a.replace(rpc_server.endpoint, other.endpoint) for a in cmd[1:]]
        with stock_server([*args, "-v"], log) as url:  # the command as emitted: it pins every setting
            out = post_json(url + "/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0,
                                                  "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True})
    text = log.read_text(errors="replace")
    placed = stock_placement(text, list(plan.assignment()), fast_ctx.n_layer)
    assert {w for w, d in placed.items() if d.startswith("RPC0")} == on_acc
    assert stock_context(text) == planned_context(plan)
    assert_memory_as_planned(plan, text, "RPC0")
    assert out["tokens"] == want


def test_stock_command_of_per_weight_streaming_takes_the_memory_the_plan_says(fast_ctx, tiny_f16: Path,
                                                                               tmp_path: Path) -> None:
    """A plan streaming host weights by per-weight thresholds: the stock command cannot (an
    rpc-server has no offload_op, and stock's threshold is global), so its load's compute buffers
    differ from the plan's own, and the plan says what they are (`Plan.stock_memory`, measured)."""
    base = make_plan(fast_ctx, "layers", "60%")
    host = [w for w in fast_ctx.weight_bytes if w not in base.placement.on_acc and w.endswith("_up.weight")]
    assert host, "60% of tiny's weights leaves an ffn_up weight on the host"
    placement = Placement(base.placement.on_acc, base.placement.kv_layers, dict.fromkeys(host, 2))
    plan = with_stock_memory(fast_ctx, dataclasses.replace(
        base, strategy="optimal", placement=placement, stock_layers=False, extra={},
        memory=measure_memory(fast_ctx, placement)))
    assert not plan.stock_streams_as_planned()
    assert plan.stock_memory["compute"] < plan.memory["compute"], "streamed copies need room on the accelerator"
    log = tmp_path / "llama-server.log"
    with rpc.start_server(threads=1) as other:
        cmd = plan.stock_command()
        args = [a.replace(devices.rpc_endpoint(plan.accelerator) or "", other.endpoint) for a in cmd[1:]]
        with stock_server([*args, "-v"], log):
            pass
    text = log.read_text(errors="replace")
    assert stock_memory(text, "RPC0")["compute"] != plan.memory["compute"]
    assert_memory_as_planned(plan, text, "RPC0")


def test_a_plans_memory_is_what_its_load_reserves(fast_ctx, tiny_f16: Path, rpc_server: rpc.RpcServer,
                                                  tmp_path: Path) -> None:
    """The plan's bytes on the accelerator (llama.cpp's accounting of a metadata-only load) are the
    loaded model's, compute buffers included: both reserve one row of logits per ubatch, as
    llama-server does. A Llama that reads every token's logits (logits_all) reserves a row per token."""
    plan = make_plan(fast_ctx, "layers", "60%")
    wl, path = plan.workload, str(plan.save(tmp_path / "plan.json"))
    kw: dict[str, Any] = {"n_ctx": wl.n_ctx, "n_batch": wl.n_ubatch, "n_ubatch": wl.n_ubatch, "n_threads": 1,
                          "verbose": False}

    def reserved(**more: Any) -> dict[str, int]:
        with contextlib.closing(Llama(str(tiny_f16), placement=path, **kw, **more)) as llm:
            rows = [m for m in _core.memory(llm.native_context) if m.device == rpc_server.device_name]
        return {k: sum(int(getattr(m, k)) for m in rows) for k in ("model", "context", "compute")}

    got = reserved()
    assert got["model"] > 0 and got == {k: plan.memory[k] for k in got}
    every = reserved(logits_all=True)
    assert every["model"] == got["model"] and every["compute"] > got["compute"]


@pytest.mark.parametrize("n_tokens", [1, 32])
def test_a_tied_embedding_on_the_accelerator_moves_its_output_matmul_not_its_lookup(
        gemma3_270m: Path, rpc_server: rpc.RpcServer, n_tokens: int) -> None:
    """A tied model's `token_embd.weight` placed on the accelerator is its output copy there, the
    input copy on the host (place.explicit, as -ngl loads it): the pass model runs the output matmul
    on the accelerator and the lookup (GET_ROWS) on the host, and copies neither copy's 178 MB."""
    acc = rpc_server.device_name
    with GraphSession(gemma3_270m, devices=[acc], n_ctx=256, n_ubatch=32) as s:
        g = s.graph(n_tokens)
    pm = PassModel(g, None, acc, n_layer=18)
    pm.h2d = pm.d2h = pm.stream = Link(0.0, 1.0)  # bytes per us: copies are counted, not timed here
    pm.launch = {0: 0.0, 1: 0.0}
    cost = pm.cost(Placement(frozenset({"token_embd.weight"}), 0))
    on = {g.nodes[i].op: cost.on_acc[i] for i in pm.order if g.nodes[i].weight == "token_embd.weight"}
    assert on == {"GET_ROWS": False, "MUL_MAT": True}
    assert cost.copy_bytes < 2**20


def test_plan_file_for_another_model_is_refused(fast_ctx, synth_model, tmp_path: Path) -> None:
    plan = make_plan(fast_ctx, "affinity", "50%")
    path = plan.save(tmp_path / "plan.json")
    other = synth_model("tiny", "q8_0")
    with pytest.raises(PlanError, match=r"plan was made for model .* not tiny-q8_0\.gguf"):
        Llama(str(other), placement=str(path), verbose=False)


def test_plan_on_missing_devices_is_refused(fast_ctx, tiny_f16: Path, tmp_path: Path) -> None:
    doc = make_plan(fast_ctx, "optimal", "50%").to_json()
    gone = rpc.start_server(threads=1)
    gone.stop()
    for dev, error in ((gone.device_name, "cannot reach rpc-server"), ("CUDA7", "unknown device 'CUDA7'")):
        bad = json.loads(json.dumps(doc).replace(fast_ctx.acc, dev))
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises((UnknownDeviceError, oallama_errors().RpcServerError), match=error):
            Llama(str(tiny_f16), placement=str(path), verbose=False)


def oallama_errors():
    import oallama.errors

    return oallama.errors


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"placement": "optimal", "device": "__acc__"}, "needs gpu_budget"),
    ({"placement": "fastest", "gpu_budget": "50%"}, "not a plan file and not a strategy"),
    ({"placement": {"output.weight": "CPU"}, "gpu_budget": "50%"}, "go with placement="),
    ({"gpu_budget": "12 GB", "device": "__acc__"}, "binary units"),
])
def test_bad_plan_arguments(kwargs: dict, error: str, tiny_f16: Path, rpc_server: rpc.RpcServer, fast_ctx) -> None:
    kwargs = {k: (rpc_server.device_name if v == "__acc__" else v) for k, v in kwargs.items()}
    with pytest.raises((PlanError, BudgetError), match=error):
        Llama(str(tiny_f16), profile=fast_ctx.profile, workload=WORKLOAD, n_ubatch=64, verbose=False, **kwargs)



def test_never_streaming_where_nothing_streams_by_default_is_not_named(measured_ctx, fast_ctx) -> None:
    """An rpc-server has no offload rule of its own: a plan's "never stream" entries change nothing
    and are dropped (the plan then loads as a baseline's), while a threshold that streams stays."""
    from oallama.bench.accuracy import placement_key
    from oallama.planner.plan import unnamed_defaults

    weights = sorted(measured_ctx.weight_bytes)
    never = Placement(frozenset(), 0, dict.fromkeys(weights, NEVER))
    plain = unnamed_defaults(measured_ctx, never)
    assert plain.min_batch == {}
    assert measured_ctx.predict(plain) == measured_ctx.predict(never)
    streamed = Placement(frozenset(), 0, {**never.min_batch, weights[-1]: 1})
    assert unnamed_defaults(measured_ctx, streamed).min_batch == {weights[-1]: 1}
    # a host-only optimal plan is the layers baseline's placement: nothing fits a 1-byte budget
    opt, layers = make_plan(fast_ctx, "optimal", 1), make_plan(fast_ctx, "layers", 1)
    assert not opt.placement.on_acc and opt.to_json()["offload_min_batch"] == {}
    assert placement_key(opt.to_json()) == placement_key(layers.to_json())

def test_layers_leave_what_the_loader_keeps_on_the_host(measured_ctx) -> None:
    # a weight -ngl assigns to the device but the device cannot run (context.loader_kept, checked
    # against a real load on Vulkan in test_vulkan.py) stays on the host in llama.cpp's placement
    every = place_layers(measured_ctx, measured_ctx.n_layer + 1)
    assert "output.weight" in every.on_acc
    ctx = dataclasses.replace(measured_ctx, kept_on_host=frozenset({"output.weight"}))
    assert place_layers(ctx, ctx.n_layer + 1).on_acc == every.on_acc - {"output.weight"}
    assert place_layers(ctx, 1).on_acc == {"output_norm.weight"}  # the output layer, less its matrix
