"""A model's one-op profile on the CPU alone (1 thread), each weight signature's and each timed load's
wall time: `python signatures.py MODEL.gguf` (output at 122c440, the 30B-A3B shape: signatures.txt)."""

from __future__ import annotations

import sys
import time
from typing import Any

from oallama.planner.cost import measure
from oallama.planner.cost.profile import DEFAULT_TOKENS, default_settings
from oallama.planner.graph import inventory

t = time.perf_counter()
inv = inventory(sys.argv[1], sorted(set(DEFAULT_TOKENS)), n_ctx=1024)
print("inventory", round(time.perf_counter() - t, 2))
time_signature, time_op = measure._time_signature, measure.time_op


def timed_signature(d: Any, sig: Any, cols: Any, *args: Any, **kw: Any) -> None:
    t = time.perf_counter()
    time_signature(d, sig, cols, *args, **kw)
    print(f"{time.perf_counter() - t:6.2f}s", d.name, sig, cols, flush=True)


def timed_op(*args: Any) -> Any:  # one load of the weight, timed at every column count
    t = time.perf_counter()
    r = time_op(*args)
    layout = args[11] if len(args) > 11 else ""
    print(f"   time_op {time.perf_counter() - t:6.2f}s layout={layout!r} ->", r[0][0].buffer_type)
    return r


measure._time_signature, measure.time_op = timed_signature, timed_op
t = time.perf_counter()
measure.measure(inv, ["CPU"], default_settings(1), progress=False)
print("measure", round(time.perf_counter() - t, 2))
