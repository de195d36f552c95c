"""Measuring a profile (profile.py): every weight matmul of a model's graphs timed alone on each
device (csrc/profile.cpp), the host<->device copies, and the calibration in the real graph when
asked; `profile_model` reuses a cached profile of the same key, and `oallama profile` runs it."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import _core
from ...errors import ProfileError
from ...options import add_arguments, from_args, option
from ...runtime import devices as devmod
from ..graph import Inventory, inventory
from . import hostspeed
from .calibrate import calibrate, with_decode_tail
from .profile import (
    DEFAULT_TOKENS,
    HOST_LAYOUTS,
    PLAIN,
    REPACK,
    UNSUPPORTED,
    KnownTimes,
    Link,
    Profile,
    Settings,
    build_info,
    cache_dir,
    default_settings,
    is_unsupported,
    op_stats,
    profile_key,
    shapes_hash,
    signatures,
)
from .routing import fingerprint as routing_fingerprint
from .routing import measure as measure_routing


def _activation_sizes(inv: Inventory) -> list[int]:
    sizes = {op.act_in_bytes for n in inv.graphs for op in inv.target_ops(n)}
    sizes |= {op.act_out_bytes for n in inv.graphs for op in inv.target_ops(n)}
    return sorted(sizes)


def _spread(sizes: list[int], k: int = 6) -> list[int]:
    """k sizes spanning the activation sizes, plus 4 MiB so bandwidth is well determined."""
    pts = {sizes[round(i * (len(sizes) - 1) / max(k - 1, 1))] for i in range(k)} if sizes else set()
    return sorted(pts | {4 << 20})


LONG_US = 50_000.0  # a column count whose first run takes this long (us) is timed 1 warm-up + 3 runs (csrc/profile.cpp)


def time_op(device: str, op: str, wtype: str, shape: tuple[int, ...], cols: list[int], n_used: int | None,
            threads: int, warmup: int, repeats: int, repack: bool, host_of: str,
            layout: str = "", few: bool = True) -> tuple[list[Any], list[dict[str, Any]]]:
    """One weight matmul signature at each column count: (results, extra stats per column).
    MUL_MAT_ID (experts [k, m, n_expert], n_used per token): each of n tokens routed so that
    min(n_expert, n * n_used) distinct experts are active (every expert's weights are read once a
    batch is large enough, as with real routing), and, when `few`, also with every token on the
    same n_used experts (`few_median_us`): a real routing's time lies between (`op_time_us`'s
    active). A model without a measured routing (a shape-only file) never uses those."""
    if op == "MUL_MAT":
        res = _core.profile_mul_mat(device, wtype, shape[0], shape[1], cols, threads, warmup, repeats, repack, host_of,
                                    layout, LONG_US)
        return res, [{} for _ in cols]
    assert n_used is not None
    active = [min(shape[2], n * n_used) for n in cols]
    res = _core.profile_mul_mat_id(device, wtype, shape[0], shape[1], shape[2], n_used, cols, active, threads, warmup,
                                   repeats, repack, host_of, layout, LONG_US)
    extra: list[dict[str, Any]] = [{"n_expert_used": n_used, "n_active": a} for a in active]
    if few:
        t_few = _time_few(device, wtype, shape, cols, n_used, threads, warmup, repeats, repack, host_of, layout)
        for x, n in zip(extra, cols, strict=True):
            if n in t_few:
                x["few_median_us"] = t_few[n]
    return res, extra


def _time_few(device: str, wtype: str, shape: tuple[int, ...], cols: list[int], n_used: int, threads: int,
              warmup: int, repeats: int, repack: bool, host_of: str, layout: str) -> dict[int, float]:
    """A MUL_MAT_ID's median (us) with every token on the same n_used experts, at those of `cols`
    whose tokens could use more experts than that."""
    few = [n for n in cols if min(shape[2], n * n_used) > n_used]
    if not few:
        return {}
    res = _core.profile_mul_mat_id(device, wtype, shape[0], shape[1], shape[2], n_used, few, [n_used] * len(few),
                                   threads, warmup, repeats, repack, host_of, layout, LONG_US)
    return {n: statistics.median(r.samples_us) for n, r in zip(few, res, strict=True)}


def _time_layouts(out: dict[str, dict[str, dict[str, Any]]], op: str, wtype: str, shape: tuple[int, ...],
                  cols: list[int], timed: tuple[list[Any], list[dict[str, Any]]],
                  time_in: Callable[[str], tuple[list[Any], list[dict[str, Any]]]], loaders_own: bool) -> None:
    """A host weight matmul (MUL_MAT, or a mixture of experts' MUL_MAT_ID) in the layout its default
    load did not time: the plain one when the default is repacked; the repacked one, if the CPU has
    it for this weight, when the default is plain (no repacking, or a GPU's host memory). Both go to
    `out` (layout -> op key -> stats). time_in(layout): timed with repacking on and no GPU host
    memory, in that layout ("": the loader's own choice); loaders_own: the default load was that
    too, so a plain default means CPU_REPACK has no layout for this weight (nothing to time)."""
    default = timed[0][0].buffer_type
    if default == REPACK:
        pairs = {REPACK: timed, PLAIN: time_in(PLAIN)}
    elif loaders_own:
        return
    else:
        other = time_in("")  # the loader's own probe: only a weight CPU_REPACK supports may be put there
        if other[0][0].buffer_type != REPACK:
            return
        pairs = {PLAIN: timed, REPACK: other}
    for lay, (res, extra) in pairs.items():
        for n, r, x in zip(cols, res, extra, strict=True):
            out.setdefault(lay, {})[Profile.op_key(op, wtype, shape, n)] = {**op_stats(r.samples_us),
                                                                            "buffer_type": r.buffer_type, **x}


def _experts_used(inv: Inventory) -> dict[tuple[str, str, tuple[int, ...]], set[int]]:
    """MUL_MAT_ID signatures -> the experts each token is routed to (ne[0] of the ops' ids)."""
    routed: dict[tuple[str, str, tuple[int, ...]], set[int]] = {}
    for g in inv.graphs:
        for o in inv.target_ops(g):
            if o.op == "MUL_MAT_ID":
                routed.setdefault((o.op, o.weight_type, o.weight_shape), set()).add(o.n_expert_used)
    return routed


def measure(inv: Inventory, devices: Sequence[str], settings: Settings, *, warmup: int = 2, repeats: int = 5,
            progress: bool = True, known: KnownTimes | None = None, few: bool = True) -> Profile:
    """Time every target op signature of `inv` on every device, and the host<->device links.
    known: one-op times already measured on these devices with these settings (a device model's,
    devicemodel.py; its devices under today's names): a weight matmul's times at the column counts
    it has are taken from it, only the others timed. few: expert matmuls also with every token on
    the same experts (`time_op`; `time_few` adds them later)."""
    t_start = time.perf_counter()
    reused = 0
    devs = [devmod.resolve(d) for d in devices]
    sigs = signatures(inv)
    shapes = shapes_hash(inv, columns=settings.calibrate)
    ops: dict[str, dict[str, dict[str, Any]]] = {d.name: {} for d in devs}
    links: dict[str, dict[str, Link]] = {}
    info: dict[str, dict[str, Any]] = {}
    layouts: dict[str, dict[str, dict[str, Any]]] = {}
    total = len(sigs) * len(devs)
    done = 0
    # with a GPU-class device in the load, llama.cpp keeps host weights in its pinned host buffer
    # type (plain layout), ahead of the repacked ones: time the CPU's ops in that memory
    host_of = next((d.name for d in devs if not d.is_host and d.host_buffer_type), "")
    routed = _experts_used(inv)
    for d in devs:
        threads = settings.threads if d.is_host else 1
        launch = _core.profile_launch(d.name, threads, warmup, max(repeats, 5))
        issue = _core.profile_launch(d.name, threads, warmup, max(repeats, 5), wait=False)
        info[d.name] = {"description": d.description, "kind": d.kind, "launch_us": statistics.median(launch.samples_us),
                        "issue_us": statistics.median(issue.samples_us)}
        for (op, wtype, shape), ns in sorted(sigs.items()):
            cols = sorted(ns)
            n_used = None
            if op == "MUL_MAT_ID" and len(shape) == 3 and len(routed.get((op, wtype, shape), ())) == 1:
                (n_used,) = routed[(op, wtype, shape)]
            elif op != "MUL_MAT":
                raise ProfileError(f"profiling {op} is not supported yet ({wtype} {shape}, experts used: "
                                   f"{sorted(routed.get((op, wtype, shape), ()))})")
            if op == "MUL_MAT" and known is not None:
                left = _take_known(known, d.name, d.is_host, op, wtype, shape, cols, ops[d.name], layouts)
                reused += len(cols) - len(left)
                if not left:
                    done += 1
                    continue
                cols = left
            _time_signature(d, (op, wtype, shape), cols, n_used, settings, host_of, warmup, repeats, ops[d.name], layouts,
                            few)
            done += 1
            if progress:
                print(f"\rprofile: {done}/{total} op shapes ({d.name}: {op} {wtype} {'x'.join(map(str, shape))} "
                      f"at {','.join(map(str, cols))} cols)".ljust(100), end="", file=sys.stderr, flush=True)
        if not d.is_host:
            links[d.name] = {}
            for direction, h2d in (("h2d", True), ("d2h", False)):
                pts = []
                for b in _spread(_activation_sizes(inv)):
                    r = _core.profile_copy(d.name, b, h2d, warmup, repeats)
                    pts.append((b, statistics.median(r.samples_us)))
                links[d.name][direction] = Link.fit(pts)
    if progress:
        print(f"\rprofile: {total} op shapes on {len(devs)} device(s) in {time.perf_counter() - t_start:.1f} s"
              f"{f' ({reused} op timings from the device model)' if reused else ''}".ljust(100), file=sys.stderr, flush=True)
    prof = Profile(profile_key(shapes, devs, settings), shapes, info, settings, build_info(), ops, links,
                   layouts=layouts)
    prof.elapsed_s = time.perf_counter() - t_start
    return prof


def _time_signature(d: devmod.Device, sig: tuple[str, str, tuple[int, ...]], cols: list[int], n_used: int | None,
                    settings: Settings, host_of: str, warmup: int, repeats: int, out: dict[str, dict[str, Any]],
                    layouts: dict[str, dict[str, dict[str, Any]]], few: bool = True) -> None:
    """Time one weight matmul signature (op, weight type, shape) on `d` at `cols` into `out` (op key
    -> stats) and, on the host, in both layouts into `layouts` (few: `time_op`'s)."""
    op, wtype, shape = sig
    threads = settings.threads if d.is_host else 1
    try:
        res, extra = time_op(d.name, op, wtype, shape, cols, n_used, threads, warmup, repeats, settings.repack,
                             host_of, few=few)
    except RuntimeError as e:
        if d.is_host or not is_unsupported(e):
            raise ProfileError(str(e)) from None
        # an accelerator refusing the op at this size (lavapipe: a 262144-row tied output matrix):
        # its weight stays on the host (schedmodel), as llama.cpp's loader keeps it
        out.update({Profile.op_key(op, wtype, shape, n): {UNSUPPORTED: True} for n in cols})
        return
    try:
        if d.is_host:
            _time_layouts(layouts, op, wtype, shape, cols, (res, extra),
                          lambda lay: time_op("CPU", op, wtype, shape, cols, n_used, threads, warmup, repeats, True, "",
                                              lay, few), settings.repack and not host_of)
    except RuntimeError as e:
        raise ProfileError(str(e)) from None
    for n, r, x in zip(cols, res, extra, strict=True):
        out[Profile.op_key(op, wtype, shape, n)] = {**op_stats(r.samples_us), "buffer_type": r.buffer_type, **x}


def time_more_columns(prof: Profile, wanted: Mapping[tuple[str, str, tuple[int, ...]], Collection[int]], *,
                      experts: Mapping[tuple[str, str, tuple[int, ...]], set[int]] | None = None,
                      known: KnownTimes | None = None, few: bool = True, warmup: int = 2, repeats: int = 5) -> int:
    """Time the weight matmuls of `wanted` (signature -> column counts) at those of their column
    counts `prof` lacks, on each of its devices, into `prof` (taken from `known` where it has them):
    the signature-device pairs timed. An expert matmul (MUL_MAT_ID) is timed only with `experts`,
    its experts per token (`_experts_used`; few: `time_op`'s)."""
    devs = [devmod.resolve(d) for d in prof.devices]
    host_of = next((d.name for d in devs if not d.is_host and d.host_buffer_type), "")
    timed = 0
    for d in devs:
        table = prof.ops.setdefault(d.name, {})
        for sig, cols in sorted(wanted.items()):
            op, wtype, shape = sig
            missing = sorted(n for n in set(cols) if Profile.op_key(*sig, n) not in table)
            n_used = None
            if op == "MUL_MAT_ID" and len((experts or {}).get(sig, ())) == 1:
                (n_used,) = (experts or {})[sig]
            elif op != "MUL_MAT":
                continue
            if missing and op == "MUL_MAT" and known is not None:
                missing = _take_known(known, d.name, d.is_host, op, wtype, shape, missing, table, prof.layouts)
            if missing:
                _time_signature(d, sig, missing, n_used, prof.settings, host_of, warmup, repeats, table, prof.layouts,
                                few)
                timed += 1
    return timed


def time_few(prof: Profile, inv: Inventory, *, warmup: int = 2, repeats: int = 5) -> int:
    """Time into `prof` the expert matmuls' times with every token on the same experts
    (`few_median_us`) that it lacks: a profile measured for a shape-only file (`measure`'s few
    off) taken by a model whose routing is measured. The op-device-layout tables timed."""
    devs = [devmod.resolve(d) for d in prof.devices]
    host_of = next((d.name for d in devs if not d.is_host and d.host_buffer_type), "")
    timed = 0
    sigs = signatures(inv)
    for (op, wtype, shape), used in sorted(_experts_used(inv).items()):
        if len(used) != 1:
            continue
        (n_used,) = used
        cols = sorted(sigs[(op, wtype, shape)])
        for d in devs:
            threads = prof.settings.threads if d.is_host else 1
            # (table, how that table's times were taken: repacking allowed, host_of, layout)
            tables = [(prof.ops.get(d.name, {}), prof.settings.repack, host_of, "")]
            if d.is_host:
                tables += [(prof.layouts.get(lay, {}), True, "", lay) for lay in HOST_LAYOUTS]
            for table, repack, host, layout in tables:
                keys = {n: Profile.op_key(op, wtype, shape, n) for n in cols}
                missing = [n for n, k in keys.items() if k in table and "few_median_us" not in table[k]
                           and table[k].get("n_active", 0) > n_used]
                if not missing:
                    continue
                t_few = _time_few(d.name, wtype, shape, missing, n_used, threads, warmup, repeats, repack, host, layout)
                for n, us in t_few.items():
                    table[keys[n]]["few_median_us"] = us
                timed += 1
    return timed


def _take_known(known: KnownTimes, device: str, is_host: bool, op: str, wtype: str, shape: tuple[int, ...],
                cols: list[int], out: dict[str, dict[str, Any]], layouts: dict[str, dict[str, dict[str, Any]]]) -> list[int]:
    """Copy a weight matmul's times at those of `cols` that `known` has into `out` (and, on the
    host, its other layouts' into `layouts`); the column counts still to time."""
    have = known.ops.get(device, {})
    keys = {n: Profile.op_key(op, wtype, shape, n) for n in cols}
    found = [k for k in keys.values() if k in have]
    out.update({k: dict(have[k]) for k in found})
    if is_host:
        for lay, table in known.layouts.items():
            layouts.setdefault(lay, {}).update({k: dict(table[k]) for k in found if k in table})
    return [n for n, k in keys.items() if k not in have]


def profile_model(path: str | Path, devices: Sequence[str], *, threads: int | None = None,
                  n_tokens: Sequence[int] = DEFAULT_TOKENS, n_ctx: int = 4096, op_offload: bool = True,
                  mmap: bool = True, repack: bool = True, cache: bool = True, warmup: int = 2, repeats: int = 5,
                  progress: bool = True, inv: Inventory | None = None, calibrated: bool = True,
                  server_threads: int = 0, known: KnownTimes | None = None, flash_attn: bool = False,
                  type_k: str = "f16", type_v: str = "f16", decode_tokens: int = 1, routed: bool = True,
                  decode_past: int = 0) -> Profile:
    """Profile a model on `devices` (the CPU and the accelerators), reusing a cached profile
    with the same key. `threads` defaults to llama-cpp-python's default for generation.
    calibrated: also time the real graph (calibrate.py); server_threads: threads of the
    rpc-server among `devices`, when known (part of the key: the times depend on it); known:
    one-op times to take rather than measure (`measure`); flash_attn, type_k, type_v: the real graph's
    attention (the calibration's loads; the one-op times do not depend on it); decode_tokens: the
    workload's decode pass, which the calibration times too (and n_tokens should hold); routed: the
    model's expert routing is measured, so its expert matmuls are timed with every token on the
    same experts too (`time_op`'s few; added to a cached profile that lacks them); decode_past: the cells
    the workload's decode passes follow, on average: a calibration's decode attention is also timed there
    (`calibrate.with_decode_tail`; added to a cached profile that lacks it)."""
    settings = default_settings(threads, op_offload=op_offload, mmap=mmap, repack=repack, calibrated=calibrated,
                                server_threads=server_threads, flash_attn=flash_attn, type_k=type_k, type_v=type_v,
                                decode_tokens=decode_tokens)
    if inv is None:
        inv = inventory(path, sorted(set(n_tokens)), n_ctx=n_ctx,
                        outputs={decode_tokens: decode_tokens} if decode_tokens > 1 else None)
    devs = [devmod.resolve(d) for d in devices]
    key = profile_key(shapes_hash(inv, columns=calibrated), devs, settings)
    cached = cache_dir() / f"{key}.json"
    if cache and cached.exists():
        try:
            prof: Profile | None = Profile.load(cached).renamed([d.name for d in devs])
        except (ProfileError, KeyError, ValueError):
            prof = None  # unreadable: measure again
        if prof is not None:
            if progress:
                print(f"profile: reusing {cached}", file=sys.stderr)
            # outside the try: a routing that cannot be measured is an error, not an unreadable cache
            changed = _remeasure_routing(prof, path, settings, progress)
            n_few = time_few(prof, inv, warmup=warmup, repeats=repeats) if routed else 0
            if progress and n_few:
                print(f"profile: timed {n_few} expert matmul table(s) with every token on the same experts "
                      "(this model's routing needs them)", file=sys.stderr)
            # uncalibrated: keyed without column counts (shapes_hash), it grows by those of this plan
            t0 = time.perf_counter()
            n_cols = 0 if calibrated else time_more_columns(prof, signatures(inv), experts=_experts_used(inv),
                                                            known=known, few=routed, warmup=warmup, repeats=repeats)
            if progress and n_cols:
                print(f"profile: timed {n_cols} op shape(s) at column counts the cached profile lacked "
                      f"({', '.join(map(str, sorted(set(n_tokens))))} asked) in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
            tailed = _decode_tail(prof, path, settings, decode_past, progress)
            if changed or n_few or n_cols or tailed:
                prof.save(cached)
            return prof
    acc = next((d.name for d in devs if not d.is_host), None)
    before = hostspeed.measure_devices(settings.threads, acc)
    prof = measure(inv, [d.name for d in devs], settings, warmup=warmup, repeats=repeats, progress=progress,
                   known=known, few=routed)
    # before the calibration: a launch timed while the machine was disturbed is taken as timed around it
    prof.host_speed = {"reference": hostspeed.REF_DESCRIPTION, "before": before}
    for d in devs:
        timed, taken = float(prof.devices[d.name].get("launch_us", 0.0)), prof.launch_us(d.name)  # us
        if progress and taken < timed / 2:
            print(f"profile: {d.name}'s launch timed {timed:.0f} us, slower than its timings just before or its "
                  f"fastest op: taken as {taken:.0f} us (Profile.launch_us)", file=sys.stderr)
    if calibrated:
        prof.calibration = calibrate(path, [d.name for d in devs], prof, threads=settings.threads,
                                     op_offload=op_offload, mmap=mmap, progress=progress,
                                     attention=settings.attention(), decode=settings.decode_tokens)
        prof.elapsed_s += prof.calibration.elapsed_s
        _decode_tail(prof, path, settings, decode_past, progress)
    prof.host_speed["after"] = hostspeed.measure_devices(settings.threads, acc)
    if cache:
        prof.save(cached)
    return prof


def _decode_tail(prof: Profile, path: str | Path, settings: Settings, past: int, progress: bool) -> bool:
    """A calibrated profile's decode attention also timed after `past` cells, where it was not yet. True
    when it was added."""
    if prof.calibration is None or not past:
        return False
    cal = with_decode_tail(prof.calibration, prof, path, list(prof.devices), past, threads=settings.threads,
                           mmap=settings.mmap, op_offload=settings.op_offload, attention=settings.attention(),
                           progress=progress)
    if cal is None:
        return False
    prof.elapsed_s += cal.elapsed_s - prof.calibration.elapsed_s
    prof.calibration = cal
    return True


def _remeasure_routing(prof: Profile, path: str | Path, settings: Settings, progress: bool) -> bool:
    """A cached calibration's routing was measured on another model of these shapes (the cache key
    is the shapes): measure this model's (one prompt pass). True when it did."""
    cal = prof.calibration
    if cal is None or cal.routing is None or cal.routing.model == routing_fingerprint(path):
        return False
    cal.routing = measure_routing(path, cal.routing.n_expert, n_tokens=cal.routing.n_tokens, threads=settings.threads,
                                  mmap=settings.mmap, progress=progress)
    if progress:
        print(file=sys.stderr)
    return True


# --- CLI ------------------------------------------------------------------------------------


@dataclass
class ProfileOptions:
    """Everything `oallama profile` takes (its flags are generated from these fields)."""

    model: Path = option(positional=True, help="GGUF model file")
    device: str | None = option(None, help="accelerator to profile besides the CPU", default_help="the first GPU")
    rpc_local: bool = option(False, help="use a loopback rpc-server as the accelerator")
    rpc_threads: int = option(1, help="threads of that rpc-server")
    rpc_cpus: tuple[int, ...] | None = option(None, metavar="CPU,...", help="CPUs of that rpc-server; the client "
                                              "then runs on the others", default_help="wherever the kernel puts them")
    threads: int | None = option(None, help="CPU threads", default_help="llama-cpp-python's")
    tokens: list[int] = option(list(DEFAULT_TOKENS), help="token counts to profile at")
    repeats: int = option(5, help="timed runs per op (median and spread)")
    cache: bool = option(True, help="reuse a matching cached profile (--no-cache: measure again)")
    calibrate: bool = option(True, help="also time the model's real graph and fit what one-op timings miss "
                             "(other ops, overheads; see planner/cost/calibrate.py)")
    output: Path | None = option(None, short="-o", help="also write the profile to this file")


def _cmd_profile(args: argparse.Namespace) -> int:
    from ...runtime.rpc import local_server_if

    o = from_args(ProfileOptions, args)
    with local_server_if(o.rpc_local and not o.device, o.rpc_threads, o.rpc_cpus) as server:
        devices = ["CPU"]
        if o.device:
            devices.append(o.device)
        elif server is not None:
            devices.append(server.device_name)
        else:
            acc = devmod.default_accelerator()
            if acc is not None:
                devices.append(acc.name)
        server_threads = o.rpc_threads if server is not None else 0
        prof = profile_model(o.model, devices, threads=o.threads, n_tokens=sorted(set(o.tokens)), cache=o.cache,
                             repeats=o.repeats, calibrated=o.calibrate, server_threads=server_threads)
        print(f"profile {prof.key[:12]}: devices {', '.join(prof.devices)}; threads={prof.settings.threads}; "
              f"{sum(len(v) for v in prof.ops.values())} measurements in {prof.elapsed_s:.1f} s")
        for dev, ls in prof.links.items():
            for k, link in ls.items():
                print(f"  {dev} {k}: latency {link.latency_us:.1f} us, {link.bytes_per_us * 1e6 / 2**30:.2f} GiB/s")
        cal = prof.calibration
        if cal is not None:
            dec = f"; a decode pass {cal.decode_us:.0f} us" if cal.decode_us is not None else ""
            print(f"  calibration ({cal.elapsed_s:.1f} s): outside the graph {cal.pass_a_us:.0f} us per prompt pass "
                  f"+ {cal.pass_b_us:.2f} us per token{dec}")
            for dev, dc in cal.devices.items():
                print(f"  {dev}: {len(dc.ops) - 1} op kinds fitted; weight matmuls {dc.matmul_scale:.2f} x their "
                      f"one-op time; {dc.node_overhead_us:.1f} us per node timed alone; per pass size x "
                      f"{', '.join(f'{r:.2f} ({n} tok)' for n, r in sorted(dc.anchors.items())) or '1'}")
        if o.output:
            print(f"wrote {prof.save(o.output)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="time every weight-bearing op of a model on each device")
    add_arguments(p, ProfileOptions)
    p.set_defaults(func=_cmd_profile)
