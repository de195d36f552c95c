"""An accelerator's weight matmuls timed at the pass sizes a workload runs (issue 13).

The one-op profile times every weight matmul at a fixed set of column counts (`profile.DEFAULT_TOKENS`:
1, 32, 64, ..., 512) and interpolates linearly between them. A GPU-class backend's kernels cover the
columns in tiles: Mesa's software GPU ran a tiny f16 model's matmuls as long at 40 and 48 columns as
at 64 (75 ms in a 40-token prompt pass, 48 ms at 32; the line between 32 and 64 said 45), and every
40-token prompt that ran there took 1.39x its prediction. So before a plan is costed, each of the
accelerator's matmuls is also timed at every pass size of the workload the profile lacks, once: the
entries join the profile (and its cache file) as if it had been measured at those sizes. The host's
CPU kernels run the columns in small blocks and stay interpolated.

    n = opsizes.time_missing(profile, [graph_40, graph_1], "Vulkan0", progress=True)
    # n op shapes timed; profile.op_time_us("Vulkan0", op) now reads the 40-column entries
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable

from ...errors import ProfileError
from ..graph import Graph, target_ops
from .measure import time_op
from .profile import UNSUPPORTED, Profile, cache_dir, is_unsupported, op_stats

Signature = tuple[str, str, tuple[int, ...]]  # (op, weight type, weight shape)


def missing(profile: Profile, graphs: Iterable[Graph], device: str) -> dict[Signature, tuple[list[int], int]]:
    """The weight matmul signatures of `graphs` that `device`'s measurements lack at some column
    count the graphs run them at: signature -> (those column counts, experts used per token; 0 for
    a MUL_MAT)."""
    table = profile.ops.get(device, {})
    out: dict[Signature, tuple[set[int], int]] = {}
    for g in graphs:
        for op in target_ops(g):
            if Profile.op_key(op.op, op.weight_type, op.weight_shape, op.n_tokens) in table \
                    or not profile.supports(device, op):
                continue
            cols, _ = out.setdefault((op.op, op.weight_type, op.weight_shape), (set(), op.n_expert_used))
            cols.add(op.n_tokens)
    return {sig: (sorted(cols), used) for sig, (cols, used) in sorted(out.items())}


def time_missing(profile: Profile, graphs: Iterable[Graph], device: str, *, warmup: int = 2, repeats: int = 5,
                 progress: bool = False, cache: bool = True) -> int:
    """Time on `device` what `missing` lists and add it to `profile.ops[device]`; with `cache`, also
    to the profile's cache file where there is one. Returns the number of op shapes timed."""
    todo = missing(profile, list(graphs), device)
    if not todo:
        return 0
    table = profile.ops.setdefault(device, {})
    for i, ((op, wtype, shape), (cols, used)) in enumerate(todo.items(), 1):
        if progress:
            print(f"\rprofile: {i}/{len(todo)} op shapes at the workload's pass sizes ({device}: {op} {wtype} "
                  f"{'x'.join(map(str, shape))} at {','.join(map(str, cols))} cols)".ljust(100), end="",
                  file=sys.stderr, flush=True)
        if op == "MUL_MAT_ID" and used <= 0:
            raise ProfileError(f"{op} {wtype} {shape}: no experts per token in the graph")
        try:
            res, extra = time_op(device, op, wtype, shape, cols, used or None, 1, warmup, repeats,
                                 profile.settings.repack, "")
        except RuntimeError as e:
            if not is_unsupported(e):
                raise ProfileError(f"timing {op} {wtype} {shape} at {cols} cols on {device}: {e}") from None
            # refused at these sizes: marked, as `measure.measure` marks it
            table.update({Profile.op_key(op, wtype, shape, n): {UNSUPPORTED: True} for n in cols})
            continue
        for n, r, x in zip(cols, res, extra, strict=True):
            table[Profile.op_key(op, wtype, shape, n)] = {**op_stats(r.samples_us), "buffer_type": r.buffer_type, **x}
    if progress:
        print(file=sys.stderr)
    cached = cache_dir() / f"{profile.key}.json"
    if cache and cached.exists():
        # under the cached file's device names (this one may have renamed an rpc-server's port); an
        # unreadable cache file is measured again on its next use
        with contextlib.suppress(ProfileError, ValueError, KeyError):
            profile.renamed(list(Profile.load(cached).devices)).save(cached)
    return len(todo)
