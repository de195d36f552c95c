"""The model's blocks timed in its real graph, for the distributed planner's compute term.

The FLOP model (weight matmuls' FLOPs at a device's probed matmul speed) leaves out every other
op of a block (attention, norms, rope, copies into the KV cache, glue), the matmuls' speed in
the real graph, and the pass's time outside the blocks (embedding, output head, graph build,
logits back, sampling): on the project's VM it predicted 7.2 ms of a 12.0 ms token. Here the
client runs the model's real graph, every block on its CPU, with the scheduler's eval callback
(`_core.NodeTimer`) stopping at each change of layer, in the two passes a request makes (a
prompt of n_prompt tokens, then 1-token decodes after it):

  block_us[n][j]  the time of block j's nodes (us);
  rest_us[n]      the pass's wall time less its blocks, plus sampling the token as the
                  generation loop samples (outside.sample_us);
  matmul_flops[n] the probe's matmul at the same threads, measured as the probe measures a device:
                  through an rpc-server of this machine (loopback, started here).

The CPU passes are timed in ROUNDS rounds seconds apart and each pass kept from the round of its
median wall time, as the single-machine calibration keeps them (`planner.cost.rounds`): the project's VM
runs 1.4x slower for seconds at a time, and the fastest round is biased low (the generation runs
through the slow phases too). Running the
blocks on an rpc-server costs more than their time, the link's latency and the activations'
transfers (the graph sent, the inputs set: +45 us a block in decode for the `mid` model on this
VM's loopback): a child process times runs of passes with every block on a loopback rpc-server
alternated with runs on the CPU, and the median difference, less the loopback link's terms, is
charged per block placed on any device (`rpc_block_us`). The same child counts the bytes a pass
moves on llama.cpp's connection (TCP_INFO): what a visit moves beyond the activations
(`visit_bytes_up` / `_down`: positions, the attention mask, a prompt's graph; a prompt's last
activation comes back whole).

A device runs block j in block_us x matmul_flops / (its probed FLOP/s) + rpc_block_us: the block's real work in
the client's time, scaled by how fast the device ran the same matmul (exact for devices like the
client, the project's emulated ones; an estimate for a different kind of device, whose
non-matmul ops scale as its matmuls do). Both sides are measured alike: the blocks' weights in
the plain layout an rpc-server holds them in (llama.cpp would repack them on the client's CPU), the
matmul through an rpc-server (the client's own op profiler ran the same matmul 20-60% slower than
back-to-back recomputes on an rpc-server of the same machine). The pass needs the model's weights
on the client, read through mmap: `oallama distribute` times them when the file fits in the
client's available memory.

    >>> cost = model_cost("model.gguf", (1, 64))
    >>> cost = calibrate(cost, threads=4, n_prompt=64)        # cost.times: BlockTimes
    >>> plan(cost, read_devices("devices.json"))
"""

from __future__ import annotations

import json
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from .. import _core
from ..errors import OallamaError, PlanError
from .problem import BlockTimes, ModelCost

MIN_REPS = 5  # timed passes per size, at least
REPS_S = 1.0  # ... and more of them while they take under this long (s), at most 4x
ROUNDS = 3  # the CPU passes timed this many times, seconds apart (each pass's median round kept)
ALTERNATIONS = 5  # runs of CPU passes and of rpc passes, alternated (the median difference kept)


def _stops(nodes: list[_core.NodeTime]) -> list[tuple[int, int | None]]:
    """(position, layer) of the last node of each run of nodes of one layer (None: no layer)."""
    from ..planner.graph import node_layer

    layers = [node_layer(r.name) for r in nodes]
    return [(nodes[k].index, layers[k]) for k in range(len(nodes))
            if k == len(nodes) - 1 or layers[k + 1] != layers[k]]


def _time_pass(llm: Any, timer: _core.NodeTimer, tokens: list[int], n: int, n_past: int,
               n_blocks: int) -> tuple[list[float], float]:
    """Per block: median us of its nodes; and the median wall time of the eval (us)."""
    from ..planner.cost.realpass import timed_eval

    prefix, batch = tokens[:n_past], tokens[n_past:n_past + n]
    first = timed_eval(llm, timer, prefix, batch, [])  # node by node: where the layers change (and a warm-up)
    stops = _stops(first.nodes)
    positions = [k for k, _ in stops]
    runs = [timed_eval(llm, timer, prefix, batch, positions) for _ in range(MIN_REPS)]
    more = int(REPS_S / max(statistics.median(r.wall_us for r in runs) / 1e6, 1e-6))
    runs += [timed_eval(llm, timer, prefix, batch, positions) for _ in range(min(more, 3 * MIN_REPS))]
    per_block: list[list[float]] = [[] for _ in range(n_blocks)]
    for run in runs:
        at = {r.index: r.range_us for r in run.nodes}
        sums = [0.0] * n_blocks
        for k, layer in stops:
            if layer is not None and 0 <= layer < n_blocks:
                sums[layer] += at.get(k, 0.0)
        for j in range(n_blocks):
            per_block[j].append(sums[j])
    missing = [j for j in range(n_blocks) if not any(per_block[j])]
    if missing:
        raise PlanError(f"{llm.model_path}: blocks {missing} have no node in llama.cpp's graph of {n} tokens")
    return [statistics.median(v) for v in per_block], statistics.median(r.wall_us for r in runs)


def _rpc_child(req: dict[str, Any]) -> dict[str, Any]:
    """In a child process (ggml keeps an rpc-server a model was loaded on registered for the
    process's life, and aborts on a later device listing once it is gone): an rpc-server on
    loopback with the client's threads; the probe's matmul on it (as `oallama probe` measures a
    device); then the model twice, every block on the CPU (plain layout) and every block on the
    server, and runs of their passes alternated (the machine's speed changes for seconds at a
    time): per pass size, the median of the runs' differences rpc - CPU (us)."""
    from ..planner.cost.realpass import timed_eval
    from ..runtime import rpc
    from ..runtime.generate import prompt_tokens
    from ..runtime.llama import Llama
    from .probe import ProbeOptions, probe_device

    threads, n_prompt, path = int(req["threads"]), int(req["n_prompt"]), str(req["path"])
    blocks: list[list[str]] = req["blocks"]
    opts = ProbeOptions(matmul_k=req["matmul"][0], matmul_m=req["matmul"][1], tokens=tuple(req["sizes"]), samples=3,
                        rtt_samples=10, warmup=1, payload_bytes=2**16, compute_target_s=0.2)
    kw = {"n_ctx": int(req["n_ctx"]), "n_batch": max(n_prompt, 32), "n_ubatch": max(n_prompt, 32),
          "n_threads": threads, "n_threads_batch": threads, "verbose": False}
    out: dict[str, Any] = {"extra_us": {}, "walls_us": {}}
    with rpc.start_server(threads=threads) as srv:
        dev = probe_device(srv.endpoint, opts)[0]
        out["link"] = dev["link"]
        flops = [dev["flops"]]
        on_cpu = {t: "CPU" for b in blocks for t in b}
        n = len(blocks)
        # loads as a plan loads (DistPlan.load_kwargs): the layer split offloads the output layer too
        # (the placement keeps its weights on the CPU); with n_gpu_layers = k the output layer's
        # inputs cross back and llama.cpp rebuilds the decode graph each pass (+560 KB a decode sent)
        cpu = Llama(path, devices=["CPU"], n_gpu_layers=0, layouts=on_cpu, **kw)
        far = Llama(path, devices=["CPU", srv.device_name], placement=dict.fromkeys(on_cpu, srv.device_name),
                    n_gpu_layers=n + 1, tensor_split=[1.0], **kw)
        try:
            toks = prompt_tokens(cpu, n_prompt + 1)
            # the bytes a pass sends and receives: the activations in and out, and what else a visit
            # of the device takes (positions, the attention mask, the graph when llama.cpp builds it
            # anew, commands)
            out["bytes"] = {str(size): _pass_bytes(far, srv.endpoint, toks, size, n_prompt) for size in req["sizes"]}
            for size in sorted(req["sizes"], reverse=True):
                prefix, batch = (toks[:n_prompt], toks[n_prompt:n_prompt + 1]) if size == 1 else ([], toks[:size])
                # runs of passes alternated (the rpc load's passes back to back, as a generation runs
                # them), the machine's speed changing between runs rather than within one
                diffs, walls = [], []
                for _ in range(ALTERNATIONS):
                    c = [timed_eval(cpu, None, prefix, batch, []).wall_us for _ in range(MIN_REPS + 1)][1:]
                    f = [timed_eval(far, None, prefix, batch, []).wall_us for _ in range(MIN_REPS + 1)][1:]
                    diffs.append(statistics.median(f) - statistics.median(c))
                    walls.append((statistics.median(c), statistics.median(f)))
                out["extra_us"][str(size)] = statistics.median(diffs)
                out["walls_us"][str(size)] = walls
        finally:
            far.close()
            cpu.close()
        # the matmul again, seconds later: the mean of the two (a slow moment on one side of the
        # ratio scales every block, halved)
        flops.append(probe_device(srv.endpoint, opts)[0]["flops"])
        out["flops"] = {k: statistics.fmean(f[k] for f in flops) for k in flops[0]}
    return out


def _tcp_bytes(endpoint: str) -> tuple[int, int]:
    """(sent and acknowledged, received) bytes of this process's connections to `endpoint`
    (llama.cpp's own sockets, found among our descriptors; Linux TCP_INFO)."""
    import os
    import socket

    host, _, port = endpoint.rpartition(":")
    sent = received = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(fd))) as sock:
                if sock.family != socket.AF_INET or sock.getpeername() != (host, int(port)):
                    continue
                raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            continue
        acked, got = struct.unpack_from("<QQ", raw, 120)  # tcpi_bytes_acked, tcpi_bytes_received
        sent, received = sent + acked, received + got
    return sent, received


def _pass_bytes(llm: Any, endpoint: str, toks: list[int], size: int, n_prompt: int, reps: int = 3) -> list[float]:
    """[up, down] bytes of one pass of `size` tokens (a decode after the n_prompt-token prompt)."""
    from ..planner.cost.realpass import sync

    prefix, batch = (toks[:n_prompt], toks[n_prompt:n_prompt + 1]) if size == 1 else ([], toks[:size])
    llm.reset()
    if prefix:
        llm.eval(prefix)
    counts = []
    for _ in range(reps + 1):  # the first pass builds the graph
        llm.n_tokens = len(prefix)
        llm.eval(batch)
        sync(llm)
        time.sleep(0.05)  # the last segments acknowledged
        counts.append(_tcp_bytes(endpoint))
    return [(counts[-1][0] - counts[0][0]) / reps, (counts[-1][1] - counts[0][1]) / reps]


def _run_child(req: dict[str, Any]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "oallama.cluster.timing"], input=json.dumps(req), text=True,
                       capture_output=True, timeout=1800)
    if r.returncode != 0:
        tail = (r.stderr or "").strip().splitlines()[-3:]
        raise PlanError(f"timing the blocks of {req['path']} on a loopback rpc-server failed (exit {r.returncode}): "
                        + " / ".join(tail))
    return json.loads(r.stdout.strip().splitlines()[-1])


def calibrate(cost: ModelCost, *, threads: int, n_prompt: int, matmul: tuple[int, int] = (4096, 4096),
              progress: bool = True) -> ModelCost:
    """`cost` with its blocks' real-graph times (`ModelCost.times`), measured on this machine's
    CPU with `threads` threads in a prompt pass of n_prompt tokens and a decode pass after it;
    `matmul`: the [k, m] of the devices' probe (devices file, "matmul")."""
    from ..planner.cost.outside import sample_us
    from ..runtime.generate import prompt_tokens
    from ..runtime.llama import Llama

    t0 = time.perf_counter()
    sizes = sorted({1, n_prompt})

    def say(msg: str) -> None:
        if progress:
            print(f"\rtime blocks: {msg}".ljust(90), end="", file=sys.stderr, flush=True)

    say(f"loading {cost.path} on the CPU ({threads} thread(s))")
    n_ctx = max(cost.n_ctx, 2 * n_prompt + 8)
    try:
        plain = {t: "CPU" for b in cost.blocks for t in b.tensors}  # as an rpc-server holds them
        llm = Llama(cost.path, devices=["CPU"], n_gpu_layers=0, n_ctx=n_ctx, n_batch=max(n_prompt, 32),
                    n_ubatch=max(n_prompt, 32), n_threads=threads, n_threads_batch=threads, layouts=plain,
                    verbose=False)
    except (OallamaError, ValueError, RuntimeError) as e:
        raise PlanError(f"timing the blocks of {cost.path}: could not load it on the CPU: {e}") from None
    req = {"path": cost.path, "threads": threads, "n_prompt": n_prompt, "n_ctx": n_ctx, "sizes": sizes,
           "matmul": list(matmul), "blocks": [list(b.tensors) for b in cost.blocks]}
    rounds: list[tuple[dict[int, tuple[float, ...]], dict[int, float]]] = []
    child: dict[str, Any] = {}
    try:
        tokens = prompt_tokens(llm, n_prompt + 1)
        for k in range(ROUNDS):
            if k == min(1, ROUNDS - 1):  # between the rounds, so that they lie seconds apart
                say(f"the probe's {matmul[0]}x{matmul[1]} matmul and every block on a loopback rpc-server")
                child = _run_child(req)
            block_us: dict[int, tuple[float, ...]] = {}
            walls: dict[int, float] = {}
            with _core.NodeTimer(llm.native_context) as timer:
                for n in sorted(sizes, reverse=True):  # the prompt's pass, then a decode after it
                    say(f"round {k + 1}/{ROUNDS}: {'prompt' if n > 1 else 'decode'} pass of {n} token(s)")
                    blocks, wall = _time_pass(llm, timer, tokens, n, n_prompt if n == 1 else 0, cost.n_blocks)
                    block_us[n], walls[n] = tuple(blocks), wall
            rounds.append((block_us, walls))
        sample = sample_us(llm, MIN_REPS)  # the logits are the last eval's
    finally:
        llm.close()
    # each pass from the round of its median wall (the slower middle one of an even number)
    kept = {n: sorted(rounds, key=lambda r: r[1][n])[len(rounds) // 2] for n in sizes}
    block_us = {n: kept[n][0][n] for n in sizes}
    walls = {n: kept[n][1][n] for n in sizes}
    rest_us = {n: max(walls[n] - sum(block_us[n]), 0.0) + sample for n in sizes}
    flops = {int(k): float(v) for k, v in child["flops"].items()}
    link = child["link"]
    rpc_block_us: dict[int, float] = {}
    for size in sizes:
        # what the rpc pass adds to the CPU pass less what the model charges for it: the link's
        # latency each way and the activations' transfers (the blocks run at the client's time
        # there: the server is this CPU, and its matmul speed the client's); per block
        xfer = (cost.blocks[0].act_in_bytes[size] / link["bandwidth_up_Bps"]
                + cost.out_bytes[size] / link["bandwidth_down_Bps"] + link["rtt_s"]) * 1e6
        rpc_block_us[size] = max(child["extra_us"][str(size)] - xfer, 0.0) / cost.n_blocks
    up, down = ({size: max(child["bytes"][str(size)][0] - cost.blocks[0].act_in_bytes[size], 0.0) for size in sizes},
                {size: max(child["bytes"][str(size)][1] - cost.out_bytes[size], 0.0) for size in sizes})
    times = BlockTimes(threads, block_us, rest_us, flops, n_past=n_prompt, rpc_block_us=rpc_block_us,
                       visit_bytes_up=up, visit_bytes_down=down)
    if progress:
        print(f"\rtime blocks: {cost.n_blocks} blocks, decode {sum(block_us[1]) / 1e3:.2f} ms + "
              f"{rest_us[1] / 1e3:.2f} ms outside them, prompt {sum(block_us[n_prompt]) / 1e3:.1f} ms + "
              f"{rest_us[n_prompt] / 1e3:.1f} ms ({time.perf_counter() - t0:.1f} s)".ljust(90), file=sys.stderr)
    return replace(cost, times=times)


if __name__ == "__main__":  # the rpc-server part of calibrate(), in its own process (see _rpc_child)
    print(json.dumps(_rpc_child(json.loads(sys.stdin.read()))))
