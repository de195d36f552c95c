"""Run a script with context.plain_times scaling the walls' ratio over the pass without its
attention (KQ/KQV activation matmuls, softmax, flash attention): the layout changes only the weight
matmuls, and the attention grows with the KV length the calibration did not have."""
import runpy
import sys

from oallama.planner import context as C
from oallama.planner.cost.calfit import interpolated
from oallama.planner.cost.schedmodel import HOST, Placement

ATTN = ("SOFT_MAX", "FLASH_ATTN_EXT", "MUL_MAT")


def plain_times(pm, cal):
    measured = cal.layouts if cal is not None else None
    sizes = {int(n): v["plain_us"] / v["default_us"] for n, v in ((measured or {}).get("sizes") or {}).items()
             if v.get("default_us", 0) > 0 and v.get("plain_us", 0) > 0}
    scaled = pm.repacked_by_default()
    if not sizes or not scaled:
        return None
    ratio = interpolated(sizes, pm.n_tokens)
    h_us = cal.devices[HOST].node_overhead_us if cal is not None and HOST in cal.devices else 0.0
    shapes = C.shape_ratios(measured or {}, h_us, pm.n_tokens)
    host = Placement(frozenset(), 0, {w: 1 << 30 for w in pm.weights})
    default = pm.cost(host).total_us
    attn = sum(pm.t_host.get(i, 0.0) for i in pm.order if i not in pm.targets and pm.graph.nodes[i].op in ATTN)
    base = default - attn
    repacked = sum(pm.t_host[i] for i in scaled)
    plain = {i: (pm.t_host[i] * shapes[pm.shape_key[i]] if pm.shape_key.get(i) in shapes else pm.plain_profiled[i])
             for i in scaled}
    total = sum(plain.values())
    f = (ratio * base - base + repacked) / total if total > 0 else 0.0
    return {i: t * f for i, t in plain.items()} if f > 0 else None


if __name__ == "__main__":
    C.plain_times = plain_times
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
