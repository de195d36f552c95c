"""The host's attention past the calibrated cells (planner/cost/attncurve.py): the segments' ratios
from spans made of known terms, how a span line applies them, and the curve measured once per device
and settings on the real reference model."""

from __future__ import annotations

import json

import pytest

from oallama.planner.cost import attncurve, attnspan
from oallama.planner.cost.calfit import Calibration, DeviceCalibration, OpFit, long_multiplier
from oallama.runtime.kvcache import llama_kwargs

A_US, B_US = 40.0, 2e-3  # the span line's true intercept (us) and slope (us per unit of work)
WORK_PER_CELL = 1e5  # a span's work per attended cell


def _spans_made_of(pasts: list[int], segment_ratios: list[float]) -> tuple[list[float], list[float], list[float]]:
    """(cells, us, work) of passes after `pasts` (0 first) whose growth costs B_US per unit of work up
    to pasts[1] and B_US x each ratio between the pasts after it."""
    cells = [p + 64.5 for p in pasts]
    work = [c * WORK_PER_CELL for c in cells]
    us = [A_US + B_US * work[0], A_US + B_US * work[1]]
    for k, r in enumerate(segment_ratios, start=1):
        us.append(us[-1] + B_US * r * (work[k + 1] - work[k]))
    return cells, us, work


@pytest.mark.parametrize("segment_ratios", [[1.0, 1.0, 1.0], [1.3, 1.7, 1.7], [0.8, 2.5, 1.1]],
                         ids=lambda r: "x" + "-".join(f"{v:g}" for v in r))
def test_the_segments_recover_the_ratios_spans_were_made_of_and_a_line_gives_the_spans_back(
        segment_ratios: list[float]) -> None:
    pasts = [0, 1024, 2048, 4096, 8192]
    cells, us, work = _spans_made_of(pasts, segment_ratios)
    segs = attncurve.ratios(pasts, cells, us, work)
    assert [s[:2] for s in segs] == [[cells[k], cells[k + 1]] for k in range(1, 4)]
    assert [s[2] for s in segs] == pytest.approx(segment_ratios, rel=1e-9)
    dc = DeviceCalibration(0.0, {"FLASH_ATTN_EXT": OpFit(A_US, B_US, 2)}, 1.0, whole=["FLASH_ATTN_EXT"],
                           long_prompt=segs)
    for c, t, w in zip(cells, us, work, strict=True):  # the line through the two calibrated spans, the curve past them
        assert dc.node_time_us("FLASH_ATTN_EXT", w, 128, c) == pytest.approx(t, rel=1e-9), c
    # past the last measured cells the last segment's ratio runs on
    c = 16384 + 64.5
    assert dc.node_time_us("FLASH_ATTN_EXT", c * WORK_PER_CELL, 128, c) == pytest.approx(
        us[-1] + B_US * segment_ratios[-1] * (c - cells[-1]) * WORK_PER_CELL, rel=1e-9)


def test_the_curve_applies_to_prompt_span_lines_past_the_long_span_only() -> None:
    segs = [[1088.5, 2112.5, 2.0]]
    fits = {k: OpFit(10.0, 1e-3, 2) for k in ("FLASH_ATTN_EXT", "FLASH_ATTN_EXT:1", "SOFT_MAX")}
    dc = DeviceCalibration(0.0, fits, 1.0, whole=["FLASH_ATTN_EXT", "FLASH_ATTN_EXT:1"], long_prompt=segs)
    plain = DeviceCalibration(0.0, fits, 1.0, whole=["FLASH_ATTN_EXT", "FLASH_ATTN_EXT:1"])
    w = 4e6
    assert dc.node_time_us("FLASH_ATTN_EXT", w, 128, 1000.0) == plain.node_time_us("FLASH_ATTN_EXT", w, 128, 1000.0)
    assert dc.node_time_us("FLASH_ATTN_EXT", w, 128, 2112.5) == pytest.approx(
        10.0 + 1e-3 * w * long_multiplier(segs, 2112.5))
    assert long_multiplier(segs, 2112.5) == pytest.approx((1088.5 + 2.0 * 1024) / 2112.5)
    assert dc.node_time_us("FLASH_ATTN_EXT", w, 128, 2112.5) > plain.node_time_us("FLASH_ATTN_EXT", w, 128, 2112.5)
    # a decode pass's attention and a line not fitted to spans keep their own
    assert dc.node_time_us("FLASH_ATTN_EXT", w, 1, 4096.0) == plain.node_time_us("FLASH_ATTN_EXT", w, 1, 4096.0)
    assert dc.node_time_us("SOFT_MAX", w, 128, 4096.0) == plain.node_time_us("SOFT_MAX", w, 128, 4096.0)
    back = Calibration.from_json(json.loads(json.dumps(Calibration({"CPU": dc}, 0.0, 0.0).to_json())))
    assert back.devices["CPU"].long_prompt == segs


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa-on", "fa-off"])
def test_the_curve_is_measured_once_per_device_and_settings(flash_attn: bool, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The reference's prompt spans really timed at each past (the cache grows the attention's time),
    the segments cached: asked again, nothing is measured."""
    attention = llama_kwargs(flash_attn, "f16", "f16")
    segs = attncurve.curve(threads=1, attention=attention, progress=False)
    assert [s[0] for s in segs] == [p + (attnspan.PROMPT_TOKENS + 1) / 2 for p in attncurve.PASTS[:-1]]
    rec = json.loads(attncurve.cache_path(1, attention).read_text())
    assert rec["pasts"] == [0, *attncurve.PASTS] and rec["segments"] == segs
    assert rec["us"][-1] > 4 * rec["us"][0]  # 8192 cells' attention against none's

    def measured(*a: object, **k: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(attncurve, "measure", measured)
    assert attncurve.curve(threads=1, attention=attention, progress=False) == segs
    assert attncurve.cache_path(1, llama_kwargs(not flash_attn, "f16", "f16")) != attncurve.cache_path(1, attention)
    assert attncurve.cache_path(2, attention) != attncurve.cache_path(1, attention)
