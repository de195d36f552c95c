"""The sliced calibrations with their spans taken out: the same rounds refitted without them, saved under the
same cache keys in a copy of the cache, so that `heldout.py --repredict` with that cache gives predictions that
differ from the sliced set's only by the spans (not by a second calibration's drift).

    python without_spans.py SRC_CACHE DST_CACHE
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from oallama.planner.cost import calfit
from oallama.planner.cost.profile import Profile

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
for f in sorted((dst / "profiles").glob("*.json")):
    prof = Profile.load(f)
    cal = prof.calibration
    if cal is None or not cal.spans:
        continue
    bare = calfit.fit(cal.points, [], prof, cal.splits, cal.routing, [])
    prof.calibration = replace(cal, devices=bare.devices, spans=[])
    prof.save(f)
    print(f"{f.name[:16]}: {len(cal.spans)} spans taken out")
