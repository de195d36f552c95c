"""Which stored calibrations (every committed results set) SYNC_BOUND and context_bounded act on, run
at df1f95c, before they were removed: a profile whose splits context_bounded changes, and per device
the pass sizes whose weight matmuls the fit kept at their one-op time (`mm_anchors`).

    python census.py > census.txt        # from the repository root, df1f95c's python/
"""
import json
from pathlib import Path

from oallama.planner.cost import calfit
from oallama.planner.cost.profile import Profile
from oallama.planner.cost.rounds import context_bounded

n = 0
for pf in sorted(Path("bench/results").glob("**/profiles/*.json")):
    try:
        prof = Profile.from_json(json.loads(pf.read_text()), pf)
    except Exception:  # not a profile of this schema
        continue
    cal = prof.calibration
    if cal is None or not cal.splits:
        continue
    n += 1
    bounded = context_bounded(cal.splits) != list(cal.splits)
    mm = {d: sorted(dc.mm_anchors) for d, dc in calfit.refitted(cal, prof).devices.items() if dc.mm_anchors}
    if bounded or mm:
        print(pf, "context_bounded" if bounded else "", mm)
print(n, "calibrated profiles")
