"""Run: generate with a placed model and time it (TTFT, TPOT), and the `oallama run` command.

TTFT is the time from submitting the prompt to holding the first sampled token: prompt
evaluation plus one sampling step (sampling reads the logits, which synchronises every backend).
TPOT is the mean time per further token: one single-token decode plus sampling.
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PlacementError
from ..model import gguf_file
from ..options import add_arguments, from_args, group, option
from . import kvcache, planfile
from .planfile import ConfirmOptions
from .rpc import RPC_TIMEOUT_S


@dataclass
class Generation:
    prompt_tokens: int
    tokens: list[int]
    text: str
    ttft_s: float  # seconds, prompt in -> first token out
    token_times_s: list[float] = field(default_factory=list)  # seconds since start, per token

    @property
    def tpot_s(self) -> float:
        """Mean seconds per output token after the first (nan with fewer than 2 tokens)."""
        gaps = [b - a for a, b in zip(self.token_times_s, self.token_times_s[1:], strict=False)]
        return statistics.fmean(gaps) if gaps else float("nan")

    @property
    def e2e_s(self) -> float:
        return self.token_times_s[-1] if self.token_times_s else 0.0


_PROMPT_TEXT = ("The history of computing is a history of moving data to where the arithmetic happens. "
                "Every generation of hardware changes which operations are cheap and which are slow, "
                "and the software that decides where each piece of work runs has to follow. ")


def prompt_tokens(llm: Any, n: int) -> list[int]:
    """Exactly n tokens (BOS first) of a fixed English text: the same prompt for every placement."""
    toks = list(llm.tokenize(_PROMPT_TEXT.encode(), add_bos=True))
    body = list(llm.tokenize(_PROMPT_TEXT.encode(), add_bos=False)) or [toks[-1]]
    while len(toks) < n:
        toks += body
    return toks[:n]


def timed_generate(llm: Any, prompt: str | Sequence[int], n_gen: int, *, temperature: float = 0.0,
                   seed: int | None = None) -> Generation:
    """Greedy (or sampled) generation of exactly n_gen tokens, EOS ignored, timed per token."""
    tokens = llm.tokenize(prompt.encode(), add_bos=True) if isinstance(prompt, str) else list(prompt)
    if seed is not None:
        llm.set_seed(seed)
    llm.reset()  # no prefix reuse: every run evaluates the whole prompt
    out: list[int] = []
    times: list[float] = []
    t0 = time.perf_counter()
    for tok in llm.generate(tokens, temp=temperature, reset=True):
        times.append(time.perf_counter() - t0)
        out.append(int(tok))
        if len(out) >= n_gen:
            break
    text = llm.detokenize(out).decode(errors="replace")
    return Generation(len(tokens), out, text, times[0] if times else float("nan"), times)


@dataclass
class ParallelGeneration:
    """`timed_parallel`'s result: each sequence's greedy tokens and the passes' times."""

    prompt_tokens: int
    tokens: list[list[int]]  # per sequence
    prompt_s: list[float]  # seconds, each sequence's prompt in -> its first token out
    pass_s: list[float]  # seconds, each decode pass (one token of every sequence)

    @property
    def ttft_s(self) -> float:
        """One sequence's prompt: the median over the sequences."""
        return statistics.median(self.prompt_s)

    @property
    def tpot_s(self) -> float:
        """Mean seconds per decode pass (nan without one)."""
        return statistics.fmean(self.pass_s) if self.pass_s else float("nan")

    @property
    def e2e_s(self) -> float:
        return sum(self.prompt_s) + sum(self.pass_s)


def timed_parallel(llm: Any, prompt: Sequence[int], n_seqs: int, n_gen: int) -> ParallelGeneration:
    """Greedy generation of n_gen tokens in each of n_seqs sequences of one prompt, decoded in
    lockstep: each sequence's prompt in ubatches of n_batch tokens (one after another), then
    n_gen - 1 passes of one token of every sequence -- the passes a plan for n_seqs sequences
    costs. (llama-server's slots run otherwise: their decode tokens ride beside later prompts,
    `slots.replay`.) The context must hold n_seqs sequences (oallama.Llama's n_seq_max)."""
    import llama_cpp
    import numpy as np

    ctx = llm.ctx
    if n_seqs > llama_cpp.llama_n_seq_max(ctx):
        raise PlacementError(f"{n_seqs} sequences: the context holds {llama_cpp.llama_n_seq_max(ctx)} "
                             "(load with n_seq_max=)")
    tokens = list(prompt)
    if len(tokens) + n_gen > llama_cpp.llama_n_ctx_seq(ctx):
        raise PlacementError(f"a {len(tokens)}-token prompt and {n_gen} tokens exceed a sequence's "
                             f"{llama_cpp.llama_n_ctx_seq(ctx)} cells")
    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    n_vocab = llm.n_vocab()
    n_batch = max(llm.n_batch, n_seqs)
    batch = SeqBatch(n_batch)
    run = functools.partial(batch.decode, llm)

    def greedy(i: int) -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx, i)
        return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

    try:
        out: list[list[int]] = []
        prompt_s: list[float] = []
        for seq in range(n_seqs):
            t0 = time.perf_counter()
            for a in range(0, len(tokens), n_batch):
                chunk = tokens[a:a + n_batch]
                run([(t, a + i, seq, a + i == len(tokens) - 1) for i, t in enumerate(chunk)])
            out.append([greedy(-1)])
            prompt_s.append(time.perf_counter() - t0)
        pass_s: list[float] = []
        for step in range(n_gen - 1):
            t0 = time.perf_counter()
            run([(out[seq][-1], len(tokens) + step, seq, True) for seq in range(n_seqs)])
            for seq in range(n_seqs):
                out[seq].append(greedy(seq))
            pass_s.append(time.perf_counter() - t0)
    finally:
        batch.close()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    return ParallelGeneration(len(tokens), out, prompt_s, pass_s)


class SeqBatch:
    """A llama_batch of up to n tokens, each of one sequence: `decode(llm, items)` decodes
    (token, pos, seq, logits) items through llama_cpp's context (so oallama's rpc failure check
    sees it; llama_cpp's own eval puts every token in sequence 0 and asks for the last logits only).

        >>> with contextlib.closing(SeqBatch(4)) as b:
        ...     b.decode(llm, [(tok, 40, s, True) for s in range(4)])  # one token of 4 sequences
    """

    def __init__(self, n: int) -> None:
        import llama_cpp

        self.batch = llama_cpp.llama_batch_init(n, 0, 1)  # what LlamaContext.decode reads of a LlamaBatch
        self.n = n

    def decode(self, llm: Any, items: Sequence[tuple[int, int, int, bool]]) -> None:
        if len(items) > self.n:
            raise ValueError(f"{len(items)} tokens: the batch holds {self.n}")
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        llm._ctx.decode(self)

    def close(self) -> None:
        import llama_cpp

        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None


# --- placement summaries --------------------------------------------------------------------

_LAYER = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight|\.bias)?$")


def placement_table(placements: Sequence[Any], devices_order: Sequence[str] | None = None) -> str:
    """Human table of where every weight went: totals per device, then one line per layer."""
    per_dev: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rows: dict[str, list[tuple[str, str]]] = defaultdict(list)
    bufts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # device -> buffer type -> tensors
    for t in placements:
        bufts[t.device][t.buffer_type] += 1
        per_dev[t.device][0] += 1
        per_dev[t.device][1] += t.nbytes
        m = _LAYER.match(t.name)
        key, short = (f"blk.{m[1]}", m[2] + (".b" if t.name.endswith(".bias") else "")) if m else ("-", t.name)
        rows[key].append((short, t.device))
    order = list(dict.fromkeys([*(devices_order or []), *sorted(per_dev)]))
    order = [d for d in order if d in per_dev]
    tag = {d: chr(ord("A") + i) for i, d in enumerate(order)}
    lines = ["weights by device (read back from the loaded model):"]
    for d in order:
        n, b = per_dev[d]
        kinds = ", ".join(f"{c} {k}" for k, c in sorted(bufts[d].items()))
        lines.append(f"  [{tag[d]}] {d:<28} {n:>5} tensors {b / 2**20:>10.1f} MiB   ({kinds})")
    lines.append("every weight ([device] per tensor):")
    for key in sorted(rows, key=lambda k: (k != "-", int(k.split(".")[1]) if k != "-" else -1)):
        cells = "  ".join(f"{short}[{tag[d]}]" for short, d in rows[key])
        lines.append(f"  {key:<7} {cells}")
    return "\n".join(lines)


def split_placement(model: gguf_file.GGUFInfo, device: str, how: str) -> dict[str, str]:
    """Simple hand placements for demos: which weights go to `device`.

    ffn:       every feed-forward weight and the output head
    odd:       every weight of odd-numbered layers
    attention: every attention weight
    """
    pick = {
        "ffn": lambda n: bool(re.match(r"^blk\.\d+\.ffn_", n)) or n == "output.weight",
        "odd": lambda n: bool(re.match(r"^blk\.\d*[13579]\.", n)),
        "attention": lambda n: bool(re.match(r"^blk\.\d+\.attn_(?!norm)", n)),
    }.get(how)
    if pick is None:
        raise PlacementError(f"unknown split '{how}' (choose ffn, odd or attention)")
    return {t.name: device for t in model.tensors if len(t.shape) > 1 and pick(t.name)}


# --- CLI ------------------------------------------------------------------------------------


def _uses_mmap(llm: Any) -> bool:
    import llama_cpp

    return llm.model_params.load_mode in (llama_cpp.LLAMA_LOAD_MODE_MMAP, llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK)


SPLITS = ("ffn", "odd", "attention")  # hand placements of `split_placement`


def _strategies() -> list[str]:
    return list(planfile.planner().strategies)


@dataclass
class RunOptions:
    """Everything `oallama run` takes (its flags are generated from these fields)."""

    model: str = option(positional=True, help="GGUF model file")
    devices: list[str] | None = option(None, help="comma-separated device names, e.g. CPU,CUDA0 or "
                                       "CPU,RPC[127.0.0.1:50052]", default_help="the CPU")
    placement: str | None = option(None, help="placement/plan JSON file")
    split: str | None = option(None, choices=SPLITS, help="hand placement: put these weights on the last device")
    gpu_budget: str | None = option(None, help="plan the placement for this accelerator budget ('50%', '2GiB')")
    strategy: str = option("optimal", choices=_strategies, help="planning strategy with --gpu-budget / --cpu-plan")
    cpu_plan: bool = option(False, help="plan this CPU's host weight layouts (no accelerator)")
    host_budget: str | None = option(None, help="host memory for weights the plan may fill with dual layouts "
                                     "('20GiB', '150%')", default_help="no dual layouts")
    plan_prompt: int = option(64, help="prompt length the plan optimises for")
    confirm: ConfirmOptions = group(ConfirmOptions)  # --gpu-budget / --cpu-plan with optimal: confirmed by measurement
    ubatch: int = option(512, help="llama.cpp's n_ubatch")
    rpc_local: bool = option(False, help="start a loopback rpc-server as a second device")
    rpc_threads: int = option(1, minimum=1, help="threads of that rpc-server")
    rpc_timeout: float = option(RPC_TIMEOUT_S, minimum=0, help="seconds an rpc-server may take to answer before it counts "
                                "as hung (0: wait forever)")
    prompt: str = option("The quick brown fox", short="-p", help="the prompt")
    n: int = option(32, flag="-n", help="tokens to generate")
    ctx: int = option(512, help="context length")
    flash_attn: str | None = option(None, choices=kvcache.FLASH_ATTN, help="flash attention, as llama.cpp's -fa (auto: "
                                    "resolved by planning, with --gpu-budget or --cpu-plan)",
                                    default_help="a plan file's, else off")
    cache_type_k: str | None = option(None, choices=kvcache.CACHE_TYPES, help="the KV cache's K type (-ctk)",
                                      default_help="a plan file's, else f16")
    cache_type_v: str | None = option(None, choices=kvcache.CACHE_TYPES, help="the KV cache's V type (-ctv)",
                                      default_help="a plan file's, else f16")
    threads: int | None = option(None, minimum=1, help="CPU threads", default_help="llama-cpp-python's")
    temperature: float = option(0.0, help="sampling temperature (0: greedy)")
    seed: int = option(1234, help="sampling seed")
    verbose: bool = option(False, help="show llama.cpp's log")


def _cmd_run(ns: argparse.Namespace) -> int:
    from . import rpc
    from .llama import Llama

    args = from_args(RunOptions, ns)
    model = gguf_file.check_model(args.model)
    devices = list(args.devices) if args.devices else None
    with rpc.local_server_if(args.rpc_local, args.rpc_threads) as server:
        if server is not None:
            print(f"started rpc-server {server.endpoint} as device {server.device_name}", file=sys.stderr)
            devices = [*(devices or ["CPU"]), server.device_name]
        placement: Any = args.placement
        plan_kw: dict[str, Any] = {}
        attention = {k: v for k, v in (("flash_attn", args.flash_attn), ("cache_type_k", args.cache_type_k),
                                       ("cache_type_v", args.cache_type_v)) if v is not None}
        wl = {"prompt": args.plan_prompt, "gen": args.n, "n_ubatch": args.ubatch, "context": args.ctx, **attention}
        if args.split:
            if not devices or len(devices) < 2:
                raise PlacementError("--split needs a second device (--devices CPU,DEV or --rpc-local)")
            placement = split_placement(model, devices[-1], args.split)
        elif args.cpu_plan:
            if args.gpu_budget or (devices and len(devices) > 1):
                raise PlacementError("--cpu-plan plans the CPU alone: drop --gpu-budget / --devices / --rpc-local")
            placement = args.strategy
            plan_kw = {"host_budget": args.host_budget, "confirm": args.confirm, "workload": wl}
        elif args.gpu_budget:
            if not devices or len(devices) < 2:
                raise PlacementError("--gpu-budget needs an accelerator (--devices CPU,DEV or --rpc-local)")
            placement = args.strategy
            plan_kw = {"gpu_budget": args.gpu_budget, "device": devices[-1], "host_budget": args.host_budget,
                       "confirm": args.confirm, "workload": wl}
            devices = None
        if "workload" not in plan_kw:  # a load as given (a plan file's own settings must agree)
            plan_kw.update(kvcache.given_llama_kwargs(args.flash_attn, args.cache_type_k, args.cache_type_v))
        llm = Llama(args.model, devices=devices, placement=placement, n_ctx=args.ctx, n_ubatch=args.ubatch,
                    n_threads=args.threads, n_threads_batch=args.threads, seed=args.seed, verbose=args.verbose,
                    rpc_timeout=args.rpc_timeout, **plan_kw)
        if llm.plan is not None:
            pred = llm.plan["predicted"]
            where = (f"for a {llm.plan['budget']['request']} budget on {llm.plan['accelerator']}"
                     if llm.plan.get("accelerator") else "for this CPU alone")
            lays = llm.plan.get("layouts") or {}
            kinds = {k: sum(1 for v in lays.values() if v == k) for k in dict.fromkeys(lays.values())}
            print(f"plan '{llm.plan['strategy']}' {where}: predicted TTFT {pred['ttft_ms']:.1f} ms, TPOT "
                  f"{pred['tpot_ms']:.2f} ms; n_gpu_layers={llm.plan['n_gpu_layers']}, "
                  f"{len(llm.offload_policy())} per-weight offload thresholds; host layouts: "
                  f"{', '.join(f'{n} {k}' for k, n in kinds.items()) or 'llama.cpp default'}")
        print(placement_table(llm.tensor_placements(), devices or (llm.plan or {}).get("devices")))
        gen = timed_generate(llm, args.prompt, args.n, temperature=args.temperature, seed=args.seed)
        print(f"\nprompt: {args.prompt!r} ({gen.prompt_tokens} tokens)")
        print(f"output: {gen.text!r}")
        print(f"TTFT {gen.ttft_s * 1e3:.1f} ms   TPOT {gen.tpot_s * 1e3:.2f} ms/token   "
              f"{len(gen.tokens)} tokens in {gen.e2e_s:.3f} s   (threads={llm.n_threads}, "
              f"mmap={_uses_mmap(llm)})")
        llm.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="load a model with a placement, generate, show placement and TTFT/TPOT")
    add_arguments(p, RunOptions)
    p.set_defaults(func=_cmd_run)
