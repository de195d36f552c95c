"""A distributed plan: blocks -> rpc-server devices as a plan file that oallama.Llama loads,
the stock llama.cpp command it corresponds to, and the `oallama distribute` command."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InfeasiblePlanError, PlanError
from ..model import gguf_file
from ..options import add_arguments, from_args, group, option
from ..runtime import devices as devmod
from ..runtime import planfile
from .problem import (
    CLIENT,
    PLAN_SCHEMA,
    Block,
    Cluster,
    DeviceSpec,
    DistOptions,
    LinkSpec,
    ModelCost,
    Terms,
    _segments,
    baseline,
    build_problem,
    evaluate,
    model_cost,
    read_devices,
    violation,
)
from .solver import Solution, memory_shortfall, solve

STRATEGIES = ("milp", "memory", "equal")  # the MILP, or a baseline split (see problem.baseline)

# --- prediction ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Modelled latencies of a plan: the physical part of the objective (no penalties)."""

    ttft_s: float  # prompt of n_prompt tokens in -> first token out (s)
    tpot_s: float  # per further token (s)
    e2e_s: float  # ttft + (n_gen - 1) tpot (s)
    stages: dict[str, dict[str, float]]  # "prefill"/"decode" -> compute_s, transfer_s, client_s


def predict(cost: ModelCost, cluster: Cluster, assign: Sequence[int], opts: DistOptions) -> Prediction:
    out: dict[str, dict[str, float]] = {}
    for label, tokens in (("prefill", opts.n_prompt), ("decode", 1)):
        stage_opts = replace(opts, objective="decode" if tokens == 1 else "prefill", w_c=0.0, w_q1=0.0, w_q2=0.0,
                             w_q3=0.0)
        p = build_problem(cost, cluster, stage_opts)
        t = evaluate(p, assign)
        client = cost.client_s(tokens, cluster.client_flops)
        out[label] = {"compute_s": t.compute / 1e3, "transfer_s": t.data / 1e3, "client_s": client,
                      "total_s": (t.compute + t.data) / 1e3 + client}
    ttft, tpot = out["prefill"]["total_s"], out["decode"]["total_s"]
    return Prediction(ttft, tpot, ttft + (opts.n_gen - 1) * tpot, out)



# --- the plan --------------------------------------------------------------------------------


@dataclass
class DistPlan:
    """An assignment of the model's blocks to devices, with what it predicts."""

    cost: ModelCost
    cluster: Cluster
    assign: list[int]  # block j -> device index in cluster.devices
    options: DistOptions
    strategy: str = "milp"  # "milp" | "memory" | "equal"
    solution: Solution | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def block_devices(self) -> list[str]:
        return [self.cluster.devices[i].name for i in self.assign]

    def segments(self) -> list[tuple[str, int, int]]:
        return [(self.cluster.devices[d].name, a, b) for d, a, b in _segments(self.assign)]

    @property
    def contiguous(self) -> bool:
        devs = [d for d, _, _ in self.segments()]
        return len(devs) == len(set(devs))

    def pipeline_devices(self) -> list[str]:
        """Devices in the order the pipeline visits them first."""
        return list(dict.fromkeys(self.block_devices))

    def placement(self) -> dict[str, str]:
        """Every weight -> device: a block's weights on its device, the rest on the client."""
        out = dict.fromkeys(self.cost.client_tensors, CLIENT)
        for b, dev in zip(self.cost.blocks, self.block_devices, strict=True):
            out.update(dict.fromkeys(b.tensors, dev))
        return out

    def tensor_split(self) -> list[float] | None:
        """Blocks per pipeline device (+1 on the last for the output layer, whose weights the
        placement keeps on the client): llama.cpp's layer split then gives every block, and its
        KV cache, the plan's device. None for a non-contiguous plan."""
        if not self.contiguous:
            return None
        counts = [float(b - a + 1) for _, a, b in self.segments()]
        counts[-1] += 1.0
        return counts

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of oallama.Llama that run this plan."""
        kw: dict[str, Any] = {"devices": [CLIENT, *self.pipeline_devices()], "placement": self.placement()}
        split = self.tensor_split()
        if split is not None:
            kw["n_gpu_layers"] = self.cost.n_blocks + 1
            kw["tensor_split"] = split
        return kw

    def objective_terms(self) -> Terms:
        return evaluate(build_problem(self.cost, self.cluster, self.options), self.assign)

    def predicted(self) -> Prediction:
        return predict(self.cost, self.cluster, self.assign, self.options)

    def memory_per_device(self) -> dict[str, int]:
        out = {d.name: 0 for d in self.cluster.devices}
        for b, dev in zip(self.cost.blocks, self.block_devices, strict=True):
            out[dev] += b.memory_bytes
        return out

    def fits(self) -> str | None:
        """None, or the memory/contiguity constraint this plan breaks (baselines may)."""
        p = build_problem(self.cost, self.cluster, replace(self.options, contiguous=False))
        return violation(p, self.assign)

    def emit(self, binary: str = "llama-server") -> list[str]:
        """The equivalent stock llama.cpp command line (rpc devices named as stock names them:
        RPC0, RPC1, ... in --rpc order, one device per server)."""
        from ..runtime.devices import parse_endpoint
        from ..runtime.place import compile_patterns

        pipeline = self.pipeline_devices()
        endpoints: list[str] = []
        bufts: dict[str, str] = {CLIENT: "CPU"}
        for name in pipeline:
            ep, index = _rpc_parts(name)
            parse_endpoint(ep)
            endpoints.append(ep)
            bufts[name] = f"RPC{index}[{ep}]"
        cmd = [binary, "-m", self.cost.path, "--rpc", ",".join(dict.fromkeys(endpoints)),
               "--device", ",".join(f"RPC{k}" for k in range(len(pipeline)))]
        split = self.tensor_split()
        if split is not None:
            cmd += ["-ngl", "999", "--tensor-split", ",".join(f"{c:g}" for c in split)]
        for pattern, dev in compile_patterns(self.placement()):
            cmd += ["-ot", f"{pattern}={bufts[dev]}"]
        return cmd

    def to_json(self) -> dict[str, Any]:
        pred = self.predicted()
        terms = self.objective_terms()
        doc: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "model": {"path": self.cost.path, "name": self.cost.name, "identity": self.cost.identity,
                      "n_blocks": self.cost.n_blocks},
            "devices": [CLIENT, *self.pipeline_devices()],
            "placement": self.placement(),
            "load": {k: v for k, v in self.load_kwargs().items() if k not in ("devices", "placement")},
            "assignment": {
                "strategy": self.strategy,
                "device0": self.cluster.devices[0].name,
                "blocks": self.block_devices,
                "segments": [{"device": d, "first": a, "last": b} for d, a, b in self.segments()],
                "memory_bytes": self.memory_per_device(),
            },
            "predicted": {
                "ttft_s": pred.ttft_s, "tpot_s": pred.tpot_s, "e2e_s": pred.e2e_s, "stages": pred.stages,
                "objective_ms": terms.total,
                "terms_ms": {"T_compute": terms.compute, "T_data": terms.data,
                             "T_complexity": terms.complexity, "T_QoS": terms.qos},
            },
            "options": asdict(self.options),
            "block_times": self.cost.times.to_json() if self.cost.times is not None else None,
            "devices_file": self.cluster.source,
            "formulation": FORMULATION,
            "notes": self.notes,
        }
        if self.solution is not None:
            s = self.solution
            doc["solver"] = {"method": s.method, "status": s.status, "time_s": s.time_s, "mip_gap": s.mip_gap,
                             "variables": s.n_vars, "constraints": s.n_rows}
        return doc

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return p

    def summary(self) -> str:
        pred = self.predicted()
        terms = self.objective_terms()
        mem = self.memory_per_device()
        lines = [f"{self.strategy} plan for {Path(self.cost.path).name}: {self.cost.n_blocks} blocks on "
                 f"{len(self.pipeline_devices())} of {len(self.cluster.devices)} devices"]
        for d, a, b in self.segments():
            lines.append(f"  blocks {a:>3}-{b:<3} -> {d}")
        for d in self.cluster.devices:
            lines.append(f"  {d.name:<28} {mem[d.name] / 2**20:9.1f} MiB of {d.memory_bytes / 2**20:9.1f} MiB free")
        t = self.cost.times
        lines.append(f"compute: blocks timed in the real graph on the client ({t.threads} thread(s)), scaled by each "
                     "device's probed FLOP/s" if t is not None else "compute: FLOPs of the weight matmuls at each "
                     "device's probed FLOP/s (blocks not timed)")
        lines.append(f"objective {terms.total:.2f} ms = compute {terms.compute:.2f} + data {terms.data:.2f} + "
                     f"complexity {terms.complexity:.2f} + QoS {terms.qos:.2f}")
        lines.append(f"predicted TTFT {pred.ttft_s * 1e3:.1f} ms ({self.options.n_prompt} tokens), "
                     f"TPOT {pred.tpot_s * 1e3:.2f} ms, e2e {pred.e2e_s:.3f} s ({self.options.n_gen} tokens)")
        if self.solution is not None:
            sol = self.solution
            size = f"{sol.n_vars} states" if sol.method == "dp" else \
                f"HiGHS, {sol.n_vars} variables, {sol.n_rows} constraints"
            lines.append(f"solver {sol.method}: {sol.status} in {sol.time_s * 1e3:.0f} ms ({size})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


FORMULATION = (
    "patent seed 004 MILP: min T_compute + T_data + T_complexity + T_QoS (ms); transfers and QoS "
    "penalties counted per link crossing (client->block 0, each device change between consecutive "
    "blocks = exit over the old device's link + entry over the new one's, last block->client), "
    "the product x_i,j-1 x_k,j linearised by w_jik with sum_k w_jik = x_i,j-1, sum_i w_jik = x_k,j; "
    "t = O/(E_p B) + TCP slow-start round trips where the kernel restarts an idle window; complexity = w_c per "
    "device used; memory "
    "sum_j (weights_j + KV_j) x_ij <= beta free_i; block 0 on device 0 (first device of the devices "
    "file); optional contiguity (each device entered at most once)"
)


def _rpc_parts(name: str) -> tuple[str, int]:
    """'RPC[host:port]#k' -> ('host:port', k)."""
    if not (name.startswith("RPC[") and "]" in name):
        raise PlanError(f"device {name} is not an rpc-server device (RPC[host:port])")
    ep, _, rest = name[4:].partition("]")
    index = int(rest[1:]) if rest.startswith("#") and rest[1:].isdigit() else 0
    return ep, index


def synthetic_instance(n_blocks: int, n_devices: int, seed: int = 0, *, memory_slack: float = 1.6,
                       uniform: bool = False) -> tuple[ModelCost, Cluster]:
    """A random but plausible instance (8B-like blocks, phone-to-desktop devices, links from LAN
    to a lossy Wi-Fi), for tests and solver benchmarks. Total device memory is about
    memory_slack x what the blocks need. uniform: identical blocks, as in a real model's
    stack; otherwise block sizes vary by +-20% (mixed quantisations)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for j in range(n_blocks):
        w = int((1.0 if uniform else rng.uniform(0.8, 1.2)) * 200 * 2**20)  # bytes
        blocks.append(Block(j, (f"blk.{j}.w",), w, 16 * 2**20, {1: int(w * 2.1), 64: int(w * 2.1 * 64)},
                            {1: 16384, 64: 16384 * 64}))
    need = sum(b.memory_bytes for b in blocks)
    share = rng.uniform(0.5, 1.5, n_devices)
    devices = []
    for i in range(n_devices):
        gflops = rng.uniform(5, 200)
        devices.append(DeviceSpec(
            f"RPC[10.0.{i}.2:50052]", int(need * memory_slack * share[i] / share.sum() / 0.9),
            {1: gflops * 0.2e9, 64: gflops * 1e9},
            LinkSpec(latency_s=rng.uniform(0.0002, 0.02), bandwidth_up_Bps=rng.uniform(2e6, 120e6),
                     bandwidth_down_Bps=rng.uniform(2e6, 120e6), jitter_s=rng.uniform(0, 0.01),
                     loss=float(rng.choice([0.0, 0.0, 0.001, 0.02]))),
        ))
    cost = ModelCost("synthetic.gguf", "synthetic", "0" * 64, blocks, {1: 10**9, 64: 10**9},
                     {1: 16384, 64: 16384}, ("token_embd.weight", "output.weight"), 2048)
    return cost, Cluster(devices, {1: 50e9, 64: 200e9}, "<synthetic>")


def plan(cost: ModelCost, cluster: Cluster, opts: DistOptions | None = None) -> DistPlan:
    """The MILP plan for a model's blocks on a cluster."""
    opts = opts or DistOptions()
    sol = solve(build_problem(cost, cluster, opts), method=opts.method, formulation=opts.formulation,
                time_limit_s=opts.time_limit_s, mip_rel_gap=opts.mip_rel_gap)
    notes = []
    if sol.status != "Optimal":
        notes.append(f"HiGHS stopped at '{sol.status}' (relative gap {sol.mip_gap:.2g}): best plan found so far")
    out = DistPlan(cost, cluster, sol.assign, opts, "milp", sol, notes)
    if not out.contiguous:
        out.notes.append("non-contiguous plan: llama.cpp's layer split cannot give a device two ranges, so it "
                         "loads with per-tensor placement only and the KV cache stays on the client")
    return out


def baseline_plan(strategy: str, cost: ModelCost, cluster: Cluster, opts: DistOptions | None = None) -> DistPlan:
    opts = opts or DistOptions()
    out = DistPlan(cost, cluster, baseline(strategy, cost, cluster), opts, strategy)
    bad = out.fits()
    if bad:
        out.notes.append(f"does not fit: {bad}")
    return out


def plan_model(model: str | Path, cluster: Cluster, opts: DistOptions | None = None, *,
               strategy: str = "milp", time_threads: int | None = None) -> DistPlan:
    """The plan of a model file; with time_threads, its blocks timed in the real graph on this
    machine's CPU first (timing.calibrate) instead of costed by FLOPs."""
    opts = opts or DistOptions()
    cost = model_cost(model, (1, opts.n_prompt), n_ctx=opts.n_ctx)
    if time_threads is not None:
        from .timing import calibrate

        short = memory_shortfall(build_problem(cost, cluster, opts))
        if short is not None:  # before the blocks are timed (seconds to minutes): memory needs no timing
            raise InfeasiblePlanError(f"no feasible plan: {short}")
        cost = calibrate(cost, threads=time_threads, n_prompt=opts.n_prompt, matmul=cluster.matmul)
    return plan(cost, cluster, opts) if strategy == "milp" else baseline_plan(strategy, cost, cluster, opts)


def read_plan(path: str | Path, model: gguf_file.GGUFInfo | None = None) -> dict[str, Any]:
    """A distributed plan file's JSON, checked: schema, fields, and (given the model) that it
    was made for it."""
    doc = planfile.read_document(path, model, schema=PLAN_SCHEMA)
    if not isinstance(doc.get("model"), dict) or not isinstance(doc.get("devices"), list):
        raise PlanError(f"{path}: a distributed plan needs 'model' and 'devices'")
    return doc


def load(plan_or_path: DistPlan | str | Path, model_path: str | Path | None = None, **llama_kw: Any) -> Any:
    """oallama.Llama running a plan: devices, per-tensor placement, and the layer split that
    puts each block's KV cache on its device (a plan file's "load" section)."""
    from ..runtime.llama import Llama

    if isinstance(plan_or_path, DistPlan):
        kw = plan_or_path.load_kwargs()
        path = Path(model_path or plan_or_path.cost.path)
    else:
        doc = read_plan(plan_or_path)
        path = Path(model_path or doc["model"]["path"])
        read_plan(plan_or_path, gguf_file.read(path))
        kw = {"devices": list(doc["devices"]), "placement": dict(doc["placement"]), **doc.get("load", {})}
    return Llama(str(path), **{**kw, **llama_kw})


# --- CLI ------------------------------------------------------------------------------------


@dataclass
class DistributeOptions:
    """Everything `oallama distribute` takes: the model, the devices, the assignment's parameters
    (`DistOptions`) and what to do with the plan. Its flags are generated from these fields."""

    model: Path = option(positional=True, help="GGUF model file")
    devices: Path = option(help="devices file written by `oallama probe`")
    output: Path | None = option(None, short="-o", help="write the plan here (loadable by Llama(..., "
                                 "placement=FILE))")
    strategy: str = option("milp", choices=STRATEGIES, help="milp, or a baseline: llama.cpp's memory-proportional "
                           "split (memory), equal split (equal)")
    options: DistOptions = group(DistOptions)
    emit: bool = option(False, help="print the equivalent stock llama.cpp command")
    emit_binary: str = option("llama-server", help="binary named by --emit")
    run: bool = option(False, help="load the plan and generate, timing TTFT/TPOT")
    prompt: str = option("The quick brown fox jumps over the lazy dog", short="-p", help="prompt of --run")
    threads: int | None = option(None, minimum=1, help="client threads", default_help="llama-cpp-python's")
    time_blocks: bool = option(True, help="time the model's blocks in its real graph on this machine's CPU and "
                               "scale them to each device by its probed FLOP/s (skipped when the model file is "
                               "larger than the available memory); off: FLOPs of the weight matmuls only")
    verbose: bool = option(False, help="show llama.cpp's log")


def _cmd_distribute(args: argparse.Namespace) -> int:
    a = from_args(DistributeOptions, args)
    cluster = read_devices(a.devices)
    opts = a.options
    print(f"planning {Path(a.model).name} on {len(cluster.devices)} devices from {a.devices} ...",
          file=sys.stderr)
    threads = a.threads or max((os.cpu_count() or 2) // 2, 1)  # llama-cpp-python's default
    time_threads = None
    if a.time_blocks:
        size, avail = Path(a.model).stat().st_size, devmod.host_available_bytes()
        if avail is not None and size > avail:
            print(f"not timing the blocks: {Path(a.model).name} ({size / 2**30:.1f} GiB) is larger than the "
                  f"available memory ({avail / 2**30:.1f} GiB); FLOPs of the weight matmuls only", file=sys.stderr)
        else:
            time_threads = threads
    result = plan_model(a.model, cluster, opts, strategy=a.strategy, time_threads=time_threads)
    print(result.summary())
    if a.output:
        result.write(a.output)
        print(f"wrote {a.output}  (oallama run {a.model} --placement {a.output}; "
              f"or oallama.cluster.load('{a.output}'))", file=sys.stderr)
    if a.emit:
        print(shlex.join(result.emit(a.emit_binary)))
    if a.run:
        from ..runtime.generate import placement_table, timed_generate

        llm = load(result, n_ctx=max(opts.n_ctx, opts.n_prompt + opts.n_gen + 8), n_threads=a.threads,
                   n_threads_batch=a.threads, verbose=a.verbose)
        print(placement_table(llm.tensor_placements(), [CLIENT, *result.pipeline_devices()]))
        gen = timed_generate(llm, a.prompt, opts.n_gen)
        pred = result.predicted()
        print(f"measured TTFT {gen.ttft_s * 1e3:.1f} ms ({gen.prompt_tokens} tokens), TPOT {gen.tpot_s * 1e3:.2f} ms;"
              f" predicted TTFT {pred.ttft_s * 1e3:.1f} ms ({opts.n_prompt} tokens), TPOT {pred.tpot_s * 1e3:.2f} ms")
        print(f"output: {gen.text!r}")
        llm.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distribute", help="assign a model's blocks to rpc-server devices (MILP, patent seed 004)")
    add_arguments(p, DistributeOptions)
    p.set_defaults(func=_cmd_distribute)
