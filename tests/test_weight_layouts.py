"""Host weight layouts as placements: plain, repacked and dual (patch 0006) weights compute the
same model, read back where they were put, and the planner chooses them per weight."""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import raises_cleanly
from oallama import Llama, _core
from oallama.errors import PlacementError, PlanError
from oallama.planner import layouts as layoutmod
from oallama.planner.cost.profile import DUAL, PLAIN, REPACK
from oallama.planner.plan import Workload, build_context, make_plan, parse_host_budget, unnamed_defaults
from oallama.planner.workload import Ubatch

PROMPT = b"The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
pytestmark = pytest.mark.skipif("CPU_REPACK_DUAL" not in _core.cpu_layouts(), reason="no repacked CPU layouts")


def _layout(buffer_type: str) -> str:
    """The layout a buffer type holds: mmap'd file data ("CPU_Mapped") is plain memory."""
    return PLAIN if buffer_type == "CPU_Mapped" else buffer_type


def _repacked(path: Path) -> list[str]:
    """Weights llama.cpp's default load repacks (the ones that have a repacked layout)."""
    llm = Llama(str(path), n_ctx=128, verbose=False)
    try:
        return sorted(t.name for t in llm.tensor_placements() if t.buffer_type == "CPU_REPACK")
    finally:
        llm.close()


def _run(path: Path, **kw: object) -> tuple[dict[str, str], np.ndarray, list[int]]:
    """(weight -> buffer type read back, last prompt logits, 6 greedy tokens)."""
    llm = Llama(str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False, **kw)
    try:
        where = {t.name: _layout(t.buffer_type) for t in llm.tensor_placements()}
        toks = llm.tokenize(PROMPT)
        llm.eval(toks)
        logits = np.array(llm.scores[len(toks) - 1], dtype=np.float64)
        out = []
        for _ in range(6):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(tok)
            llm.eval([tok])
        return where, logits, out
    finally:
        llm.close()


@pytest.fixture(scope="module")
def q4_0_model(synth_model) -> Path:
    return synth_model("tiny", "q4_0")


@pytest.fixture(scope="module")
def reference(q4_0_model: Path) -> tuple[dict[str, str], np.ndarray, list[int]]:
    return _run(q4_0_model)  # llama.cpp's default layouts


# the dual layout at a threshold above every batch runs only its repacked copy, at 1 only its
# plain copy, at 8 both (the 20-token prompt plain, decode repacked)
@pytest.mark.parametrize("layout,dual_max_batch", [(PLAIN, 0), (REPACK, 0), (DUAL, 1), (DUAL, 8), (DUAL, 10**6)],
                         ids=["plain", "repacked", "dual-plain-path", "dual-split-at-8", "dual-repacked-path"])
def test_layouts_compute_the_same_model(q4_0_model: Path, reference, layout: str, dual_max_batch: int) -> None:
    weights = _repacked(q4_0_model)
    assert weights, "the q4_0 tiny model has weights llama.cpp repacks"
    where, logits, tokens = _run(q4_0_model, layouts={w: layout for w in weights}, dual_max_batch=dual_max_batch)
    assert {where[w] for w in weights} == {layout}
    # with layouts named, llama.cpp's own repacking is off: nothing else is repacked
    assert Counter(where.values())[REPACK] == (len(weights) if layout == REPACK else 0)
    _, ref_logits, ref_tokens = reference
    nmse = float(np.sum((logits - ref_logits) ** 2) / np.sum(ref_logits**2))
    assert nmse < 1e-4, f"logits differ from llama.cpp's default layout: NMSE {nmse:.2e}"
    assert tokens == ref_tokens


def test_mixed_layouts_per_weight(q4_0_model: Path) -> None:
    weights = _repacked(q4_0_model)
    want = {w: (PLAIN, REPACK, DUAL)[i % 3] for i, w in enumerate(weights)}
    where, _, _ = _run(q4_0_model, layouts=want, dual_max_batch=4)
    assert {w: where[w] for w in weights} == want


def test_bad_layouts_are_refused(q4_0_model: Path) -> None:
    w = _repacked(q4_0_model)[0]
    raises_cleanly(PlacementError, "layout of .* is 'CPU_FAST'",
                   lambda: Llama(str(q4_0_model), layouts={w: "CPU_FAST"}, verbose=False))
    raises_cleanly(PlacementError, "does not have",
                   lambda: Llama(str(q4_0_model), layouts={"blk.99.ffn_up.weight": REPACK}, verbose=False))
    raises_cleanly(PlacementError, "need use_mmap=True",
                   lambda: Llama(str(q4_0_model), layouts={w: DUAL}, dual_max_batch=8, use_mmap=False, verbose=False))
    raises_cleanly(PlacementError, "dual_max_batch",
                   lambda: Llama(str(q4_0_model), layouts={w: DUAL}, verbose=False))


def test_host_budget_parsing() -> None:
    assert parse_host_budget("150%", 1000) == 1500
    assert parse_host_budget("2KiB", 1000) == 2048
    for bad in ("250%", "0%", "-1", "12 GB", ""):
        with pytest.raises(Exception, match="budget"):
            parse_host_budget(bad, 1000)


@pytest.fixture(scope="module")
def cpu_context(q4_0_model: Path):
    return build_context(q4_0_model, None, Workload(prompt=64, gen=16, n_ubatch=64), threads=2, progress=False)


def test_profile_times_both_layouts(cpu_context) -> None:
    prof = cpu_context.profile
    assert set(prof.layouts) == {PLAIN, REPACK}
    assert {v["buffer_type"] for v in prof.layouts[REPACK].values()} == {REPACK}
    assert {v["buffer_type"] for v in prof.layouts[PLAIN].values()} == {PLAIN}
    assert prof.layouts[PLAIN].keys() == prof.layouts[REPACK].keys()


def test_calibration_times_the_host_passes_in_both_layouts(cpu_context, q4_0_model: Path) -> None:
    """The calibration's host passes in a default load and with every repacked weight in plain
    memory (realpass.measure_layouts), each also timed node by node, and the plan's plain times
    from them: at every timed pass size the model costs the all-plain placement at the measured
    ratio of the two walls times its default cost (without them it costs it at the one-op profile's
    ratio), and each shape timed clear of the noise at its own measured ratio of node times (scaled
    with the others: the ratios between shapes are the measured ones)."""
    from oallama.planner.context import plain_ratios, plain_times, shape_ratios
    from oallama.planner.cost.schedmodel import HOST, Placement

    cal = cpu_context.profile.calibration
    m = cal.layouts
    assert m is not None and m["n_weights"] == len(_repacked(q4_0_model)) > 0
    assert "1" in m["sizes"] and all(v["default_us"] > 0 and v["plain_us"] > 0 for v in m["sizes"].values())
    assert len(m["rounds"]) == len(cpu_context.profile.calibration.rounds_outside)  # every round measured it
    sizes = sorted(int(n) for n in m["sizes"])
    ctx = build_context(q4_0_model, None, Workload(prompt=sizes[-1], gen=4, n_ubatch=sizes[-1]),
                        profile=cpu_context.profile, threads=2, progress=False)
    h_us = cal.devices[HOST].node_overhead_us
    for n in (1, sizes[-1]):
        pm = ctx.passes[Ubatch(n)]
        v = m["sizes"][str(n)]
        # every weight matmul shape the default load repacks, timed in both loads
        assert {pm.shape_key[i] for i in pm.repacked_by_default()} <= set(v["shapes"]), n
        assert all(s["default_us"] > 0 and s["plain_us"] > 0 and s["nodes"] > 0 for s in v["shapes"].values())
        times = plain_times(pm, cal)
        assert times is not None and all(pm.t_layout[i][PLAIN] == t for i, t in times.items())
        host = {w: 1 << 30 for w in pm.weights}
        plain = pm.cost(Placement(frozenset(), 0, host, {w: PLAIN for w in pm.weights})).total_us
        default = pm.cost(Placement(frozenset(), 0, host)).total_us
        assert plain / default == pytest.approx(v["plain_us"] / v["default_us"], rel=1e-6), n
        measured, model = shape_ratios(m, h_us, n), plain_ratios(pm)
        own = sorted(k for k in model if k in measured)
        # the tiny model's decode nodes take ~5 us (timing a node alone: ~2.4): only its prompt's stand clear
        assert own or n == 1, f"no shape of the {n}-token pass timed clear of the noise: {v['shapes']}"
        for k in own[1:]:
            assert model[k] / model[own[0]] == pytest.approx(measured[k] / measured[own[0]], rel=1e-6), (n, k)
    assert plain_times(ctx.passes[Ubatch(1)], None) is None


def test_layouts_alternate_in_one_dual_load(q4_0_model: Path) -> None:
    """Given the weights a default load repacks, both layouts are timed in one dual load, pass by pass
    ("paired": a ratio per pair); without them (or without the memory) in two loads. Both give every
    pass size's walls and every repacked shape's node times in each layout; paired, each pair's node
    times and their median."""
    from oallama.planner.cost.realpass import measure_layouts

    kw = dict(sizes=[1, 16], n_ctx=128, n_prefill=16, threads=2, mmap=True, reps=2)
    names = _repacked(q4_0_model)
    llm = Llama(str(q4_0_model), n_ctx=128, verbose=False)
    try:
        repacked = {t.name: t.nbytes for t in llm.tensor_placements() if t.name in names}
    finally:
        llm.close()
    paired = measure_layouts(q4_0_model, repacked=repacked, **kw)
    apart = measure_layouts(q4_0_model, **kw)
    assert paired is not None and apart is not None
    assert paired["paired"] and "paired" not in apart
    assert paired["n_weights"] == apart["n_weights"] == len(names)
    for m in (paired, apart):
        assert set(m["sizes"]) == {"1", "16"}
        for v in m["sizes"].values():
            assert v["default_us"] > 0 and v["plain_us"] > 0
            assert all(sh["default_us"] > 0 and sh["plain_us"] > 0 for sh in v["shapes"].values())
    for n, v in paired["sizes"].items():
        assert len(v["ratios"]) == 2 and v["shapes"].keys() == apart["sizes"][n]["shapes"].keys()
        for sh in v["shapes"].values():  # a pass node by node in every pair, the median kept
            for what in ("default", "plain"):
                assert len(sh[f"{what}_each_us"]) == 2
                assert sh[f"{what}_us"] == pytest.approx(statistics.median(sh[f"{what}_each_us"]))


def test_a_pass_past_the_timed_sizes_follows_the_profile(cpu_context, q4_0_model: Path) -> None:
    """Past the largest pass the layouts load timed, the plain times carry the measured corrections to
    the one-op profile, not the measured ratio: a profile whose plain layout is faster at those columns
    costs that pass's all-plain placement less, and leaves the largest timed pass as it was."""
    from oallama.planner.context import plain_times
    from oallama.planner.cost.schedmodel import Placement

    cal = cpu_context.profile.calibration
    top = max(int(n) for n in cal.layouts["sizes"])
    big = 2 * top
    faster = copy.deepcopy(cpu_context.profile)
    for key, v in faster.layouts[PLAIN].items():
        if int(key.rsplit(":", 1)[1]) > top:
            v["median_us"] *= 0.5

    def all_plain(n: int, profile) -> float:
        ctx = build_context(q4_0_model, None, Workload(prompt=n, gen=4, n_ubatch=n), profile=profile, threads=2,
                            progress=False)
        pm = ctx.passes[Ubatch(n)]
        times = plain_times(pm, cal, profile)
        assert times is not None
        pm.set_plain_times(times)
        return pm.cost(Placement(frozenset(), 0, {w: 1 << 30 for w in pm.weights}, dict.fromkeys(pm.weights,
                                                                                                 PLAIN))).total_us

    assert all_plain(top, faster) == pytest.approx(all_plain(top, cpu_context.profile), rel=1e-9)
    assert all_plain(big, faster) < 0.95 * all_plain(big, cpu_context.profile)


def _skewed(ctx, plain_faster_from: int):
    """A copy of `ctx` whose pass models' layout times are what a CPU like the EPYC's looks like:
    repacked twice as fast below `plain_faster_from` columns, plain twice as fast from there
    (deterministic). A copy: `ctx` is the module's, and its real times are what the other tests check."""
    ctx = copy.deepcopy(ctx)
    for pm in ctx.passes.values():
        for i, lays in pm.t_layout.items():
            b = pm.graph.nodes[i].ne[1]  # columns: time grows with them
            lays[PLAIN], lays[REPACK] = (2.0 * b, 1.0 * b) if b < plain_faster_from else (1.0 * b, 2.0 * b)
    return ctx


def test_cpu_only_plan_chooses_layouts_per_workload(cpu_context) -> None:
    cpu_context = _skewed(cpu_context, 8)
    plan = make_plan(cpu_context, "optimal", None)
    lays = plan.placement.layouts
    costs = layoutmod.weight_costs(cpu_context, plan.placement)
    assert lays and set(lays) == set(costs)
    for w, c in costs.items():
        assert lays[w] == c.single()
    # prompt 64 in one pass, 15 decode passes: the logits matmul (1 column in every pass) repacked,
    # the matmuls that also run at 64 columns plain (64 + 15 * 2 < 128 + 15 * 1)
    assert lays.get("output.weight", REPACK) == REPACK
    assert PLAIN in lays.values()
    doc = plan.to_json()
    assert doc["devices"] == ["CPU"] and doc["layouts"] == lays and doc["dual_max_batch"] == 0
    # with room for both layouts every weight that runs both ways keeps both, split between the batches
    dual = make_plan(cpu_context, "optimal", None, host_budget="200%")
    assert DUAL in dual.placement.layouts.values()
    assert 1 < dual.placement.dual_max_batch <= 64
    assert dual.predicted["e2e_ms"] < plan.predicted["e2e_ms"]
    assert dual.extra["layout_choice"]["dual_extra_bytes"] <= dual.host_budget - sum(cpu_context.weight_bytes.values())
    with pytest.raises(PlanError, match="host-budget"):
        make_plan(cpu_context, "optimal", None, host_budget="1KiB")
    with pytest.raises(PlanError, match="needs an accelerator"):
        make_plan(cpu_context, "flexgen", None)


def test_cpu_only_plan_cli_loads_as_planned(q4_0_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "oallama", "plan", str(q4_0_model), "--prompt", "64", "--gen", "8",
                        "--ubatch", "64", "--threads", "2", "--host-budget", "200%", "--emit-ot", "-o", str(out),
                        "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "CPU only" in r.stdout and "all plain" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["devices"] == ["CPU"]
    llm = Llama(str(q4_0_model), placement=str(out), n_ctx=128, verbose=False)
    try:
        where = {t.name: _layout(t.buffer_type) for t in llm.tensor_placements()}
    finally:
        llm.close()
    if doc["layouts"]:
        assert {w: where[w] for w in doc["layouts"]} == doc["layouts"]
    else:  # the plan kept llama.cpp's layouts (repacked is faster at every batch here): it names none
        assert {w: where[w] for w in _repacked(q4_0_model)} == dict.fromkeys(_repacked(q4_0_model), REPACK)



def test_a_plan_that_keeps_the_default_layouts_names_none(cpu_context, q4_0_model: Path) -> None:
    """Layouts equal to a default load's are dropped (the load then repacks as llama.cpp does, and
    the plan loads as a baseline's: the bench compares them as one placement); one other layout
    keeps them all named, since a load with layouts turns llama.cpp's repacking off."""
    base = make_plan(cpu_context, "layers", None).placement
    costs = layoutmod.weight_costs(cpu_context, base)
    assert costs and {c.default for c in costs.values()} == {REPACK}
    named = base.with_layouts({w: c.default for w, c in costs.items()})
    kept = unnamed_defaults(cpu_context, named)
    assert kept.layouts == {} and kept.dual_max_batch == 0
    assert cpu_context.predict(kept)["e2e_ms"] == pytest.approx(cpu_context.predict(named)["e2e_ms"], rel=1e-9)
    one_plain = named.with_layouts({**named.layouts, next(iter(costs)): PLAIN})
    assert unnamed_defaults(cpu_context, one_plain).layouts == one_plain.layouts
    dual = named.with_layouts(named.layouts, 8)
    assert unnamed_defaults(cpu_context, dual).layouts == dual.layouts  # a threshold of its own: named

# --- a mixture of experts: its expert tensors (MUL_MAT_ID) have the layouts too ------------------


@pytest.fixture(scope="module")
def moe_q4_0(synth_model) -> Path:
    return synth_model("qwen3moe-small", "q4_0", n_layer=2)


@pytest.fixture(scope="module")
def moe_reference(moe_q4_0: Path) -> tuple[dict[str, str], np.ndarray, list[int]]:
    return _run(moe_q4_0)


@pytest.mark.parametrize("layout,dual_max_batch", [(PLAIN, 0), (REPACK, 0), (DUAL, 8)],
                         ids=["plain", "repacked", "dual-split-at-8"])
def test_expert_layouts_compute_the_same_model(moe_q4_0: Path, moe_reference, layout: str,
                                               dual_max_batch: int) -> None:
    experts = [w for w in _repacked(moe_q4_0) if "_exps." in w]
    assert experts, "llama.cpp repacks the q4_0 expert tensors"
    where, logits, tokens = _run(moe_q4_0, layouts={w: layout for w in experts}, dual_max_batch=dual_max_batch)
    assert {where[w] for w in experts} == {layout}
    _, ref_logits, ref_tokens = moe_reference
    nmse = float(np.sum((logits - ref_logits) ** 2) / np.sum(ref_logits**2))
    assert nmse < 1e-4, f"logits differ from llama.cpp's default layout: NMSE {nmse:.2e}"
    assert tokens == ref_tokens


def test_expert_matmuls_are_timed_and_chosen_in_both_layouts(moe_q4_0: Path, tmp_path: Path) -> None:
    ctx = build_context(moe_q4_0, None, Workload(prompt=64, gen=16, n_ubatch=64), threads=2, progress=False)
    prof = ctx.profile
    for lay in (PLAIN, REPACK):
        ids = {k: v for k, v in prof.layouts[lay].items() if k.startswith("MUL_MAT_ID:")}
        assert ids and {v["buffer_type"] for v in ids.values()} == {lay}
        assert any("few_median_us" in v for v in ids.values())  # the routed interpolation in each layout
    experts = {ctx.passes[n].graph.nodes[i].weight for n in ctx.passes for i in ctx.passes[n].t_layout
               if ctx.passes[n].graph.nodes[i].op == "MUL_MAT_ID"}
    assert experts and all("_exps." in w for w in experts)
    costs = layoutmod.weight_costs(ctx, make_plan(ctx, "optimal", None).placement)
    assert experts <= set(costs) and not any(costs[w].fixed for w in experts)
    # the choice follows the times: made plain-faster at every batch, the experts go plain
    for pm in ctx.passes.values():
        for i, lays in pm.t_layout.items():
            if pm.graph.nodes[i].op == "MUL_MAT_ID":
                lays[PLAIN], lays[REPACK] = 1.0, 2.0
    plan = make_plan(ctx, "optimal", None)
    assert {plan.placement.layouts[w] for w in experts} == {PLAIN}
    # and the plan loads so: read back per expert tensor
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    llm = Llama(str(moe_q4_0), placement=str(path), n_ctx=128, verbose=False)
    try:
        where = {t.name: _layout(t.buffer_type) for t in llm.tensor_placements()}
    finally:
        llm.close()
    assert {w: where[w] for w in plan.placement.layouts} == plan.placement.layouts


def test_confirmation_measures_llama_cpps_no_repack(cpu_context) -> None:
    """On the CPU alone, llama.cpp's --no-repack (its default load with every weight plain) is one of
    its own placements in the confirmation: measured as a baseline beside the default load, and kept,
    its stock command saying --no-repack, when nothing measured faster than it."""
    from oallama.planner import confirm as C
    from oallama.planner.cost.schedmodel import Placement
    from oallama.planner.plan import NO_REPACK_LABEL, confirmed
    from oallama.runtime.planfile import ConfirmOptions

    kept, _, conf = confirmed(cpu_context, None, ConfirmOptions(confirm_time=120, confirm_rounds=3, confirm_steps=2))
    assert conf is not None
    plain = next(c for c in conf.candidates if NO_REPACK_LABEL in c.labels)
    default = next(c for c in conf.candidates if "layers" in c.labels)
    assert plain.baseline and default.baseline and plain is not default
    assert any(r is not None for r in plain.runs)  # measured, not only predicted
    both = set(layoutmod.weight_costs(cpu_context, Placement()))
    assert both and plain.plan.placement.layouts == dict.fromkeys(both, PLAIN)
    assert plain.plan.stock_layouts() == ["--no-repack"]
    assert kept.strategy == "optimal"

    def runs(ms: float) -> list[dict[str, float] | None]:
        return [{"objective_ms": ms}] * C.MIN_ROUNDS

    others = [dataclasses.replace(c, runs=runs(100.0)) for c in conf.candidates if c is not plain]
    chosen, _, _ = C.decide([*others, dataclasses.replace(plain, runs=runs(60.0))])
    assert chosen.labels == plain.labels
    assert "--no-repack" in chosen.plan.emit_args()
