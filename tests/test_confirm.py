"""The confirmation step (planner.confirm): the final choice is measured, not predicted.

Real loads of real plans on CPU + a loopback rpc-server (`mid`, 4 layers, q8_0): a plan that puts
every other weight on the server crosses the loopback at nearly every weight, and runs far slower
than the host alone whatever it is predicted at (2.6-2.8x here: 150-165 ms a round against 57).
Which plan is kept is what these tests check; how fast anything ran is the benchmarks' business."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oallama.planner import confirm as C
from oallama.planner.cost.schedmodel import Placement
from oallama.planner.plan import Workload, build_context, make_plan
from oallama.planner.plancmd import confirmation_table
from oallama.runtime import rpc
from oallama.runtime.planfile import ConfirmOptions

WORKLOAD = Workload(prompt=32, gen=16, n_ubatch=32)
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


@pytest.fixture(scope="module")
def ctx(synth_model, rpc_server: rpc.RpcServer) -> Any:
    return build_context(synth_model("mid", "q8_0", n_layer=4), rpc_server.device_name, WORKLOAD, threads=1,
                         progress=False)


@pytest.fixture(scope="module")
def host_only(ctx: Any) -> Any:
    plan = make_plan(ctx, "layers", 1)  # nothing fits in 1 byte: llama.cpp's -ngl 0
    assert not plan.placement.on_acc
    return plan


@pytest.fixture(scope="module")
def scattered(ctx: Any, host_only: Any) -> Any:
    """Every other weight on the rpc-server (loaded by overrides, costed by the model)."""
    p = Placement(frozenset(sorted(ctx.weight_bytes)[::2]), 0)
    return dataclasses.replace(host_only, strategy="affinity", placement=p, stock_layers=False,
                               predicted=ctx.predict(p))


def _predicted_as(plan: Any, factor: float) -> dict[str, Any]:
    return {**plan.predicted, **{m: plan.predicted[m] * factor for m in METRICS}}


def test_a_mispredicted_plan_is_rejected_by_measurement(ctx: Any, host_only: Any, scattered: Any,
                                                        tmp_path: Path) -> None:
    """The scattered placement predicted 10x faster than the host alone: measured, it is slower, and
    llama.cpp's placement is kept -- as the requested strategy's plan, which loads as -ngl does and
    records every candidate's predicted and measured times. Slower in every round (2.6-2.8x), the
    rounds stop at the first after which no round to come could change that (`settled`, said in the
    reason), not at the 5 allowed."""
    liar = dataclasses.replace(scattered, strategy="optimal", predicted=_predicted_as(host_only, 0.1))
    most = ConfirmOptions().confirm_rounds
    conf = C.confirm(ctx, {"layers": host_only, "optimal": liar}, ConfirmOptions(), cache=False, progress=False)
    assert conf.chosen.labels == ["layers"] and C.MIN_ROUNDS <= conf.rounds <= most

    def settled_after(r: int) -> bool:  # on the first r rounds measured
        return C.settled([dataclasses.replace(c, runs=c.runs[:r]) for c in conf.candidates], most - r)

    assert not any(settled_after(r) for r in range(C.MIN_ROUNDS, conf.rounds)), conf.reason
    assert conf.rounds == most or (settled_after(conf.rounds) and "settled after" in conf.reason), conf.reason
    assert conf.ratios["optimal"]["vs_baseline"] > 1.0
    doc = json.loads(conf.plan.save(tmp_path / "plan.json").read_text())
    assert doc["strategy"] == "optimal" and doc["extra"]["winner"] == "layers" and doc["load"] == "n_gpu_layers"
    assert set(doc["placement"].values()) == {"CPU"}
    cands = {tuple(c["labels"]): c for c in doc["extra"]["confirmation"]["candidates"]}
    assert set(cands) == {("layers",), ("optimal",)}
    assert cands[("optimal",)]["predicted"]["e2e_ms"] == pytest.approx(host_only.predicted["e2e_ms"] * 0.1)
    for c in cands.values():
        assert len(c["runs"]) == conf.rounds and all(c["measured"][m] > 0 for m in ("ttft_ms", "tpot_ms"))
    assert "kept (*): kept llama.cpp's 'layers'" in confirmation_table(conf)


def test_a_plan_measured_faster_replaces_the_baseline(ctx: Any, host_only: Any, scattered: Any) -> None:
    """The other way round: llama.cpp's placement (here, by construction, the scattered one) measured
    slower than the candidate by more than the rounds' spread: the candidate is kept, though it was
    predicted slower."""
    slow_base = dataclasses.replace(scattered, strategy="layers")
    honest = dataclasses.replace(host_only, strategy="optimal", predicted=_predicted_as(slow_base, 2.0))
    conf = C.confirm(ctx, {"layers": slow_base, "optimal": honest}, ConfirmOptions(), cache=False, progress=False)
    assert conf.chosen.labels == ["optimal"], conf.reason
    r = conf.ratios["optimal"]
    assert 1 - r["vs_baseline"] > max(r["spread"], C.TIE)
    assert conf.plan.strategy == "optimal" and "winner" not in conf.plan.extra


def test_the_baseline_wins_a_tie(ctx: Any, host_only: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same placement, once as llama.cpp's and once as a candidate predicted twice as fast: the
    baseline is kept. Every round runs on a fresh load of each: a load's speed is its own (the same
    two loads measured one up to 7% faster in every round), which only fresh loads put in the
    rounds' spread."""
    loads: list[str] = []
    open_ = C._Runner.open
    monkeypatch.setattr(C._Runner, "open", lambda self, c: loads.append(c.label) or open_(self, c))
    cands = [C.Candidate(["layers"], host_only, True, host_only.predicted["e2e_ms"]),
             C.Candidate(["optimal"], dataclasses.replace(host_only, strategy="optimal"), False,
                         host_only.predicted["e2e_ms"] / 2)]
    conf = C.confirm(ctx, {}, ConfirmOptions(confirm_rounds=7), candidates=cands, cache=False, progress=False)
    assert conf.chosen is cands[0], conf.reason
    assert conf.plan.extra["winner"] == "layers"
    assert conf.rounds >= C.MIN_ROUNDS and sorted(loads) == ["layers"] * conf.rounds + ["optimal"] * conf.rounds, loads


def test_the_time_bound_holds(ctx: Any, host_only: Any, scattered: Any) -> None:
    """Rounds stop when the next would end past the bound (here long before the 50 asked for); with
    fewer than MIN_ROUNDS rounds nothing departs from llama.cpp's placement, however fast it ran.
    A bound of 0 measures nothing at all."""
    bound = 1.5
    plans = {"layers": dataclasses.replace(scattered, strategy="layers"),
             "optimal": dataclasses.replace(host_only, strategy="optimal")}
    t0 = time.perf_counter()
    conf = C.confirm(ctx, plans, ConfirmOptions(confirm_time=bound, confirm_rounds=50), cache=False, progress=False)
    spent = time.perf_counter() - t0
    assert spent <= bound + 0.5 and conf.rounds < 50, (spent, conf.rounds)
    if conf.rounds < C.MIN_ROUNDS:
        assert conf.chosen.labels == ["layers"] and "time bound" in conf.reason
    none = C.confirm(ctx, plans, ConfirmOptions(confirm_time=0), cache=False, progress=False)
    assert none.rounds == 0 and all(c.load_s == 0 and not c.runs for c in none.candidates)
    assert none.chosen.labels == ["layers"] and "nothing was measured" in none.reason


@pytest.mark.parametrize(("set_s", "est_s", "bound_s"), [
    (None, 10.0, 60.0), (None, 100.0, 150.0), (None, 1000.0, 600.0), (30.0, 1000.0, 30.0), (0.0, 100.0, 0.0),
], ids=["auto-least", "auto-1.5x", "auto-most", "set", "set-zero"])
def test_the_time_bound_is_set_or_from_the_estimate(set_s: float | None, est_s: float, bound_s: float) -> None:
    assert C.time_bound(ConfirmOptions(confirm_time=set_s), est_s) == bound_s


def test_an_automatic_bound_measures_what_a_fixed_60_s_would_cut(ctx: Any, host_only: Any, scattered: Any) -> None:
    """Three placements predicted at about 10 s a run (3 rounds and their loads: over 60 s): the
    automatic bound measures all three; a bound of 60 s drops one before anything runs."""
    odd = Placement(frozenset(sorted(ctx.weight_bytes)[1::2]), 0)
    plans = [(["layers"], host_only, True), (["optimal"], scattered, False),
             (["affinity"], dataclasses.replace(scattered, placement=odd), False)]
    factor = 10e3 / host_only.predicted["e2e_ms"]  # ~10 s a run, predicted

    def cands() -> list[Any]:
        return [C.Candidate(labels, dataclasses.replace(p, predicted=_predicted_as(p, factor)), base,
                            p.predicted["e2e_ms"] * factor) for labels, p, base in plans]

    auto = C.confirm(ctx, {}, ConfirmOptions(confirm_rounds=3), candidates=cands(), cache=False, progress=False)
    assert auto.bound_s is not None and C.AUTO_BOUND_S[0] < auto.bound_s <= C.AUTO_BOUND_S[1]
    assert len(auto.candidates) == 3 and auto.rounds == 3, auto.reason
    assert auto.to_json()["time_bound"] == "auto"
    fixed = C.confirm(ctx, {}, ConfirmOptions(confirm_time=60, confirm_rounds=3), candidates=cands(), cache=False,
                      progress=False)
    assert fixed.bound_s == 60 and len(fixed.candidates) == 2


def test_a_confirmation_is_cached(ctx: Any, host_only: Any, scattered: Any) -> None:
    """The same shortlist, profile, workload and settings again: the cached measurement is reused
    (nothing loaded); --reconfirm measures again."""
    plans = {"layers": host_only, "optimal": dataclasses.replace(scattered, strategy="optimal")}
    opts = ConfirmOptions(confirm_rounds=3)
    first = C.confirm(ctx, plans, opts, progress=False)
    again = C.confirm(ctx, plans, opts, progress=False)
    assert again.mode == "cached" and again.chosen.label == first.chosen.label
    assert [c.runs for c in again.candidates] == [c.runs for c in first.candidates]
    fresh = C.confirm(ctx, plans, dataclasses.replace(opts, reconfirm=True), progress=False)
    assert fresh.mode == "together" and fresh.rounds == 3


def test_the_shortlist_merges_plans_that_load_alike(ctx: Any, host_only: Any, scattered: Any) -> None:
    plans = {"layers": host_only, "fit": dataclasses.replace(host_only, strategy="fit"),
             "optimal": dataclasses.replace(scattered, strategy="optimal")}
    cands = C.shortlist(ctx, plans)
    assert [c.labels for c in cands] == [["layers", "fit"], ["optimal"]] and cands[0].baseline
    one = C.confirm(ctx, {"layers": host_only, "optimal": dataclasses.replace(host_only, strategy="optimal")},
                    progress=False)
    assert one.mode == "none" and one.chosen.labels == ["layers", "optimal"] and "winner" not in one.plan.extra


def _cand(labels: list[str], baseline: bool, objective: list[float | None]) -> C.Candidate:
    return C.Candidate(labels, None, baseline, 100.0,  # type: ignore[arg-type]
                       [None if v is None else {"objective_ms": v} for v in objective])


@pytest.mark.parametrize(("predicted", "dropped"), [
    ({"layers": 150.0, "no-repack": 100.0, "optimal": 90.0}, "layers"),
    ({"layers": 100.0, "no-repack": 120.0, "optimal": 300.0}, "no-repack"),  # not the last of oallama's
    ({"layers": 100.0, "optimal": 90.0, "affinity": 200.0}, "affinity"),
    ({"layers": 400.0, "optimal": 90.0, "affinity": 200.0}, "affinity"),  # not the last of llama.cpp's
], ids=["slowest-baseline", "keeps-optimal", "slowest-challenger", "keeps-layers"])
def test_a_time_bound_drops_the_slowest_but_one_of_each(predicted: dict[str, float], dropped: str) -> None:
    """Over the time bound, the candidate predicted slowest goes first, unless it is the last of
    llama.cpp's placements or of oallama's plans."""
    cands = [dataclasses.replace(_cand([s], s in C.LLAMA_CPP_OWN, []), predicted_ms=ms) for s, ms in predicted.items()]
    assert cands[C.first_dropped(cands)].label == dropped


@pytest.mark.parametrize(("base", "others", "more", "done"), [
    ([100.0] * 3, {"optimal": [110.0, 120.0, 105.0]}, 2, True),  # slower every round
    ([100.0] * 3, {"optimal": [90.0, 91.0, 92.0]}, 2, False),  # departs
    ([100.0] * 3, {"optimal": [98.0, 110.0, 110.0]}, 2, True),  # 2% faster once: under TIE whatever comes
    ([100.0] * 3, {"optimal": [96.0, 110.0, 110.0]}, 2, False),  # two fast rounds to come could make it depart
    ([100.0] * 3, {"optimal": [96.0, 110.0, 110.0]}, 1, True),  # one could not
    ([100.0] * 2, {"optimal": [150.0, 150.0]}, 3, False),  # fewer than MIN_ROUNDS
    ([100.0, 104.0, 96.0], {"no-repack": [101.0, 102.0, 103.0], "optimal": [150.0] * 3}, 2, False),  # the best may change
    ([100.0] * 3, {"no-repack": [130.0, 140.0, 150.0], "optimal": [150.0] * 3}, 2, True),
], ids=["slower", "departs", "under-tie", "could-depart", "one-more", "two-rounds", "baselines-close",
        "baselines-apart"])
def test_settled_when_no_round_to_come_could_change_it(base: list[float], others: dict[str, list[float]], more: int,
                                                        done: bool) -> None:
    cands = [_cand(["layers"], True, base)] + [_cand([s], s in C.LLAMA_CPP_OWN, v) for s, v in others.items()]
    assert C.settled(cands, more) is done


@pytest.mark.parametrize(("challenger", "kept"), [
    ([90.0, 91.0, 92.0], "optimal"),  # 9% faster, spread 1%
    ([90.0, 91.0], "layers"),  # faster, but fewer than MIN_ROUNDS paired rounds
    ([99.0, 99.0, 99.0], "layers"),  # 1% faster: under TIE
    ([80.0, 99.0, 120.0], "layers"),  # the median 1% faster, spread 20%
    ([80.0, 90.0, 105.0], "layers"),  # 10% faster, spread 12.5%
], ids=["clear", "two-rounds", "under-tie", "median-in-spread", "gain-in-spread"])
def test_decision_rule(challenger: list[float], kept: str) -> None:
    """decide() on given measurements: the challenger replaces the best baseline only when its
    round-by-round ratio is below 1 by more than TIE and the spread, over MIN_ROUNDS rounds."""
    base = [100.0] * len(challenger)
    cands = [_cand(["layers"], True, base), _cand(["fit"], True, [110.0] * len(challenger)),
             _cand(["optimal"], False, challenger)]
    chosen, _, ratios = C.decide(cands)
    assert chosen.labels == [kept]
    assert ratios["optimal"]["paired_rounds"] == len(challenger)


@pytest.mark.parametrize(("layers_bytes", "fit_bytes", "kept"), [
    (296 * 2**20, 296 * 2**20, "optimal"),  # -ngl 0's compute buffers over a 260 MiB budget (an H200 cell)
    (296 * 2**20, 200 * 2**20, "fit"),  # fit within it: the rule as below, with fit the baseline
    (200 * 2**20, 200 * 2**20, "layers"),  # both within it: the rule as below
], ids=["own-over-budget", "fit-within", "own-within"])
def test_a_placement_over_the_budget_is_never_kept(layers_bytes: int, fit_bytes: int, kept: str) -> None:
    """`optimal` measured 1.2x llama.cpp's `layers` and 1.1x its `fit` (3 equal rounds each): each of
    those kept only where its load (llama.cpp's accounting) fits the budget, else the fastest that does."""
    budget = 260 * 2**20
    cands = [_cand(["layers"], True, [100.0] * 3), _cand(["fit"], True, [109.0] * 3),
             _cand(["optimal"], False, [120.0] * 3)]
    for c, total in zip(cands, (layers_bytes, fit_bytes, 0), strict=True):
        c.plan = SimpleNamespace(memory={"total": total}, budget_bytes=budget)  # type: ignore[assignment]
    chosen, why, ratios = C.decide(cands)
    assert chosen.labels == [kept], why
    assert ("budget" in why) == (kept != "layers")
    if kept == "optimal":  # compared with llama.cpp's best all the same
        assert ratios["optimal"]["vs_baseline"] == pytest.approx(1.2)


@pytest.mark.parametrize(("challenger", "first_run", "kept"), [
    ([40.0, 41.0, 42.0], None, "optimal"),  # under half the baseline's predicted 100 ms
    ([60.0, 60.0, 60.0], None, "layers"),  # faster than predicted for it, but not by CENSORED
    ([40.0, 41.0], None, "layers"),  # fewer than MIN_ROUNDS rounds
    ([60.0, 60.0, 60.0], 130.0, "optimal"),  # under half its one run (which stands for the prediction)
    ([40.0, 41.0, 42.0], 70.0, "layers"),  # its one run: not 2x slower, whatever the prediction
], ids=["far-faster", "not-far-enough", "two-rounds", "first-run", "first-run-close"])
def test_a_baseline_too_slow_to_run_is_compared_by_its_first_run_or_prediction(
        challenger: list[float], first_run: float | None, kept: str) -> None:
    """llama.cpp's placement too slow to run (again) within the time bound (lavapipe's streamed
    prompts: 53 s against 1.8): a plan measured at under 1/CENSORED of its one run, or of its
    prediction where it never ran, replaces it."""
    base = _cand(["layers"], True, [None] * len(challenger))
    base.too_slow = True
    base.warmup = None if first_run is None else {"objective_ms": first_run}
    chosen, why, _ = C.decide([base, _cand(["optimal"], False, challenger)])
    assert chosen.labels == [kept], why


def test_llama_loads_the_confirmed_plan(synth_model) -> None:
    """Llama(placement="optimal") on the CPU alone loads the plan its confirmation kept, which the
    plan records; confirm=False loads the predicted plan and measures nothing; confirm= with a fixed
    placement is refused."""
    from contextlib import closing

    from oallama import Llama
    from oallama.errors import PlanError

    model = str(synth_model("tiny", "q8_0"))
    wl = {"prompt": 32, "gen": 8, "n_ubatch": 32}
    kw: dict[str, Any] = {"placement": "optimal", "workload": wl, "n_ctx": 256, "n_threads": 1, "verbose": False}
    with closing(Llama(model, **kw, confirm={"confirm_time": 30, "confirm_rounds": 3, "reconfirm": True})) as llm:
        plan = llm.plan
        assert plan is not None and plan["strategy"] == "optimal"
        conf = plan["extra"]["confirmation"]
        assert conf["mode"] in ("together", "none") and conf["measured_as"].startswith("prompt 32 tokens")
        kept = next(c for c in conf["candidates"] if c["labels"] == conf["chosen"])
        assert kept["key"] == C.load_key(plan)
    with closing(Llama(model, **kw, confirm=False)) as llm:
        assert llm.plan is not None and "confirmation" not in llm.plan["extra"]
    with pytest.raises(PlanError, match="confirm= goes with placement='optimal'"):
        Llama(model, placement={"output.weight": "CPU"}, confirm=True, verbose=False)

