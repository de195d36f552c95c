"""Profile: what every target op costs on every device, and what moving data costs.

For each distinct (op, weight type, weight shape, columns) of the graphs llama.cpp builds at
the token counts that occur (decode = 1 and the prefill sizes), the op is timed on each device
as a one-op ggml graph on that device's backend (csrc/profile.cpp): the weight in the buffer
type a real load would use (CPU: repacked layouts when enabled), the CPU with the thread count
it will run with, warm-up runs discarded, median and spread of the repeats kept.

A host weight can live in several layouts (`HOST_LAYOUTS`: plain memory, ggml's repacked layout for
the CPU's kernels): each host matmul that has a repacked layout is timed in both (`layouts`), so
the planner can choose per weight (issue: layouts are placements too).

T' (moving activations between host and device) is measured as synchronised copies over the
activation sizes that occur and fitted as latency + bytes / bandwidth, per direction. The fixed
cost of handing a device one graph (a split) is measured as `launch_us`.

Profiles are saved as JSON, keyed by the model's op shapes, the devices, the build and the
settings (threads, op_offload, mmap, repack), and reused when all of these match.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import _core, _libs
from ..._files import cache_base, read_json
from ..._version import __version__
from ...errors import ProfileError
from ...runtime import devices as devmod
from ...runtime import kvcache
from ...runtime import rpc as rpcmod
from ...runtime.place import HOST_LAYOUT_NAMES
from ..graph import Inventory, TargetOp
from .calfit import Calibration
from .calibrate import VERSION as CALIBRATION_VERSION

SCHEMA = "oallama.profile/2"  # /2: issue_us, compute less launch, calibration
DEFAULT_TOKENS = (1, 32, 64, 128, 256, 512)
PLAIN, REPACK, DUAL = HOST_LAYOUT_NAMES  # host weight layouts (ggml buffer types)
HOST_LAYOUTS = (PLAIN, REPACK)  # timed per host matmul; DUAL runs one or the other (by batch)
LAYOUTS_VERSION = 2  # how `layouts` is measured (part of the profile key); 2: MUL_MAT_ID too


def cache_dir() -> Path:
    return cache_base() / "profiles"


@dataclass(frozen=True)
class Settings:
    """Everything a measurement depends on besides the op and the device."""

    threads: int
    op_offload: bool = True
    mmap: bool = True
    repack: bool = True  # llama.cpp's use_extra_bufts (CPU weight repacking)
    calibrate: bool = False  # the real graph was timed too (calibrate.py)
    server_threads: int = 0  # threads of the rpc-server measured (0: none, or not known)
    # the real graph's attention (calibrate.py's loads): flash attention resolved, the KV cache's types
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    decode_tokens: int = 1  # the calibration's decode pass (tokens): a workload's sequences, decoded together

    def as_dict(self) -> dict[str, Any]:
        """The settings as a profile's key and file hold them (attention only where it is not
        llama.cpp's f16 cache without flash attention, the decode pass where it is not one token,
        so that older keys still match)."""
        out = {"threads": self.threads, "op_offload": self.op_offload, "mmap": self.mmap, "repack": self.repack,
               "calibrate": self.calibrate, "server_threads": self.server_threads}
        if (self.flash_attn, self.type_k, self.type_v) != (False, "f16", "f16"):
            out.update(flash_attn=self.flash_attn, type_k=self.type_k, type_v=self.type_v)
        if self.decode_tokens != 1:
            out["decode_tokens"] = self.decode_tokens
        return out

    def attention(self) -> dict[str, Any]:
        """llama_cpp.Llama's keywords for these attention settings."""
        return kvcache.llama_kwargs(self.flash_attn, self.type_k, self.type_v)


def build_info() -> dict[str, Any]:
    stamp = _libs.llama_cpp_stamp()
    return {"oallama": __version__, "llama_cpp_commit": stamp["llama_cpp_commit"],
            "patches": [p[0] for p in stamp["patches"]], "cuda": bool(_core.have_cuda)}


def grid_columns(cols: Iterable[int], grid: Sequence[int]) -> set[int]:
    """The column counts of `grid` that `Profile.op_time_us` costs each of `cols` from, had it timed
    the whole grid: the count itself where the grid has it, else its neighbours below and above, or
    the two nearest beyond an end of the grid (at least 2 counts)."""
    g = sorted(set(grid))
    out: set[int] = set()
    for c in cols:
        if c in g:
            out.add(c)
        elif c < g[0]:
            out |= {g[0], g[1]}
        elif c > g[-1]:
            out |= {g[-2], g[-1]}
        else:
            i = bisect.bisect(g, c)
            out |= {g[i - 1], g[i]}
    return out


UNSUPPORTED = "unsupported"  # an op entry's flag: the device refused to run the op (no times)


def is_unsupported(e: BaseException) -> bool:
    """`time_op` failed because the device does not support the op (csrc/profile.cpp's message)."""
    return " does not support " in str(e)


def op_stats(samples: Sequence[float]) -> dict[str, float]:
    """One op's timed runs as a profile entry: median, spread and count (us)."""
    return {"median_us": statistics.median(samples), "stdev_us": statistics.stdev(samples) if len(samples) > 1 else 0.0,
            "min_us": min(samples), "max_us": max(samples), "n": len(samples)}


@dataclass
class Link:
    """Copy cost between host memory and a device (us for a copy of n bytes).

    With measured samples: the curve through them (piecewise linear in bytes, times made
    non-decreasing), extended by its first and last segments. One line cannot hold both ends
    where a device takes small copies at another rate than large ones (an rpc-server's socket
    buffer takes a 4-512 KiB set at once, a 2+ MiB one at the drain rate: the least-squares
    line put a 16 KiB copy at 6 us against 60 measured). Without samples (a link derived by
    the planner, e.g. `context.stream_link`): latency_us + bytes / bytes_per_us, which `fit`
    also gives for the samples, for a summary."""

    latency_us: float
    bytes_per_us: float
    samples: list[tuple[int, float]] = field(default_factory=list)  # (bytes, median us)

    @functools.cached_property
    def _curve(self) -> tuple[list[float], list[float]]:
        pts = sorted((float(b), float(t)) for b, t in self.samples if b > 0)
        xs: list[float] = []
        ys: list[float] = []
        for b, t in pts:
            if xs and b == xs[-1]:
                continue
            xs.append(b)
            ys.append(max(t, ys[-1]) if ys else t)
        return xs, ys

    def time_us(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        xs, ys = self._curve
        if len(xs) < 2:
            return self.latency_us + nbytes / self.bytes_per_us
        k = min(max(bisect.bisect_left(xs, nbytes), 1), len(xs) - 1)  # segment [k-1, k]
        slope = (ys[k] - ys[k - 1]) / (xs[k] - xs[k - 1])
        return max(ys[k - 1] + (nbytes - xs[k - 1]) * slope, 0.0)

    @staticmethod
    def fit(samples: list[tuple[int, float]]) -> Link:
        """Least squares of us = a + bytes / bw, with a >= 0 and bw > 0."""
        xs = [float(b) for b, _ in samples]
        ys = [t for _, t in samples]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var > 0 else 0.0
        slope = max(slope, 1e-9)
        lat = max(my - slope * mx, 0.0)
        return Link(lat, 1.0 / slope, samples)


@dataclass
class Profile:
    key: str
    model_shapes: str
    devices: dict[str, dict[str, Any]]  # name -> {description, kind, launch_us}
    settings: Settings
    build: dict[str, Any]
    ops: dict[str, dict[str, dict[str, Any]]]  # device -> op key -> stats (+ buffer_type)
    links: dict[str, dict[str, Link]]  # device -> {"h2d": Link, "d2h": Link}
    created: float = field(default_factory=time.time)
    elapsed_s: float = 0.0
    calibration: Calibration | None = None  # terms fitted on the real graph (calibrate.py)
    # host layout -> op key -> stats: the host's matmuls in each layout they can have (only
    # signatures with a repacked layout; the default layout's times are also in ops["CPU"])
    layouts: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # the devices' speed around the measurement (hostspeed.py): {"reference", "before", "after"},
    # each a hostspeed.measure_devices(); empty in profiles from before it was recorded
    host_speed: dict[str, Any] = field(default_factory=dict)
    # the machine that measured it ({machine, node, cpu, cpu_detail}): this one's until saved, then kept as
    # loaded (a profile saved again elsewhere still names where it was measured)
    host: dict[str, Any] = field(default_factory=lambda: host_description())

    # --- queries ----------------------------------------------------------------------------

    @staticmethod
    def op_key(op: str, wtype: str, shape: Sequence[int], n: int) -> str:
        return f"{op}:{wtype}:{'x'.join(map(str, shape))}:{n}"

    def op_time_us(self, device: str, op: TargetOp, n: int | None = None, layout: str | None = None,
                   active: float | None = None) -> float:
        """Median time of `op` on `device` at n columns (default: the op's own), interpolated
        linearly between the measured column counts (and extrapolated from the two nearest).
        layout: a host layout (HOST_LAYOUTS) instead of the one a default load uses.
        active: of a MUL_MAT_ID, the distinct experts its tokens are routed to (a recorded
        routing, `routing.Routing`); linear between its times with every token on the same
        experts and with the most experts its tokens can use. None: the most."""
        n = op.n_tokens if n is None else n
        table = self.ops.get(device) if layout is None else self.layouts.get(layout)
        if table is None:
            raise ProfileError(f"profile {self.key[:12]} has no measurements for device {device}"
                               + (f" in layout {layout}" if layout else ""))
        t = self._interpolated(table, device, op, n, "median_us")
        if active is None or op.op != "MUL_MAT_ID" or op.n_expert_used <= 0:
            return t
        most = min(op.weight_shape[2], max(n, 1) * op.n_expert_used)
        if most <= op.n_expert_used:
            return t
        try:
            t_few = self._interpolated(table, device, op, n, "few_median_us")
        except ProfileError:  # a profile from before these were timed
            return t
        f = min(max((active - op.n_expert_used) / (most - op.n_expert_used), 0.0), 1.0)
        return t_few + f * (t - t_few)

    def _interpolated(self, table: dict[str, dict[str, Any]], device: str, op: TargetOp, n: int, field: str) -> float:
        exact = table.get(self.op_key(op.op, op.weight_type, op.weight_shape, n))
        if exact is not None and field in exact:
            return float(exact[field])
        prefix = self.op_key(op.op, op.weight_type, op.weight_shape, 0)[:-1]
        pts = sorted((int(k.rsplit(":", 1)[1]), float(v[field])) for k, v in table.items()
                     if k.startswith(prefix) and field in v)
        if not pts:
            raise ProfileError(f"profile has no measurement of {prefix.rstrip(':')} on {device}")
        if len(pts) == 1:
            return pts[0][1] * max(n, 1) / max(pts[0][0], 1)
        lo = max([p for p in pts if p[0] <= n], default=pts[0], key=lambda p: p[0])
        hi = min([p for p in pts if p[0] >= n], default=pts[-1], key=lambda p: p[0])
        if lo[0] == hi[0]:  # outside the measured range: extend the nearest segment
            i = pts.index(lo)
            lo, hi = (pts[i - 1], pts[i]) if i > 0 else (pts[0], pts[1])
        return max(lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0]), 0.0)

    def renamed(self, names: Sequence[str]) -> Profile:
        """The same measurements under the current names of its devices (in measurement order):
        a loopback rpc-server gets a new port, hence a new name, every time it starts."""
        old = list(self.devices)
        if len(old) != len(names):
            raise ValueError("profile has a different number of devices")
        ren = dict(zip(old, names, strict=True))
        return Profile(self.key, self.model_shapes, {ren[k]: v for k, v in self.devices.items()}, self.settings,
                       self.build, {ren[k]: v for k, v in self.ops.items()},
                       {ren[k]: v for k, v in self.links.items()}, self.created, self.elapsed_s,
                       self.calibration.renamed(ren) if self.calibration is not None else None, self.layouts,
                       self.host_speed, self.host)

    def link(self, device: str, direction: str) -> Link:
        if device not in self.links:
            return Link(0.0, float("inf"))  # the host itself
        return self.links[device][direction]

    def launch_us(self, device: str) -> float:
        """One tiny graph run and waited for (us): what every op's profiled time includes. On a CPU
        or a GPU it is a fixed cost that a disturbance only lengthens, so the least of its timings
        (each a median): the profile's own and `host_speed`'s just before it, bounded by the
        device's fastest profiled op, which includes one. A host's launch has been timed at 12 ms
        beside matmuls of 46 us and up, and at 7 us just before: taken as it was, it would leave
        every op on the device a tenth of its time (`compute_us`). Not `host_speed`'s "after": it is
        timed once the calibration is done, so a calibration would be fitted with one launch and
        applied with another. An rpc-server's launch and op times are each a network round trip, of
        two lengths (bimodal): taken as measured."""
        d = self.devices.get(device, {})
        measured = float(d.get("launch_us", 0.0))  # us
        if d.get("kind") == "rpc":
            return measured
        role = "host" if device == "CPU" else "accelerator"  # hostspeed.measure_devices' roles
        before = self.host_speed.get("before")
        around = ([float(before[role]["launch_us"])] if isinstance(before, dict) and isinstance(before.get(role), dict)
                  and "launch_us" in before[role] else [])  # us
        fastest = [float(v["median_us"]) for v in self.ops.get(device, {}).values()
                   if not v.get(UNSUPPORTED) and "median_us" in v]  # us
        return min([measured, *around, *fastest])

    def issue_us(self, device: str) -> float:
        """One graph handed to the device (us): what a split costs the host in a pass (an
        rpc-server is sent its work, not waited for; other backends: the same as launch_us)."""
        d = self.devices.get(device, {})
        return float(d.get("issue_us", d.get("launch_us", 0.0)))

    def refused(self, device: str) -> set[tuple[str, tuple[int, ...]]]:
        """(weight type, shape) of the weight matmuls `device` refused to run when profiled."""
        out = set()
        for k, v in self.ops.get(device, {}).items():
            if v.get(UNSUPPORTED):
                _, wtype, shape, _ = k.split(":")
                out.add((wtype, tuple(int(x) for x in shape.split("x"))))
        return out

    def supports(self, device: str, op: TargetOp) -> bool:
        """False where `device` refused to run `op`'s signature when it was profiled."""
        prefix = self.op_key(op.op, op.weight_type, op.weight_shape, 0)[:-1]
        return not any(k.startswith(prefix) and v.get(UNSUPPORTED) for k, v in self.ops.get(device, {}).items())

    def compute_us(self, device: str, op: TargetOp, layout: str | None = None, active: float | None = None) -> float:
        """The op's own compute (us): its profiled time less the launch it includes (at least a
        tenth of it: a launch measured slower than a small op is noise, not a negative cost).
        layout: a host layout (HOST_LAYOUTS) instead of the default load's; active: see op_time_us."""
        t = self.op_time_us(device, op, layout=layout, active=active)
        return max(t - self.launch_us(device), 0.1 * t)

    def has_layouts(self, op: TargetOp) -> bool:
        """The host times `op` in every host layout (its weight type and shape can be repacked)."""
        key = self.op_key(op.op, op.weight_type, op.weight_shape, op.n_tokens)
        prefix = key.rsplit(":", 1)[0] + ":"
        return all(any(k == key or k.startswith(prefix) for k in self.layouts.get(lay, {})) for lay in HOST_LAYOUTS)

    def default_layout(self, op: TargetOp) -> str:
        """The host layout a default load gives `op`'s weight (the buffer type it was timed in)."""
        table = self.ops.get("CPU", {})
        prefix = self.op_key(op.op, op.weight_type, op.weight_shape, 0)[:-1]
        bt = next((v.get("buffer_type") for k, v in table.items() if k.startswith(prefix)), PLAIN)
        return REPACK if bt == REPACK else PLAIN

    # --- persistence --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "key": self.key, "model_shapes": self.model_shapes, "devices": self.devices,
                "settings": self.settings.as_dict(), "build": self.build, "ops": self.ops,
                "links": {d: {k: {"latency_us": v.latency_us, "bytes_per_us": v.bytes_per_us, "samples": v.samples}
                              for k, v in ls.items()} for d, ls in self.links.items()},
                "created": self.created, "elapsed_s": self.elapsed_s,
                "calibration": self.calibration.to_json() if self.calibration is not None else None,
                "layouts": self.layouts, "host_speed": self.host_speed,
                "host": self.host}

    @staticmethod
    def from_json(doc: dict[str, Any], path: str | Path = "<profile>") -> Profile:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if schema != SCHEMA:
            raise ProfileError(f"{path}: not an oallama profile (schema {schema!r}, expected {SCHEMA})")
        try:
            links = {d: {k: Link(float(v["latency_us"]), float(v["bytes_per_us"]), [tuple(s) for s in v["samples"]])
                         for k, v in ls.items()} for d, ls in doc["links"].items()}
            prof = Profile(doc["key"], doc["model_shapes"], doc["devices"], Settings(**doc["settings"]),
                           doc["build"], doc["ops"], links, doc.get("created", 0.0), doc.get("elapsed_s", 0.0))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProfileError(f"{path}: corrupt oallama profile: missing or bad field "
                               f"({type(e).__name__}: {e})") from None
        prof.layouts = doc.get("layouts") or {}
        prof.host_speed = doc.get("host_speed") or {}
        prof.host = doc.get("host") or {}  # profiles from before it was recorded: not known
        if not all(isinstance(x, dict) for x in (prof.devices, prof.build, prof.ops, prof.layouts, prof.host_speed)) or \
                not all(isinstance(t, dict) for t in [*prof.ops.values(), *prof.layouts.values()]):
            raise ProfileError(f"{path}: corrupt oallama profile: 'devices', 'build', 'ops' and 'layouts' must be "
                               "mappings")
        if doc.get("calibration"):
            try:
                prof.calibration = Calibration.from_json(doc["calibration"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ProfileError(f"{path}: corrupt calibration in the profile ({type(e).__name__}: {e})") from None
        return prof

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(p)
        return p

    @staticmethod
    def load(path: str | Path) -> Profile:
        prof = Profile.from_json(read_json(path, "profile", ProfileError), path)
        here = build_info()
        diff = [k for k in sorted(set(here) | set(prof.build)) if prof.build.get(k) != here.get(k)]
        if diff:  # measured with other llama.cpp code: its times are not this build's
            raise ProfileError(f"{path}: profile was measured by another build ({', '.join(diff)}: "
                               f"{', '.join(f'{prof.build.get(k)!r}' for k in diff)}; this build has "
                               f"{', '.join(f'{here.get(k)!r}' for k in diff)}); measure again with "
                               "`oallama profile`")
        return prof


@dataclass
class KnownTimes:
    """One-op weight matmul times measured before with the same devices and settings (a device
    model's, devicemodel.py), for `measure` to take rather than time again."""

    ops: dict[str, dict[str, dict[str, Any]]]  # device -> op key -> stats, as Profile.ops
    layouts: dict[str, dict[str, dict[str, Any]]]  # host layout -> op key -> stats, as Profile.layouts


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host_description() -> dict[str, str]:
    """This machine, as a profile records where it was measured."""
    return {"machine": platform.machine(), "node": platform.node(), "cpu": _cpu_name(), "cpu_detail": cpu_detail()}


def cpu_detail() -> str:
    """What tells apart CPUs of one model name (a VM's "AMD EPYC" can be two generations whose decode after 8192
    cells differs 2.8x: bench/results/2026-11-28-vm-decode-at-past): family, model and cpu0's cache sizes, as
    Linux gives them; "" elsewhere."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("cpu family", "model") and k.strip() not in info:
                info[k.strip()] = v.strip()
    except OSError:
        pass
    caches = []
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        caches.append(f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''} {size}")
    head = f"family {info['cpu family']} model {info['model']}" if len(info) == 2 else ""
    return "; ".join(x for x in (head, ", ".join(caches)) if x)


def signatures(inv: Inventory) -> dict[tuple[str, str, tuple[int, ...]], set[int]]:
    """(op, weight type, weight shape) -> the column counts it runs at, over every graph."""
    out: dict[tuple[str, str, tuple[int, ...]], set[int]] = {}
    for n in inv.graphs:
        for op in inv.target_ops(n):
            out.setdefault((op.op, op.weight_type, op.weight_shape), set()).add(op.n_tokens)
    return out


def shapes_hash(inv: Inventory, columns: bool = True) -> str:
    """What a profile of `inv` times: its weight matmul signatures, and (columns) the column counts
    each is timed at. An uncalibrated profile is keyed without them: it grows by the counts another
    plan reads (`measure.time_more_columns`), as nothing fitted reads the counts it has."""
    sig = sorted((k, sorted(v) if columns else []) for k, v in signatures(inv).items())
    return hashlib.sha256(repr(sig).encode()).hexdigest()


def device_identity(d: devmod.Device) -> str:
    """What a measurement on `d` is valid for. An rpc-server on this machine is the same device
    whatever port it listens on (oallama starts them on free ports)."""
    # the CPUs this process may use, where restricted (taskset): on one shared CPU or two, a
    # loopback rpc-server's visits cost differently (rpc.restricted_cpus)
    pinned = rpcmod.restricted_cpus()
    mine = f":cpus={pinned}" if pinned else ""
    if d.kind == "rpc":
        host, port = devmod.parse_endpoint(d.description)
        if host in ("127.0.0.1", "localhost", "::1"):
            # the server's times depend on its threads (any port: oallama starts them on free ones)
            pid = rpcmod.listening_pid(host, port)
            theirs = rpcmod.restricted_cpus(pid) if pid is not None else None
            return (f"rpc:loopback:{_cpu_name()}:{cpu_detail()}:threads={rpcmod.server_threads(host, port) or 'default'}"
                    + (f":server_cpus={theirs}" if theirs else "") + mine)
        return f"rpc:{d.description}"
    if d.kind == "cpu":  # its name, and what tells apart two CPUs of that name
        return f"{d.kind}:{d.name}:{d.description}:{cpu_detail()}{mine}"
    return f"{d.kind}:{d.name}:{d.description}"


def profile_key(shapes: str, devs: Sequence[devmod.Device], settings: Settings) -> str:
    doc = {"schema": SCHEMA, "shapes": shapes, "devices": [device_identity(d) for d in devs],
           "settings": settings.as_dict(), "build": build_info(),
           "calibration": CALIBRATION_VERSION if settings.calibrate else None, "layouts": LAYOUTS_VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def default_settings(threads: int | None, *, op_offload: bool = True, mmap: bool = True, repack: bool = True,
                     calibrated: bool = True, server_threads: int = 0, flash_attn: bool = False, type_k: str = "f16",
                     type_v: str = "f16", decode_tokens: int = 1) -> Settings:
    """A measurement's settings; threads default to llama-cpp-python's for generation (half the cores)."""
    return Settings(threads or max((os.cpu_count() or 2) // 2, 1), op_offload, mmap, repack, calibrated,
                    server_threads, flash_attn, type_k, type_v, decode_tokens)
