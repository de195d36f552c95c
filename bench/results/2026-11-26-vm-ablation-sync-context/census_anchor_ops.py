"""Whether ANCHOR_OPS leaves any pass size unanchored in a held-out set's stored calibration.

    python census_anchor_ops.py > census_anchor_ops.txt     # from the repository root
"""
import json
from pathlib import Path

from oallama.planner.cost import calfit
from oallama.planner.cost.profile import Profile

for pf in sorted(p for p in Path("bench/results").glob("**/profiles/*.json") if "heldout" in str(p)):
    try:
        prof = Profile.from_json(json.loads(pf.read_text()), pf)
    except Exception:  # not a profile of this schema
        continue
    cal = prof.calibration
    if cal is None or not cal.splits:
        continue
    fits = {}
    for bound in (0.5, 0.0):
        calfit.ANCHOR_OPS = bound
        fits[bound] = calfit.refitted(cal, prof).devices
    left = {d: sorted(set(fits[0.0][d].anchors) - set(dc.anchors)) for d, dc in fits[0.5].items()
            if set(dc.anchors) != set(fits[0.0][d].anchors)}
    print(pf, f"ANCHOR_OPS acts: pass sizes left unanchored {left}" if left else "-")
