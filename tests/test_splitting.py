"""Weaver's operator-splitting planner, on cases computed by hand.

W_i = max(T_i - (K - N), 0)^2 / (2 T_i), E[W] = sum T_i W_i / sum T_i.
"""

from __future__ import annotations

import itertools

import pytest

from oallama.weaver.splitting import (
    PARAMETRIC,
    SEQUENCE,
    ReceiverOp,
    expected_wait,
    op_wait,
    ops_from_target_ops,
    plan_splits,
    slack,
)


def test_op_wait_by_hand() -> None:
    assert op_wait(8.0, 2.0) == pytest.approx(36 / 16)  # (8-2)^2 / (2*8) = 2.25
    assert op_wait(4.0, 2.0) == pytest.approx(0.5)      # (4-2)^2 / 8
    assert op_wait(2.0, 2.0) == 0.0                      # fits in the slack exactly
    assert op_wait(1.0, 2.0) == 0.0
    assert op_wait(6.0, 0.0) == pytest.approx(3.0)      # no slack: mean residual T/2
    assert op_wait(0.0, 1.0) == 0.0


def test_expected_wait_is_time_weighted() -> None:
    # (8 * 2.25 + 2 * 0) / 10 = 1.8
    assert expected_wait([8.0, 2.0], 2.0) == pytest.approx(1.8)
    # slack 0: sum T^2/2 / sum T = (16/2 + 4/2) / 6 = 10/6
    assert expected_wait([4.0, 2.0], 0.0) == pytest.approx(10 / 6)
    assert expected_wait([], 1.0) == 0.0


def test_slack_floors_at_zero() -> None:
    assert slack(3.0, 1.0) == 2.0
    assert slack(1.0, 3.0) == 0.0


def test_one_split_reaches_the_default_threshold() -> None:
    # K - N = 2, threshold 5% of 10 = 0.5. Before: 1.8. Split A (8) -> 4 + 4:
    # E = (4*0.5 + 4*0.5 + 2*0) / 10 = 0.4 < 0.5: stop after one split.
    ops = [ReceiverOp.parametric("A", 8.0, 4096), ReceiverOp.sequence("B", 2.0, 1)]
    plan = plan_splits(ops, sender_attention_time=3.0, offloaded_time=1.0, iteration_time=10.0)
    assert plan.threshold == pytest.approx(0.5)
    assert plan.wait_before == pytest.approx(1.8)
    assert plan.wait_after == pytest.approx(0.4)
    assert plan.splits == 1 and plan.reason == "below threshold" and plan.converged
    a0, a1, b = plan.pieces
    assert (a0.name, a0.start, a0.stop, a0.time) == ("A", 0, 2048, 4.0)
    assert (a1.name, a1.start, a1.stop, a1.time) == ("A", 2048, 4096, 4.0)
    assert a0.axis == "output" and b.axis == "sequence" and (b.name, b.time, b.index) == ("B", 2.0, 1)
    assert plan.parts == {"A": 2, "B": 1}


def test_splitting_until_every_piece_fits_the_slack() -> None:
    # threshold 0.1: after A -> 4,4 (E = 0.4) split 4 -> 2,2 (W = 0): E = 4*0.5/10 = 0.2,
    # then the other 4: E = 0 < 0.1. Three splits, A in four quarters of 1024 rows, 2 each.
    ops = [ReceiverOp.parametric("A", 8.0, 4096), ReceiverOp.sequence("B", 2.0, 1)]
    plan = plan_splits(ops, sender_attention_time=3.0, offloaded_time=1.0, threshold=0.1)
    assert plan.splits == 3 and plan.wait_after == 0.0
    quarters = plan.pieces_of("A")
    assert [(p.start, p.stop, p.time) for p in quarters] == [(0, 1024, 2.0), (1024, 2048, 2.0),
                                                             (2048, 3072, 2.0), (3072, 4096, 2.0)]
    assert sum(p.time for p in plan.pieces) == pytest.approx(10.0)  # splitting keeps total time


def test_no_slack_halves_the_longest_first() -> None:
    # N > K: slack 0, W = T/2. ops 4, 4: E = (4*2 + 4*2)/8 = 2. threshold 1.5.
    # split one 4 -> 2,2: sum T W = 2*1 + 2*1 + 4*2 = 12, E = 1.5 (not < 1.5)
    # split the other: 4 * (2*1) = 8, E = 1.0 < 1.5.
    ops = [ReceiverOp.sequence("x", 4.0, 8), ReceiverOp.sequence("y", 4.0, 8)]
    plan = plan_splits(ops, sender_attention_time=1.0, offloaded_time=2.0, threshold=1.5)
    assert plan.slack == 0.0 and plan.unavoidable == pytest.approx(1.0)
    assert plan.wait_before == pytest.approx(2.0) and plan.wait_after == pytest.approx(1.0)
    assert plan.splits == 2 and plan.parts == {"x": 2, "y": 2}
    assert all(p.kind == SEQUENCE and p.size == 4 for p in plan.pieces)


def test_within_slack_needs_no_split() -> None:
    ops = [ReceiverOp.parametric("A", 1.0, 64), ReceiverOp.parametric("B", 1.5, 64)]
    plan = plan_splits(ops, sender_attention_time=5.0, offloaded_time=1.0, iteration_time=1.0)
    assert plan.splits == 0 and plan.wait_before == 0.0 and plan.reason == "below threshold"
    plan = plan_splits(ops, sender_attention_time=5.0, offloaded_time=1.0, threshold=0.0)
    assert plan.splits == 0 and plan.reason == "within slack"


def test_unsplittable_longest_op_is_skipped() -> None:
    # U (extent 1) cannot be split: the planner halves the next longest instead, then gives up.
    # slack 1: U = 6: W = 25/12; S = 4 (extent 2): W = 9/8 -> halves of 2: W = 1/4 each.
    ops = [ReceiverOp.sequence("U", 6.0, 1), ReceiverOp.sequence("S", 4.0, 2)]
    plan = plan_splits(ops, sender_attention_time=2.0, offloaded_time=1.0, threshold=0.01)
    assert plan.wait_before == pytest.approx((6 * 25 / 12 + 4 * 9 / 8) / 10)
    assert plan.wait_after == pytest.approx((6 * 25 / 12 + 2 * (2 * 0.25)) / 10)
    assert plan.splits == 1 and plan.reason == "unsplittable" and not plan.converged


def test_odd_extent_splits_proportionally() -> None:
    a, b = ReceiverOp.parametric("A", 9.0, 3).halves()
    assert (a.start, a.size, a.time) == (0, 2, 6.0)
    assert (b.start, b.size, b.time) == (2, 1, 3.0)
    with pytest.raises(ValueError):
        b.halves()


def test_max_splits_bounds_the_work() -> None:
    ops = [ReceiverOp.parametric("A", 1000.0, 1 << 20)]
    plan = plan_splits(ops, sender_attention_time=0.0, offloaded_time=0.0, threshold=1e-9, max_splits=5)
    assert plan.splits == 5 and plan.reason == "max splits" and len(plan.pieces) == 6


def test_pieces_keep_execution_order_and_cover_each_op() -> None:
    ops = [ReceiverOp.parametric(f"w{i}", t, 512) for i, t in enumerate([3.0, 9.0, 1.0, 7.0])]
    plan = plan_splits(ops, sender_attention_time=1.5, offloaded_time=0.5, threshold=0.05)
    assert [p.index for p in plan.pieces] == sorted(p.index for p in plan.pieces)
    for i, op in enumerate(ops):
        pieces = [p for p in plan.pieces if p.index == i]
        assert pieces[0].start == 0 and pieces[-1].stop == op.size
        assert all(x.stop == y.start for x, y in itertools.pairwise(pieces))
        assert sum(p.time for p in pieces) == pytest.approx(op.time)
    assert plan.wait_after < 0.05
    doc = plan.to_json()
    assert doc["splits"] == plan.splits and len(doc["pieces"]) == len(plan.pieces)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        ReceiverOp("x", -1.0)
    with pytest.raises(ValueError):
        ReceiverOp("x", 1.0, kind="conv")
    with pytest.raises(ValueError):
        plan_splits([ReceiverOp("x", 1.0)], sender_attention_time=1.0, offloaded_time=0.0)


def test_ops_from_target_ops() -> None:
    class Op:
        def __init__(self, node: str, shape: tuple[int, ...]) -> None:
            self.node, self.weight_shape = node, shape

    ops = ops_from_target_ops([Op("attn_q-0", (4096, 4096)), Op("ffn_up-0", (4096, 14336))], [10.0, 30.0])
    assert [(o.name, o.kind, o.size, o.index) for o in ops] == [("attn_q-0", PARAMETRIC, 4096, 0),
                                                                ("ffn_up-0", PARAMETRIC, 14336, 1)]
