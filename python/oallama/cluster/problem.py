"""Several weak machines as one: decoder blocks assigned to rpc-server devices by a MILP.

The client (this process, device "CPU") keeps the token embedding and the output head; every
decoder block goes to one of the devices of a devices file (written by ``oallama probe``, or by
hand). The assignment minimises the objective of patent seed 004 (see /work/shared/DESIGN.md):

    minimise T_compute + T_data + T_complexity + T_QoS

over binary x_ij (block j on device i), subject to

    sum_j M_j x_ij <= beta M_i        for every device i  (weights + KV cache of the blocks)
    sum_i x_ij = 1                    for every block j
    x_00 = 1                          block 0 on device 0 = the FIRST device of the devices file

with eps_ij = FLOPs_j / FLOPS_i and t = O / (E_p B). Where the patent is ill-posed this module
decides as follows (and says so in every plan file, under "formulation"):

* Transfers. The patent sums L_ij + t_ij over every (device, block) pair, which charges every
  block for every link whatever the assignment. Here a transfer is counted only where data
  crosses a link: the client sends the embedding output to block 0's device, consecutive blocks
  on different devices exchange the activation, and the last block's device returns its output
  to the client. ggml-rpc has no server-to-server path (a copy between two rpc-servers goes
  through the client: get_tensor from one, set_tensor to the other), so a device change between
  blocks j-1 and j costs an *exit* over the link of j-1's device and an *entry* over the link of
  j's device: (L + t_down) and (L + t_up), L the one-way latency (half the probed round trip),
  t = O / (E_p B) for the activation's O bytes. "Device i before, device k after" is the
  product x_i,j-1 x_k,j, linearised with auxiliaries w_jik >= 0 (j >= 1) by

      sum_k w_jik = x_i,j-1        sum_i w_jik = x_k,j

  which for binary x forces w_jik = x_i,j-1 x_k,j exactly (no big-M); w_jik (i != k) costs
  exit_i(j-1) + entry_k(j). (The smaller e_ij >= x_ij - x_i,j-1, f_ij >= x_i,j-1 - x_ij is
  equally exact but its LP relaxation is much weaker: HiGHS needed minutes on 80 x 8.)
* QoS. Jitter, t * PLR and PLR^2 are properties of a transfer over a link, so the same crossings
  carry them: per crossing of link i, w_q1 Jitter_i + w_q2 t PLR_i + w_q3 PLR_i^2.
* Complexity. w_c sum_ij x_ij equals w_c * (number of blocks) under the assignment constraint:
  a constant. It is read as the patent's intent, a penalty per device taking part:
  w_c sum_i u_i with u_i >= x_ij (u_i continuous, exactly max_j x_ij at the optimum).
* Units. The objective is in milliseconds. With the patent's typical weights (w_c = 1,
  w_q1 = 10, w_q2 = 1, w_q3 = 10000) w_c is ms per device used, w_q1 multiplies the jitter in
  ms, w_q3 * PLR^2 is ms (1% loss: 1 ms per crossing; 10%: 100 ms).
* E_p. The patent's 0.3 turns a *nominal* link rate into goodput. The probe measures goodput
  through ggml-rpc itself, so the default here is E_p = 1; use 0.3 with nominal rates.
* t. The patent's O / (E_p B) plus, where the client's kernel restarts a window after an idle
  link (Linux with CUBIC or Reno: restarts_after_idle; the probe records the settings), the round
  trips of TCP slow start for the prompt's transfers: on a 30 ms link a 128 KiB activation takes 3
  extra round trips (tcp_initial_window=0 gives the patent's t alone); BBR keeps its window, and a
  prompt after 8 s of idle took as long as one after 0.05 s; and on a lossy link, each segment's chance of
  loss times its recovery, loss_recovery_rtts round trips (Linux's tail-loss probe fires after 2
  smoothed round trips; a fast retransmit takes about one).
* Compute. eps_ij = FLOPs_j / FLOPS_i counts block j's weight matmuls only. With the blocks timed
  in the model's real graph on the client (timing.py, `ModelCost.times`; `oallama distribute` does
  it by default), eps_ij is block j's real time there scaled by the client's and device i's probed
  matmul speeds, and the client's part of a pass is its measured time outside the blocks (on the
  project's VM the FLOP model left out 40% of a token).
* Stages. A request is a prefill of n_prompt tokens and n_gen - 1 single-token decodes; FLOPs and
  activation bytes of each block come from the graphs llama.cpp builds at both sizes, and the
  objective weighs the stages as a request does ("e2e"), or takes one ("prefill", "decode").
* Contiguity (option, on by default): each device is entered at most once,
  x_i0 + sum_j sum_k!=i w_jki <= 1. llama.cpp places a layer's KV cache and attention by its layer split,
  which gives each device one contiguous range; only a contiguous plan runs with the KV cache
  beside its weights (see DistPlan.load_kwargs).

Solvers (all return the same optimum; the tests compare them with brute force):

* HiGHS (highspy) on the formulation above ("assignment"), or on the equivalent "segments"
  formulation (default for the MILP): y_iab = 1 iff device i holds exactly blocks a..b as one
  run, x_ij = sum of the runs of i covering j; a plan is a path through the block boundaries,
  each run pays its compute, entry and exit, runs that exceed their device's memory are never
  generated, and per-device memory rows keep the LP relaxation tight.
* An exact dynamic program over (block boundary, set of devices used), for the contiguous
  variant with up to ~15 devices: tens of milliseconds for 80 blocks x 8 devices, where HiGHS
  takes 0.2-4 s to prove optimality. method="auto" (default) uses it when it applies and
  HiGHS otherwise; HiGHS runs seeded with its optimum (a feasible plan for both variants).

An infeasible instance raises InfeasiblePlanError naming the binding constraint (a block that
fits nowhere, block 0 on device 0, total memory, contiguity, packing).

    >>> cluster = read_devices("devices.json")
    >>> plan = plan_model("model.gguf", cluster, DistOptions(beta=0.9))
    >>> plan.write("plan.json")                         # Llama(path, placement="plan.json")
    >>> llm = load(plan, n_ctx=2048)                    # + layer split: KV beside the weights
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._files import read_json
from ..errors import PlanError
from ..options import option
from ..runtime import planfile

DEVICES_SCHEMA = "oallama.devices/1"
PLAN_SCHEMA = planfile.DISTPLAN_SCHEMA
CLIENT = "CPU"  # the client device: embedding, output head, and everything not in a block
OBJECTIVES = ("e2e", "prefill", "decode")
METHODS = ("auto", "milp", "dp")
FORMULATIONS = ("segments", "assignment")


# --- cluster: the devices file ---------------------------------------------------------------


def _flops_table(raw: Any, where: str) -> dict[int, float]:
    """{"1": 2.1e9, "64": 9.5e9} or a single number -> {tokens: FLOP/s}."""
    if isinstance(raw, int | float):
        table = {1: float(raw)}
    elif isinstance(raw, Mapping) and raw:
        try:
            table = {int(k): float(v) for k, v in raw.items()}
        except (TypeError, ValueError):
            raise PlanError(f"{where}: 'flops' must map token counts to FLOP/s, got {raw!r}") from None
    else:
        raise PlanError(f"{where}: 'flops' must be a number or a mapping tokens -> FLOP/s")
    if any(v <= 0 or not math.isfinite(v) for v in table.values()):
        raise PlanError(f"{where}: FLOP/s must be positive, got {table}")
    return table


def flops_at(table: Mapping[int, float], n_tokens: int) -> float:
    """FLOP/s at n_tokens columns: log-linear between the measured token counts, clamped."""
    keys = sorted(table)
    if n_tokens <= keys[0]:
        return table[keys[0]]
    if n_tokens >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in itertools.pairwise(keys):
        if lo <= n_tokens <= hi:
            w = (math.log(n_tokens) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return math.exp((1 - w) * math.log(table[lo]) + w * math.log(table[hi]))
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class LinkSpec:
    """The link between the client and one device."""

    latency_s: float  # one-way delay of a small message (s): half the measured round trip
    bandwidth_up_Bps: float  # client -> device goodput (bytes/s)
    bandwidth_down_Bps: float  # device -> client goodput (bytes/s)
    jitter_s: float = 0.0  # max - min delay of the fixed-size payloads (s)
    loss: float = 0.0  # packet loss rate (fraction, 0..1)


@dataclass(frozen=True)
class DeviceSpec:
    name: str  # oallama device name, "RPC[host:port]"
    memory_bytes: int  # free memory the device offers (bytes)
    flops: dict[int, float]  # tokens -> sustained FLOP/s of a matmul with that many columns
    link: LinkSpec

    def flops_at(self, n_tokens: int) -> float:
        return flops_at(self.flops, n_tokens)


@dataclass(frozen=True)
class Cluster:
    """The client and its devices; device 0 (block 0's device) is the first of the file."""

    devices: list[DeviceSpec]
    client_flops: dict[int, float]  # tokens -> FLOP/s of the client (output head)
    source: str = "<memory>"
    matmul: tuple[int, int] = (4096, 4096)  # [k, m] of the q8_0 matmul the devices' FLOP/s are of
    # whether a connection's window restarts from TCP's initial window after an idle link (the
    # client kernel's settings, see restarts_after_idle; the devices' kernels are taken as the same)
    idle_restart: bool = True

    def device(self, name: str) -> DeviceSpec:
        for d in self.devices:
            if d.name == name:
                return d
        raise PlanError(f"{self.source}: no device named {name}")


def restarts_after_idle(tcp: Mapping[str, Any]) -> bool:
    """Whether a kernel with these TCP settings ({"congestion_control": ..., "slow_start_after_idle":
    0/1}, as the probe records them) restarts a connection's window after an idle longer than its
    retransmission timeout (RFC 2861). Linux does (tcp_slow_start_after_idle_check) only with
    net.ipv4.tcp_slow_start_after_idle = 1 and a congestion control without a cong_control of its
    own: CUBIC and Reno restart, BBR does not (it keeps its window and paces at its bandwidth
    estimate; on the project's VM, BBR's default, a request's TTFT over a 31-ms link was the same
    after 0.05 and 8 s of idle: bench/results/2026-11-24-vm-distributed/experiments). Unknown
    settings: True, the assumption that costs more."""
    cc = str(tcp.get("congestion_control", ""))
    return int(tcp.get("slow_start_after_idle", 1)) != 0 and not cc.startswith("bbr")


def parse_devices(doc: Mapping[str, Any], source: str = "<devices>") -> Cluster:
    """A devices document (schema oallama.devices/1) -> Cluster; PlanError on any defect."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("devices"), list) or not doc["devices"]:
        raise PlanError(f"{source}: expected a JSON object with a non-empty 'devices' list")
    schema = doc.get("schema", DEVICES_SCHEMA)
    if schema != DEVICES_SCHEMA:
        raise PlanError(f"{source}: schema '{schema}', expected '{DEVICES_SCHEMA}'")
    out: list[DeviceSpec] = []
    for k, d in enumerate(doc["devices"]):
        where = f"{source}: devices[{k}]"
        try:
            name = str(d["name"])
            link = d.get("link", {})
            both = link.get("bandwidth_Bps")
            up = float(link.get("bandwidth_up_Bps", both if both is not None else math.inf))
            down = float(link.get("bandwidth_down_Bps", both if both is not None else math.inf))
            lat = float(link["latency_s"]) if "latency_s" in link else float(link.get("rtt_s", 0.0)) / 2
            spec = DeviceSpec(
                name=name,
                memory_bytes=int(d["memory_free"]),
                flops=_flops_table(d["flops"], where),
                link=LinkSpec(lat, up, down, float(link.get("jitter_s", 0.0)), float(link.get("loss", 0.0))),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"{where}: missing or bad field ({e}); need name, memory_free, flops, link") from None
        ln = spec.link
        if spec.memory_bytes < 0 or ln.latency_s < 0 or ln.jitter_s < 0 or not 0 <= ln.loss < 1 \
                or ln.bandwidth_up_Bps <= 0 or ln.bandwidth_down_Bps <= 0:
            raise PlanError(f"{where} ({name}): memory, latency and jitter must be >= 0, bandwidths > 0 "
                            f"and loss in [0, 1)")
        out.append(spec)
    names = [d.name for d in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise PlanError(f"{source}: device {dup} is listed twice")
    client = doc.get("client", {})
    if not isinstance(client, Mapping):
        raise PlanError(f"{source}: 'client' must be an object (with 'flops'), not {client!r}")
    client_flops = _flops_table(client["flops"], f"{source}: client") if "flops" in client else {1: math.inf}
    tcp = client.get("tcp", {})
    if not isinstance(tcp, Mapping):
        raise PlanError(f"{source}: client.tcp must be an object (congestion_control, slow_start_after_idle), "
                        f"not {tcp!r}")
    try:
        idle_restart = restarts_after_idle(tcp)
    except (TypeError, ValueError):
        raise PlanError(f"{source}: client.tcp.slow_start_after_idle must be 0 or 1, "
                        f"not {tcp.get('slow_start_after_idle')!r}") from None
    shapes = {(int(d["matmul"]["k"]), int(d["matmul"]["m"])) for d in doc["devices"]
              if isinstance(d.get("matmul"), Mapping) and "k" in d["matmul"] and "m" in d["matmul"]}
    if len(shapes) > 1:
        raise PlanError(f"{source}: devices were probed with different matmuls {sorted(shapes)}: probe them together")
    return Cluster(out, client_flops, source, *shapes, idle_restart=idle_restart)


def read_devices(path: str | Path) -> Cluster:
    doc = read_json(path, "devices file", PlanError, "write one with `oallama probe HOST:PORT ...`")
    return parse_devices(doc, str(path))


# --- the model: blocks, their FLOPs, bytes and activations -----------------------------------


@dataclass(frozen=True)
class Block:
    """One decoder block (sub-model j)."""

    index: int
    tensors: tuple[str, ...]
    weight_bytes: int  # bytes
    kv_bytes: int  # bytes of its KV cache at the planned context
    flops: dict[int, int]  # tokens -> FLOPs of its weight-bearing matmuls (llama.cpp's graph)
    act_in_bytes: dict[int, int]  # tokens -> bytes of the activation entering the block

    @property
    def memory_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


@dataclass(frozen=True)
class BlockTimes:
    """The model's real graph timed on the client, every block there (cluster/timing.py): what
    the FLOP count of the weight matmuls cannot see (attention, norms, rope, copies into the KV
    cache, glue; the matmuls' real speed; the pass's time outside the blocks)."""

    threads: int  # client threads the passes ran with
    block_us: dict[int, tuple[float, ...]]  # tokens -> per block: its nodes' time in a real pass (us)
    rest_us: dict[int, float]  # tokens -> the pass outside its blocks: embedding, output head, graph
    # build, inputs, logits back, sampling the token (us)
    matmul_flops: dict[int, float]  # tokens -> FLOP/s of the probe's matmul on the client at `threads`:
    # a device runs a block in block_us x matmul_flops / its own probed FLOP/s
    n_past: int = 0  # KV cells before the timed 1-token pass
    # what running the blocks on an rpc-server adds beyond their time, the link's latency and the
    # activations' transfers (every block on a loopback one, passes alternated with the CPU's):
    # tokens -> us per block (its nodes serialised and sent, the inputs each pass sets)
    rpc_block_us: dict[int, float] = field(default_factory=dict)
    # tokens -> bytes a visit of a device sends (receives) beyond the activation entering (leaving)
    # its blocks: positions, the attention mask, the graph when llama.cpp builds it anew, commands
    # (counted on the loopback connection, TCP_INFO); a prompt's last activation comes back whole
    visit_bytes_up: dict[int, float] = field(default_factory=dict)
    visit_bytes_down: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "n_past": self.n_past,
                "block_us": {str(n): list(v) for n, v in self.block_us.items()},
                "rest_us": {str(n): v for n, v in self.rest_us.items()},
                "matmul_flops": {str(n): v for n, v in self.matmul_flops.items()},
                "rpc_block_us": {str(n): v for n, v in self.rpc_block_us.items()},
                "visit_bytes_up": {str(n): v for n, v in self.visit_bytes_up.items()},
                "visit_bytes_down": {str(n): v for n, v in self.visit_bytes_down.items()}}


@dataclass(frozen=True)
class ModelCost:
    path: str
    name: str
    identity: str
    blocks: list[Block]
    head_flops: dict[int, int]  # tokens -> FLOPs on the client (output head; logits of the last token)
    out_bytes: dict[int, int]  # tokens -> bytes of the last block's output (what the head reads)
    client_tensors: tuple[str, ...]  # weights that stay on the client
    n_ctx: int
    times: BlockTimes | None = None  # real-graph times (timing.calibrate); None: the FLOP model

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def block_ms(self, j: int, tokens: int, device: DeviceSpec) -> float:
        """Block j's compute on `device` in a pass of `tokens` tokens (ms): its real-graph time
        on the client scaled by the two's probed matmul speeds, or (uncalibrated) its weight
        matmuls' FLOPs at the device's FLOP/s."""
        if self.times is None:
            return self.blocks[j].flops[tokens] / device.flops_at(tokens) * 1e3
        return (self._times_at(tokens)[j] * flops_at(self.times.matmul_flops, tokens) / device.flops_at(tokens)
                + self.times.rpc_block_us.get(tokens, 0.0)) / 1e3

    def visit_bytes(self, tokens: int) -> tuple[float, float]:
        """(up, down) bytes a visit of a device moves beyond the activations (0 uncalibrated)."""
        if self.times is None:
            return 0.0, 0.0
        return self.times.visit_bytes_up.get(tokens, 0.0), self.times.visit_bytes_down.get(tokens, 0.0)

    def client_s(self, tokens: int, client_flops: Mapping[int, float]) -> float:
        """The client's part of a pass (s): measured (the pass outside its blocks), or the output
        head's FLOPs at the client's FLOP/s."""
        if self.times is None:
            return self.head_flops[tokens] / flops_at(client_flops, 1) if self.head_flops[tokens] else 0.0
        self._times_at(tokens)
        return self.times.rest_us[tokens] / 1e6

    def _times_at(self, tokens: int) -> tuple[float, ...]:
        assert self.times is not None
        got = self.times.block_us.get(tokens)
        if got is None or tokens not in self.times.rest_us:
            raise PlanError(f"{self.path}: its blocks were timed in passes of {sorted(self.times.block_us)} tokens, "
                            f"not {tokens}: calibrate with n_prompt={tokens}")
        if len(got) != self.n_blocks:
            raise PlanError(f"{self.path}: {len(got)} block times for {self.n_blocks} blocks")
        return got


def model_cost(path: str | Path, tokens: Sequence[int] = (1, 64), *, n_ctx: int = 2048) -> ModelCost:
    """Per-block FLOPs, bytes and activations from the graphs llama.cpp builds for the model
    (a metadata-only load: weights are not read). KV bytes are llama.cpp's own context memory
    at n_ctx, shared evenly by the blocks."""
    from ..planner.graph import GraphSession, layer_of, target_ops

    sizes = sorted({int(n) for n in tokens} | {1})
    with GraphSession(path, devices=[], n_ctx=max(n_ctx, max(sizes)), n_ubatch=max(sizes)) as s:
        info = s.model
        graphs = {n: s.graph(n) for n in sizes}
        kv_total = sum(m.context for m in s.memory())
    n_layer = int(info.hparam("block_count", 0))
    if n_layer <= 0:
        raise PlanError(f"{info.path}: model has no decoder blocks ({info.architecture}.block_count)")
    by_layer: dict[int, list[str]] = {j: [] for j in range(n_layer)}
    client: list[str] = []
    for t in info.tensors:
        layer = layer_of(t.name)
        (by_layer[layer] if layer is not None and layer in by_layer else client).append(t.name)
    flops = {j: dict.fromkeys(sizes, 0) for j in range(n_layer)}
    act_in: dict[int, dict[int, int]] = {j: {} for j in range(n_layer)}
    head = dict.fromkeys(sizes, 0)
    out_bytes: dict[int, int] = {}
    for n, g in graphs.items():
        for op in target_ops(g):
            if op.layer is None or op.layer not in flops:
                head[n] += op.flops
                out_bytes.setdefault(n, op.act_in_bytes)
                continue
            flops[op.layer][n] += op.flops
            act_in[op.layer].setdefault(n, op.act_in_bytes)  # first op of the block reads its input
    for j in range(n_layer):
        for n in sizes:
            if n not in act_in[j]:
                raise PlanError(f"{info.path}: block {j} has no weight-bearing op in llama.cpp's graph")
    for n in sizes:
        out_bytes.setdefault(n, act_in[n_layer - 1][n])
    kv_each = kv_total // n_layer
    blocks = [Block(j, tuple(by_layer[j]), sum(info.tensor(t).nbytes for t in by_layer[j]), kv_each,
                    flops[j], act_in[j]) for j in range(n_layer)]
    name = str(info.metadata.get("general.name", info.path.stem))
    return ModelCost(str(info.path), name, info.identity(), blocks, head, out_bytes, tuple(client), n_ctx)


# --- options and the problem -----------------------------------------------------------------


@dataclass(frozen=True)
class DistOptions:
    """The assignment's parameters; also the flags of `oallama distribute` (see `options`)."""

    beta: float = option(0.9, help="share of each device's free memory the blocks may use (weights + KV cache)")
    contiguous: bool = option(True, help="each device holds one range of blocks (needed for KV beside weights)")
    w_c: float = option(1.0, help="complexity weight: ms per device taking part")
    w_q1: float = option(10.0, help="QoS weight of jitter (ms) per crossing")
    w_q2: float = option(1.0, help="QoS weight of transfer time (ms) x loss rate per crossing")
    w_q3: float = option(10000.0, help="QoS weight of loss rate squared, ms per crossing")
    protocol_efficiency: float = option(1.0, flag="--ep", help="protocol efficiency E_p: 1 for measured goodput, "
                                        "the patent's 0.3 for nominal rates")
    loss_recovery_rtts: float = option(2.0, help="round trips a lost TCP segment delays its message (expected "
                                       "delay per crossing: segments x loss rate x this x round trip)")
    tcp_initial_window: int = option(10, flag="--tcp-iw", help="TCP initial window (segments) for the slow-start "
                                     "term of t (see transfer_s), where the client's kernel restarts the window "
                                     "after an idle (CUBIC, Reno; not BBR); 0: the patent's t")
    objective: str = option("e2e", choices=OBJECTIVES, help="what to minimise: e2e = prefill + (n_gen - 1) "
                            "decodes, or one stage")
    n_prompt: int = option(64, help="prompt tokens of a request (prefill stage)")
    n_gen: int = option(32, help="generated tokens of a request")
    n_ctx: int = option(2048, flag="--ctx", help="context the KV cache is sized for (memory constraint)")
    method: str = option("auto", choices=METHODS, help="auto (DP for contiguous, else HiGHS), milp (HiGHS), dp "
                         "(exact, contiguous only): same optimum")
    formulation: str = option("segments", choices=FORMULATIONS, help="of the MILP: runs of blocks (segments) or "
                              "x_ij (assignment)")
    time_limit_s: float = option(60.0, flag="--time-limit", help="solver time limit, s")
    mip_rel_gap: float = 1e-6  # HiGHS's relative MIP gap

    def __post_init__(self) -> None:
        if not 0 < self.beta <= 1:
            raise PlanError(f"beta must be in (0, 1], got {self.beta}")
        if self.objective not in OBJECTIVES:
            raise PlanError(f"objective must be one of {', '.join(OBJECTIVES)}, got '{self.objective}'")
        if not 0 < self.protocol_efficiency <= 1:
            raise PlanError(f"protocol efficiency E_p must be in (0, 1], got {self.protocol_efficiency}")
        if min(self.w_c, self.w_q1, self.w_q2, self.w_q3) < 0:
            raise PlanError("penalty weights must be >= 0")
        if self.method not in METHODS:
            raise PlanError(f"method must be one of {', '.join(METHODS)}, got '{self.method}'")
        if self.formulation not in FORMULATIONS:
            raise PlanError(f"formulation must be one of {', '.join(FORMULATIONS)}, got '{self.formulation}'")
        if self.loss_recovery_rtts < 0:
            raise PlanError("loss_recovery_rtts must be >= 0 (0: losses cost nothing)")
        if self.tcp_initial_window < 0:
            raise PlanError("tcp_initial_window must be >= 0 (0: no slow-start term)")
        if self.n_prompt < 1 or self.n_gen < 1 or self.n_ctx < 1:
            raise PlanError("n_prompt, n_gen and n_ctx must be >= 1")

    def stages(self) -> list[tuple[int, float]]:
        """(tokens per pass, passes per request) the objective weighs."""
        if self.objective == "prefill":
            return [(self.n_prompt, 1.0)]
        if self.objective == "decode":
            return [(1, 1.0)]
        out = [(self.n_prompt, 1.0)]
        if self.n_gen > 1:
            out.append((1, float(self.n_gen - 1)))
        return out


@dataclass
class Problem:
    """The numbers the MILP sees (ms and bytes), m devices x n blocks.

    entry[i, j]: moving block j's input from the client onto device i; exit[i, j]: returning
    block j's output from device i to the client. A change of device between j-1 and j costs
    exit[a, j-1] + entry[b, j]; block 0 always pays entry, the last block always pays exit.
    """

    devices: list[str]
    compute: np.ndarray  # [m, n] ms
    entry: np.ndarray  # [m, n] ms (latency + transfer)
    exit: np.ndarray  # [m, n] ms
    entry_qos: np.ndarray  # [m, n] ms
    exit_qos: np.ndarray  # [m, n] ms
    memory: np.ndarray  # [n] bytes per block
    capacity: np.ndarray  # [m] bytes per device (beta x free)
    w_c: float  # ms per device used
    contiguous: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.compute.shape  # type: ignore[return-value]


@dataclass(frozen=True)
class Terms:
    """The objective's parts for one assignment (ms)."""

    compute: float
    data: float
    complexity: float
    qos: float

    @property
    def total(self) -> float:
        return self.compute + self.data + self.complexity + self.qos


TCP_MSS = 1448  # bytes of payload per TCP segment on a 1500-byte MTU


def transfer_s(nbytes: float, bandwidth_Bps: float, rtt_s: float, opts: DistOptions, loss: float = 0.0, *,
               cold: bool = True) -> float:
    """t of the patent, O / (E_p B), plus (cold, with tcp_initial_window > 0) the round trips TCP's
    slow start adds: a request's prompt, after an idle link, sends its large activations in
    windows of IW, 2 IW, 4 IW ... segments, one round trip each; the first round is the latency
    already counted (a decode's messages repeat every token: its window has grown to them); plus,
    over a link losing `loss` of its segments, the expected recovery of each (loss_recovery_rtts
    round trips). Seconds."""
    t = nbytes / (opts.protocol_efficiency * bandwidth_Bps)
    segments = math.ceil(nbytes / TCP_MSS)
    if cold and opts.tcp_initial_window > 0 and nbytes > 0:
        rounds = math.ceil(math.log2(segments / opts.tcp_initial_window + 1))
        t += max(rounds - 1, 0) * rtt_s
    return t + segments * loss * opts.loss_recovery_rtts * rtt_s


def build_problem(cost: ModelCost, cluster: Cluster, opts: DistOptions) -> Problem:
    m, n = len(cluster.devices), cost.n_blocks
    shape = (m, n)
    compute, entry, exit_, entry_q, exit_q = (np.zeros(shape) for _ in range(5))
    for tokens, weight in opts.stages():
        for i, d in enumerate(cluster.devices):
            ln = d.link
            qos_fixed = opts.w_q1 * ln.jitter_s * 1e3 + opts.w_q3 * ln.loss**2  # ms
            for j, b in enumerate(cost.blocks):
                compute[i, j] += weight * cost.block_ms(j, tokens, d)
                extra_up, extra_down = cost.visit_bytes(tokens)
                o_in = b.act_in_bytes[tokens] + extra_up
                o_out = (cost.blocks[j + 1].act_in_bytes[tokens] if j + 1 < n else cost.out_bytes[tokens]) + extra_down
                # the prompt's pass, the first of a request after an idle link: slow start again
                # where the kernel restarts the window
                cold = tokens > 1 and cluster.idle_restart
                t_up = transfer_s(o_in, ln.bandwidth_up_Bps, 2 * ln.latency_s, opts, ln.loss, cold=cold) * 1e3  # ms
                t_down = transfer_s(o_out, ln.bandwidth_down_Bps, 2 * ln.latency_s, opts, ln.loss, cold=cold) * 1e3
                entry[i, j] += weight * (ln.latency_s * 1e3 + t_up)
                exit_[i, j] += weight * (ln.latency_s * 1e3 + t_down)
                entry_q[i, j] += weight * (qos_fixed + opts.w_q2 * t_up * ln.loss)
                exit_q[i, j] += weight * (qos_fixed + opts.w_q2 * t_down * ln.loss)
    memory = np.array([b.memory_bytes for b in cost.blocks], dtype=float)
    capacity = np.array([opts.beta * d.memory_bytes for d in cluster.devices], dtype=float)
    return Problem([d.name for d in cluster.devices], compute, entry, exit_, entry_q, exit_q, memory, capacity,
                   opts.w_c, opts.contiguous)


def evaluate(p: Problem, assign: Sequence[int]) -> Terms:
    """The objective of an assignment (block j -> device index), computed directly from the
    crossings it makes; independent of the MILP's matrices (the tests compare the two)."""
    a = list(assign)
    n = len(a)
    compute = float(sum(p.compute[a[j], j] for j in range(n)))
    data = p.entry[a[0], 0] + p.exit[a[-1], n - 1]
    qos = p.entry_qos[a[0], 0] + p.exit_qos[a[-1], n - 1]
    for j in range(1, n):
        if a[j] != a[j - 1]:
            data += p.exit[a[j - 1], j - 1] + p.entry[a[j], j]
            qos += p.exit_qos[a[j - 1], j - 1] + p.entry_qos[a[j], j]
    return Terms(compute, float(data), p.w_c * len(set(a)), float(qos))


def violation(p: Problem, assign: Sequence[int]) -> str | None:
    """Which constraint an assignment breaks (None: feasible)."""
    a = list(assign)
    if a[0] != 0:
        return f"block 0 is on device {a[0]} ({p.devices[a[0]]}), not device 0"
    for i in range(len(p.devices)):
        used = float(sum(p.memory[j] for j in range(len(a)) if a[j] == i))
        if used > p.capacity[i] * (1 + 1e-9):
            return f"device {p.devices[i]} holds {used / 2**20:.1f} MiB > {p.capacity[i] / 2**20:.1f} MiB"
    if p.contiguous:
        seen: set[int] = set()
        for j, d in enumerate(a):
            if d in seen and a[j - 1] != d:
                return f"device {p.devices[d]} holds non-contiguous blocks (again at block {j})"
            seen.add(d)
    return None


def brute_force(p: Problem, max_assignments: int = 2_000_000) -> tuple[list[int], Terms] | None:
    """The optimum by enumeration (small instances, for tests); None if infeasible."""
    m, n = p.shape
    if m ** (n - 1) > max_assignments:
        raise PlanError(f"brute force over {m}^{n - 1} assignments is too many")
    best: tuple[list[int], Terms] | None = None
    for rest in itertools.product(range(m), repeat=n - 1):
        a = [0, *rest]
        if violation(p, a) is not None:
            continue
        t = evaluate(p, a)
        if best is None or t.total < best[1].total - 1e-12:
            best = (a, t)
    return best


# --- baselines: llama.cpp's layer split -------------------------------------------------------


def layer_split(n_blocks: int, weights: Sequence[float]) -> list[int]:
    """The device index llama.cpp gives each block for `tensor_split` = weights with all layers
    offloaded (llama_model::load_tensors: layer il -> first device whose cumulative share
    exceeds il / (n_layer + 1); the output layer is layer n_layer)."""
    total = float(sum(weights))
    if total <= 0:
        raise PlanError("layer split needs positive weights")
    splits, acc = [], 0.0
    for w in weights:
        acc += float(w)
        splits.append(np.float32(acc) / np.float32(total))
    out = []
    for il in range(n_blocks):
        frac = np.float32(il) / np.float32(n_blocks + 1)
        out.append(min(next((k for k, s in enumerate(splits) if s > frac), len(splits) - 1), len(weights) - 1))
    return out


def baseline(strategy: str, cost: ModelCost, cluster: Cluster) -> list[int]:
    """"memory": llama.cpp's default (shares proportional to free memory); "equal": equal shares."""
    if strategy == "memory":
        return layer_split(cost.n_blocks, [d.memory_bytes for d in cluster.devices])
    if strategy == "equal":
        return layer_split(cost.n_blocks, [1.0] * len(cluster.devices))
    raise PlanError(f"unknown baseline '{strategy}' (memory or equal)")


def _segments(assign: Sequence[int]) -> list[tuple[int, int, int]]:
    """(device index, first block, last block) of each run of consecutive blocks."""
    out: list[tuple[int, int, int]] = []
    for j, d in enumerate(assign):
        if out and out[-1][0] == d:
            out[-1] = (d, out[-1][1], j)
        else:
            out.append((d, j, j))
    return out
