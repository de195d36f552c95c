#!/usr/bin/env python3
"""Weaver ablation on one GPU: what an offloaded decode-attention task waits for on a busy
receiver, and what polling costs the receiver's own ("cold") model.

Needs a CUDA GPU and oallama built with its kernels (OALLAMA_KERNELS=ON scripts/setup.sh).

The cold model is its decode kernel sequence, emulated: for each layer, one memory-bound kernel
per weight matrix (q, k, v, o, gate, up, down of the chosen shape, f16) that streams the weight's
bytes, which is what a decode GEMV costs (``--passes`` re-reads it, for the longer kernels of a
prefill or a large batch). The hot model is a sender on a second, higher-priority stream of the
same process (a single GPU cannot host two processes without time-slicing them), posting one
sequence's decode attention (GQA, ``--ctx`` tokens of context) at a random moment of the cold
model's step. Modes:

  (a) cpu      the receiver's queue holds the cold step; the CPU submits the attention (one poll
               kernel) when the task arrives: it runs behind every queued kernel
  (b) poll     a polling kernel after every cold kernel (Weaver's GPU-driven control flow)
  (c) split    (b) + operator splitting (oallama.splitting.plan_splits on the measured op times)

Reported per mode: the sender-observed latency (post kernel start to wait kernel end, CUDA
events on the sender's stream: p50/p90/p99/mean, microseconds) and the cold model's time per
token with and without the polling kernels (its per-token overhead). Results go to JSON and
Markdown, named by the device.

    python bench/scripts/bench_weaver.py --layers 32 --samples 200 --out bench/weaver
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# cold-model shapes (n_embd, n_ff, n_head, n_head_kv, head_dim): the weights a decode reads
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "llama3-3b": (3072, 8192, 24, 8, 128),
    "qwen2-7b": (3584, 18944, 28, 4, 128),
}


@dataclass
class ColdOp:
    name: str
    offset: int  # bytes into the weight buffer
    bytes: int
    rows: int  # output features (the split dimension)


def cold_ops(shape: str, layers: int) -> list[ColdOp]:
    n_embd, n_ff, n_head, n_kv, hd = SHAPES[shape]
    mats = [("attn_q", n_embd, n_head * hd), ("attn_k", n_embd, n_kv * hd), ("attn_v", n_embd, n_kv * hd),
            ("attn_output", n_head * hd, n_embd), ("ffn_gate", n_embd, n_ff), ("ffn_up", n_embd, n_ff),
            ("ffn_down", n_ff, n_embd)]
    ops, offset = [], 0
    for layer in range(layers):
        for name, cols, rows in mats:
            nbytes = cols * rows * 2  # f16
            ops.append(ColdOp(f"blk.{layer}.{name}", offset, nbytes, rows))
            offset += nbytes
    return ops


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99),
            "mean": statistics.fmean(xs) if xs else float("nan"), "max": max(xs) if xs else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cold-shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=32, help="cold model layers (weights: ~0.44 GB/layer for 8b)")
    ap.add_argument("--passes", type=int, default=1, help="reads per cold kernel (longer kernels)")
    ap.add_argument("--hot-heads", type=int, nargs=3, default=(32, 8, 128), metavar=("N_HEAD", "N_KV", "HEAD_DIM"))
    ap.add_argument("--dtype", choices=("f16", "bf16"), default="f16")
    ap.add_argument("--ctx", type=int, default=2048, help="context of the offloaded sequence")
    ap.add_argument("--max-tasks", type=int, default=4, help="tasks per polling kernel")
    ap.add_argument("--samples", type=int, default=200, help="tasks per mode")
    ap.add_argument("--reps", type=int, default=20, help="cold steps timed per mode (overhead)")
    ap.add_argument("--sender-attention-us", type=float, default=None,
                    help="K: the sender's own attention time (default: the isolated offload latency)")
    ap.add_argument("--sender-iteration-ms", type=float, default=25.0,
                    help="the sender's iteration time; the split threshold is 5%% of it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/weaver"), help="output prefix (.json, .md added)")
    args = ap.parse_args(argv)

    from oallama.errors import BuildConfigError
    from oallama.weaver import cuda as weaver_cuda
    from oallama.weaver import host as weaver
    from oallama.weaver.splitting import ReceiverOp, plan_splits

    try:
        cu = weaver_cuda.require_cuda()
    except BuildConfigError as e:
        print(f"bench_weaver: {e}", file=sys.stderr)
        return 2
    if cu.device_count() == 0:
        print("bench_weaver: no CUDA device", file=sys.stderr)
        return 2
    info = cu.device_info(args.device)
    rng = np.random.default_rng(args.seed)
    n_head, n_kv, hd = args.hot_heads
    ops = cold_ops(args.cold_shape, args.layers)
    total_bytes = ops[-1].offset + ops[-1].bytes
    print(f"bench_weaver: {info['name']}: cold model {args.cold_shape} x {args.layers} layers "
          f"({total_bytes / 2**30:.1f} GiB of weights), offload {n_head}/{n_kv}x{hd} {args.dtype} ctx {args.ctx}")

    cold = cu.ColdOps(args.device, total_bytes)
    rx_stream = cu.stream_create(args.device, 0)
    tx_stream = cu.stream_create(args.device, -100)  # clamped to the highest priority
    ev = [cu.event_create() for _ in range(4)]
    rx = weaver_cuda.CudaReceiver(n_head=n_head, n_head_kv=n_kv, head_dim=hd, max_seqs=1, max_ctx=args.ctx + 1,
                             dtype=args.dtype, max_tasks=args.max_tasks, device=args.device, stream=rx_stream,
                             checksum=False)
    tx = weaver_cuda.CudaSender(rx, device=args.device, stream=tx_stream, max_outstanding=4, timeout=30.0)
    rx.load_kv(0, rng.standard_normal((args.ctx, n_kv, hd)).astype(np.float32),
               rng.standard_normal((args.ctx, n_kv, hd)).astype(np.float32))
    q_ptr, k_ptr, v_ptr, out_ptr = tx.staging(0)
    for ptr, shape in ((q_ptr, (n_head, hd)), (k_ptr, (n_kv, hd)), (v_ptr, (n_kv, hd))):
        cu.copy_to_device(ptr, weaver.to_storage(rng.standard_normal(shape).astype(np.float32), args.dtype))

    def timed(enqueue: Any, stream: int) -> float:
        cu.event_record(ev[0], stream)
        enqueue()
        cu.event_record(ev[1], stream)
        return cu.event_elapsed_ms(ev[0], ev[1]) * 1e3  # us

    def step(pieces: list[tuple[int, int]], polls: bool) -> None:
        for offset, nbytes in pieces:
            cold.launch(offset, nbytes, rx_stream, args.passes)
            if polls:
                rx.poll()

    def offload_once(cpu_submit: bool, step_done: int | None) -> float:
        """Posts one task now; returns the sender-observed latency (us)."""
        cu.event_record(ev[2], tx_stream)
        h = tx.post_ptr(0, args.ctx, q_ptr, k_ptr, v_ptr, stream=tx_stream)
        if cpu_submit:
            rx.poll()  # lands behind whatever the receiver's stream holds
        tx.wait_ptr(h, out_ptr, stream=tx_stream)
        cu.event_record(ev[3], tx_stream)
        # an idle receiver (its step is over) polls from the host until the task is served
        while not cu.event_query(ev[3]):
            if step_done is None or cu.event_query(step_done):
                rx.poll()
                cu.stream_synchronize(rx_stream)
            else:
                time.sleep(20e-6)
        lat = cu.event_elapsed_ms(ev[2], ev[3]) * 1e3
        tx.check(h)
        return lat

    # 1. op times, one at a time (medians of 5), and the isolated offload latency
    whole = [(op.offset, op.bytes) for op in ops]
    step(whole, False)
    cu.stream_synchronize(rx_stream)
    op_us = [statistics.median(timed(lambda o=op: cold.launch(o.offset, o.bytes, rx_stream, args.passes),
                                     rx_stream) for _ in range(5)) for op in ops]
    isolated = [offload_once(False, None) for _ in range(20)]
    n_us = statistics.median(isolated)
    k_us = args.sender_attention_us if args.sender_attention_us is not None else n_us
    plan = plan_splits([ReceiverOp.parametric(op.name, t, op.rows) for op, t in zip(ops, op_us, strict=True)],
                       sender_attention_time=k_us, offloaded_time=n_us,
                       threshold=0.05 * args.sender_iteration_ms * 1e3)
    split: list[tuple[int, int]] = []
    for piece in plan.pieces:
        op = ops[piece.index]
        row_bytes = op.bytes // op.rows
        split.append((op.offset + piece.start * row_bytes, piece.size * row_bytes))
    modes = {"cpu": (whole, False, True), "poll": (whole, True, False), "split": (split, True, False)}

    # 2. the cold model's time per token: plain, and with each mode's kernels (no tasks)
    step_us = {"plain": [timed(lambda: step(whole, False), rx_stream) for _ in range(args.reps)]}
    for name, (pieces, polls, _) in modes.items():
        step_us[name] = [timed(lambda p=pieces, pl=polls: step(p, pl), rx_stream) for _ in range(args.reps)]
    step_med = {k: statistics.median(v) for k, v in step_us.items()}

    # 3. sender-observed latency: the task lands at a random moment of a cold step
    latency: dict[str, list[float]] = {}
    done_ev = cu.event_create()
    for name, (pieces, polls, cpu_submit) in modes.items():
        lats = []
        for _ in range(args.samples):
            step(pieces, polls)
            cu.event_record(done_ev, rx_stream)
            time.sleep(rng.uniform(0, 0.9) * step_med["plain"] * 1e-6)
            lats.append(offload_once(cpu_submit, done_ev))
            cu.stream_synchronize(rx_stream)
        latency[name] = lats
        print(f"  {name:5s}: latency p50 {pct(lats, 50):9.1f} us  p99 {pct(lats, 99):9.1f} us   "
              f"cold step {step_med[name] / 1e3:7.3f} ms (plain {step_med['plain'] / 1e3:.3f} ms)")

    result = {
        "device": info, "platform": platform.platform(), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                                  for k, v in vars(args).items()},
        "cold_kernels_per_token": {"plain": len(whole), "cpu": len(whole) + 1, "poll": 2 * len(whole),
                                   "split": 2 * len(split)},
        "isolated_offload_us": summary(isolated),
        "latency_us": {k: summary(v) for k, v in latency.items()},
        "cold_step_us": {k: summary(v) for k, v in step_us.items()},
        "cold_overhead_us_per_token": {k: step_med[k] - step_med["plain"] for k in modes},
        "plan": {"K_us": k_us, "N_us": n_us, "threshold_us": plan.threshold, "splits": plan.splits,
                 "wait_before_us": plan.wait_before, "wait_after_us": plan.wait_after, "reason": plan.reason},
        "receiver_stats": rx.stats(),
    }
    tag = "".join(c if c.isalnum() else "-" for c in info["name"]).strip("-").lower()
    out_json = args.out.with_name(f"{args.out.name}-{tag}.json")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Weaver ablation on {info['name']}", "",
             f"cold model: {args.cold_shape} x {args.layers} layers, passes {args.passes}; offloaded attention: "
             f"{n_head}/{n_kv} heads x {hd}, {args.dtype}, ctx {args.ctx}; {args.samples} tasks per mode", "",
             "| mode | latency p50 (us) | p90 | p99 | mean | cold ms/token | overhead ms/token | kernels/token |",
             "|---|---|---|---|---|---|---|---|"]
    for name in modes:
        s = result["latency_us"][name]
        lines.append(f"| {name} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['mean']:.1f} | "
                     f"{step_med[name] / 1e3:.3f} | {(step_med[name] - step_med['plain']) / 1e3:.3f} | "
                     f"{result['cold_kernels_per_token'][name]} |")
    lines += ["", f"plain cold step: {step_med['plain'] / 1e3:.3f} ms; isolated offload: {n_us:.1f} us; "
              f"splitting: {plan.splits} splits, estimated wait {plan.wait_before:.1f} -> {plan.wait_after:.1f} us "
              f"({plan.reason})"]
    out_md = out_json.with_suffix(".md")
    out_md.write_text("\n".join(lines) + "\n")
    print(f"bench_weaver: wrote {out_json} and {out_md}")

    tx.close()
    rx.close()
    for e in [*ev, done_ev]:
        cu.event_destroy(e)
    cu.stream_destroy(tx_stream)
    cu.stream_destroy(rx_stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
