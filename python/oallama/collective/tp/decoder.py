"""oallama.collective.tp.decoder: a tensor-parallel llama decoder across ranks and hosts (seed 001).

Every rank holds its attention heads and FFN rows of each layer (see oallama.collective.tp.memory for the
split) and computes partial sums that one all-reduce per sub-layer completes:

    h: [T, n_embd] residual stream, the same on every rank
    x = rmsnorm(h) * attn_norm                 every rank, its own copy
    o = attention(x; my heads) @ wo_mine^T     partial sum          -> all_reduce
    h = h + o;  x = rmsnorm(h) * ffn_norm      every rank, its own copy  (All-Reduce + LayerNorm)
    y = (silu(x wg^T) * x wu^T) @ wd_mine^T    partial sum          -> all_reduce
    h = h + y;  x = rmsnorm(h) * next norm     ...
    logits_mine = rmsnorm(h) * output_norm @ w_out_mine^T            -> all_gather

``norm="reduce_bcast"`` is Megatron's order instead (reduce to rank 0, rank 0 adds and normalises,
broadcasts h and x): the tests check both give the same numbers. ``world == 1`` (no collective)
is the single-process reference that the tests also compare with llama.cpp itself.

``run_distributed`` launches one process per rank (``python -m oallama.collective.tp.decoder worker``), optionally
inside network namespaces (bench/scripts/netns_hosts.py), and collects each rank's report: tokens,
TTFT, tokens/s, peak memory (exact bytes held, and sampled RssAnon), collective counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CollectiveError
from ...options import add_arguments, from_args, group, option
from .. import allreduce as coll
from ..launch import launch
from .memory import GGUFSource, LlamaConfig, MemorySampler, ResidentStore, Shard, StreamingStore

__all__ = ["DistRun", "GenerateResult", "TPDecoder", "TPOptions", "register", "run_distributed"]


NORMS = ("allreduce", "reduce_bcast")  # where LayerNorm meets the all-reduce (see TPOptions.norm)


@dataclass(frozen=True)
class TPOptions:
    algorithm: str = option("tree", short="-a", choices=coll.ALGORITHMS, help="all-reduce algorithm")
    stream: bool = option(False, help="the layer-streaming memory manager (else every layer resident)")
    norm: str = option("allreduce", choices=NORMS, help="allreduce: every rank normalises; reduce_bcast: "
                       "Megatron's order")
    n_ctx: int = option(512, help="tokens of KV cache")
    intra: str = "auto"  # tree's intra-host stage: auto | shm | transport
    pipeline_bytes: int = 0  # tree's inter-host chunks (see CollectiveOptions); 0: unchunked
    timeout_s: float = 300.0  # per collective operation
    spill_dir: str | None = None  # where the streamed KV spill file goes (default: $TMPDIR)

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm must be allreduce or reduce_bcast, not {self.norm!r}")
        if self.algorithm not in coll.ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; valid: {', '.join(coll.ALGORITHMS)}")


@dataclass
class GenerateResult:
    tokens: list[int]
    ttft_s: float  # prompt in -> first token out (seconds)
    decode_s: list[float]  # seconds per later token
    logits: list[np.ndarray] = field(default_factory=list)  # [n_vocab] float32 per generated token

    @property
    def tokens_per_s(self) -> float:
        return len(self.decode_s) / sum(self.decode_s) if self.decode_s else float("nan")


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [T, E] / sqrt(mean(x^2) + eps) * w [E] (ggml_rms_norm then ggml_mul), float32."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps)))) * w


class TPDecoder:
    """One rank's part of a llama model. comm=None: a single process holding everything."""

    def __init__(self, model_path: str | os.PathLike[str], comm: coll.Collective | None = None,
                 options: TPOptions | None = None) -> None:
        self.options = options or TPOptions()
        self.comm = comm
        self.rank, self.world = (comm.rank, comm.topo.world_size) if comm else (0, 1)
        t0 = time.perf_counter()
        self.src = GGUFSource(model_path)
        cfg = self.cfg = LlamaConfig.from_gguf(self.src.info)
        sh = self.shard = Shard.split(cfg, self.rank, self.world)
        # 1-d norm weights stay whole on every rank (n_embd floats each)
        self.attn_norm = [self.src.vector(f"blk.{i}.attn_norm.weight") for i in range(cfg.n_layer)]
        self.ffn_norm = [self.src.vector(f"blk.{i}.ffn_norm.weight") for i in range(cfg.n_layer)]
        self.output_norm = self.src.vector("output_norm.weight")
        out_name = "output.weight" if self.src.has("output.weight") else "token_embd.weight"
        self.w_out = self.src.rows(out_name, *sh.vocab)  # [vocab_local, n_embd]
        self.vocab_sizes = [b - a for a, b in (Shard.split(cfg, r, self.world).vocab for r in range(self.world))]
        self.v_max = max(self.vocab_sizes)
        self.pinned_bytes = self.w_out.nbytes + 4 * cfg.n_embd * (2 * cfg.n_layer + 1)
        n_ctx = self.options.n_ctx
        self.store: ResidentStore | StreamingStore = (
            StreamingStore(self.src, cfg, sh, n_ctx, self.options.spill_dir) if self.options.stream
            else ResidentStore(self.src, cfg, sh, n_ctx))
        g = cfg.n_head // cfg.n_head_kv
        self.kv_of_q = [(h // g) - sh.kv_heads[0] for h in range(*sh.q_heads)]  # local q head -> local kv
        self.inv_freq = (cfg.rope_base ** (-np.arange(0, cfg.n_rot, 2, dtype=np.float64) / cfg.n_rot))
        self.load_s = time.perf_counter() - t0

    def close(self) -> None:
        self.store.close()
        self.src.close()

    @property
    def n_pos(self) -> int:
        return self.store.n_pos

    def reset(self) -> None:
        self.store.reset()

    # --- pieces -------------------------------------------------------------------------------

    def _embed(self, tokens: Sequence[int]) -> np.ndarray:
        name = "token_embd.weight"
        bad = [int(t) for t in tokens if not 0 <= int(t) < self.cfg.n_vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside the vocabulary [0, {self.cfg.n_vocab})")
        return np.concatenate([self.src.rows(name, int(t), int(t) + 1) for t in tokens])  # [T, E]

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> None:
        """Rotate adjacent pairs (ggml's NORM mode, llama) of x [T, heads, head_dim], in place."""
        n = self.cfg.n_rot
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [T, n_rot/2] radians
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        x0, x1 = x[..., 0:n:2].copy(), x[..., 1:n:2].copy()
        x[..., 0:n:2] = x0 * c - x1 * s
        x[..., 1:n:2] = x0 * s + x1 * c

    def _attention(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, p0: int) -> np.ndarray:
        """Causal attention of my query heads. q [T, n_q, hd], K/V [S, n_kv, hd] -> [T, n_q * hd]."""
        T, nq, hd = q.shape
        S = K.shape[0]
        scale = np.float32(1.0 / np.sqrt(hd))
        masked = np.arange(S)[None, :] > (p0 + np.arange(T))[:, None]  # [T, S]
        out = np.empty((T, nq, hd), np.float32)
        for j in range(nq):
            kv = self.kv_of_q[j]
            s = (q[:, j] @ K[:, kv].T) * scale  # [T, S]
            if T > 1:
                s[masked] = -np.inf
            s -= s.max(axis=1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=1, keepdims=True)
            out[:, j] = s @ V[:, kv]
        return out.reshape(T, nq * hd)

    def _add_norm(self, part: np.ndarray, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """h + (sum over ranks of part), and its rmsnorm * w: All-Reduce + LayerNorm (or Megatron)."""
        eps = self.cfg.eps
        if self.comm is None:
            h = h + part
            return h, rmsnorm(h, w, eps)
        if self.options.norm == "allreduce":
            self.comm.all_reduce(part)
            h = h + part
            return h, rmsnorm(h, w, eps)
        self.comm.reduce(part, root=0)
        buf = np.empty((2, *h.shape), np.float32)
        if self.rank == 0:
            buf[0] = h + part
            buf[1] = rmsnorm(buf[0], w, eps)
        self.comm.broadcast(buf, root=0)
        return buf[0], buf[1]

    # --- the model ----------------------------------------------------------------------------

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run T tokens at the next positions; logits [T or 1, n_vocab] float32 (all ranks)."""
        cfg, st = self.cfg, self.store
        T, p0, hd = len(tokens), st.n_pos, cfg.head_dim
        if T == 0:
            raise ValueError("forward needs at least one token")
        if p0 + T > self.options.n_ctx:
            raise ValueError(f"context full: {p0} + {T} tokens > n_ctx {self.options.n_ctx}")
        pos = np.arange(p0, p0 + T)
        h = self._embed(tokens)
        x = rmsnorm(h, self.attn_norm[0], cfg.eps)
        st.begin_pass(T)
        for i in range(cfg.n_layer):
            r = st.get(i)
            w = r.w
            q = (x @ w.wq.T).reshape(T, self.shard.n_q, hd)
            k = (x @ w.wk.T).reshape(T, self.shard.n_kv, hd)
            v = (x @ w.wv.T).reshape(T, self.shard.n_kv, hd)
            self._rope(q, pos)
            self._rope(k, pos)
            K, V = r.append(k, v)
            part = self._attention(q, K, V, p0) @ w.wo.T  # [T, E] partial sum
            h, x = self._add_norm(part, h, self.ffn_norm[i])
            g = x @ w.w_gate.T  # [T, ff_local]
            act = g / (1.0 + np.exp(-g)) * (x @ w.w_up.T)
            part = act @ w.w_down.T  # [T, E] partial sum
            del w, K, V
            st.release(r)
            del r
            nxt = self.attn_norm[i + 1] if i + 1 < cfg.n_layer else self.output_norm
            h, x = self._add_norm(part, h, nxt)
        st.end_pass()
        xs = x if all_logits else x[-1:]
        local = xs @ self.w_out.T  # [T', vocab_local]
        if self.comm is None:
            return local
        pad = np.zeros((xs.shape[0], self.v_max), np.float32)
        pad[:, : local.shape[1]] = local
        parts = self.comm.all_gather(pad)  # [world, T', v_max]
        return np.concatenate([parts[r, :, :n] for r, n in enumerate(self.vocab_sizes)], axis=1)

    def generate(self, prompt: Sequence[int], n_new: int, *, keep_logits: bool = False) -> GenerateResult:
        """Greedy decoding of n_new tokens after prompt, from an empty cache."""
        if n_new < 1:
            raise ValueError("n_new must be >= 1")
        self.reset()
        if self.comm is not None:
            self.comm.barrier()
        t0 = time.perf_counter()
        logits = self.forward(prompt)[-1]
        tokens = [int(np.argmax(logits))]
        ttft = time.perf_counter() - t0
        kept = [logits] if keep_logits else []
        steps = []
        for _ in range(n_new - 1):
            t1 = time.perf_counter()
            logits = self.forward([tokens[-1]])[-1]
            tokens.append(int(np.argmax(logits)))
            steps.append(time.perf_counter() - t1)
            if keep_logits:
                kept.append(logits)
        return GenerateResult(tokens, ttft, steps, kept)


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


@dataclass
class DistRun:
    """One distributed generation: rank 0's tokens/logits and every rank's report."""

    tokens: list[int]
    logits: np.ndarray | None  # [n_gen, n_vocab] float32 when asked for
    reports: list[dict[str, Any]]
    wall_s: float

    @property
    def ttft_s(self) -> float:
        return float(self.reports[0]["ttft_s"])

    @property
    def tokens_per_s(self) -> float:
        return float(self.reports[0]["tokens_per_s"])

    def totals(self) -> coll.Counters:
        c = coll.Counters()
        for r in self.reports:
            c.add(coll.Counters(**r["counters"]))
        return c


def _worker(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    opts = TPOptions(**job["options"])
    comm = coll.init_from_env(coll.CollectiveOptions(algorithm=opts.algorithm, intra=opts.intra,
                                                     timeout_s=opts.timeout_s, pipeline_bytes=opts.pipeline_bytes))
    mem = MemorySampler()  # baseline: interpreter + torch + gloo, before any weight
    dec = TPDecoder(job["model"], comm, opts)
    comm.barrier()
    mem.sample()
    comm.counters = coll.Counters()  # count the generation only
    res = dec.generate(job["prompt"], int(job["n_gen"]), keep_logits=bool(job.get("save_logits")))
    mem.sample()
    mem.stop()
    out = Path(job["out"])
    st = dec.store
    report = {
        "rank": comm.rank, "host": comm.host, "intra": comm.intra, "options": asdict(opts),
        "tokens": res.tokens, "ttft_s": res.ttft_s, "decode_s": res.decode_s, "tokens_per_s": res.tokens_per_s,
        "load_s": dec.load_s, "counters": comm.counters.to_dict(),
        "memory": {
            "rss_anon_base": mem.base, "rss_anon_peak": mem.peak, "model_peak_sampled": mem.peak - mem.base,
            "held_peak": st.acct.peak + dec.pinned_bytes,  # exact: layer weights + KV + head + norms
            "layers_peak": st.acct.peak, "pinned": dec.pinned_bytes,
        },
        "stream": {"load_s": getattr(st, "load_seconds", 0.0), "wait_s": getattr(st, "wait_seconds", 0.0),
                   "file_bytes_read": dec.src.bytes_read},
        "shard": asdict(dec.shard),
    }
    if comm.rank == 0 and res.logits:
        np.save(out / "logits.npy", np.stack(res.logits))
    (out / f"rank{comm.rank}.json").write_text(json.dumps(report, indent=1))
    comm.barrier()
    dec.close()
    comm.close()
    coll.shutdown()  # gloo's threads joined before the interpreter ends (see collective.allreduce)
    return 0


def run_distributed(model: str | os.PathLike[str], prompt: Sequence[int], n_gen: int, topo: coll.Topology,
                    options: TPOptions | None = None, *, out_dir: str | os.PathLike[str],
                    save_logits: bool = False, timeout_s: float = 600.0, **launch_kw: Any) -> DistRun:
    """Generate n_gen tokens with one process per rank of topo (see collective.launch for
    launch_kw: netns, ifnames, master_addr). Raises CollectiveError on a failure or timeout."""
    options = options or TPOptions()
    coll.require_torch()  # before starting ranks that would all fail on it
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*.json"):
        f.unlink()
    (out / "logits.npy").unlink(missing_ok=True)
    job = {"model": str(Path(model).resolve()), "prompt": [int(t) for t in prompt], "n_gen": int(n_gen),
           "options": asdict(options), "out": str(out.resolve()), "save_logits": save_logits}
    (out / "job.json").write_text(json.dumps(job))
    argv = [sys.executable, "-m", "oallama.collective.tp.decoder", "worker", str((out / "job.json").resolve())]
    t0 = time.perf_counter()
    launch(lambda r: argv, topo, timeout_s=timeout_s, **launch_kw)
    wall = time.perf_counter() - t0
    try:
        reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(topo.world_size)]
    except FileNotFoundError as e:
        raise CollectiveError(f"a rank exited 0 without its report: {e.filename}") from None
    logits = np.load(out / "logits.npy") if save_logits else None
    return DistRun(reports[0]["tokens"], logits, reports, wall)


# --------------------------------------------------------------------------------------------
# CLI: oallama tp
# --------------------------------------------------------------------------------------------


def _tokenize(model: str, text: str) -> list[int]:
    import llama_cpp  # oallama is imported already (this module is inside it): its libraries


    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    try:
        return list(llm.tokenize(text.encode()))
    finally:
        llm.close()


@dataclass
class TpCommand:
    """Everything `oallama tp` takes (its flags are generated from these fields)."""

    model: Path = option(short="-m", help="llama GGUF model file")
    prompt: str = option("Once upon a time", short="-p", exclusive="input",
                         help="text, tokenized by the model's tokenizer")
    tokens: list[int] | None = option(None, exclusive="input", help="comma-separated token ids instead of --prompt")
    n: int = option(16, flag="-n", help="tokens to generate")
    hosts: int = option(2, help="hosts of the topology (each a group of local ranks)")
    ranks_per_host: int = option(2, help="rank processes per host")
    options: TPOptions = group(TPOptions)
    timeout: float = option(600.0, help="seconds for the whole run")
    out: Path | None = option(None, help="keep the per-rank reports here", default_help="a temporary directory")


def _cmd_tp(args: argparse.Namespace) -> int:
    import tempfile

    c = from_args(TpCommand, args)
    prompt = list(c.tokens) if c.tokens else _tokenize(str(c.model), c.prompt)
    topo = coll.Topology.uniform(c.hosts, c.ranks_per_host)
    opts = c.options
    with tempfile.TemporaryDirectory(prefix="oallama-tp-") as tmp:
        run = run_distributed(c.model, prompt, c.n, topo, opts, out_dir=c.out or tmp, timeout_s=c.timeout)
    tot = run.totals()
    peak = max(r["memory"]["held_peak"] for r in run.reports)
    print(f"tokens: {run.tokens}")
    print(f"{topo.n_hosts} hosts x {c.ranks_per_host} ranks, {opts.algorithm}"
          f"{' + layer streaming' if opts.stream else ''}: TTFT {run.ttft_s * 1e3:.1f} ms, "
          f"{run.tokens_per_s:.2f} tokens/s, peak held {peak / 2**20:.1f} MiB/rank, "
          f"inter-host {tot.inter_msgs} messages / {tot.inter_bytes / 2**20:.2f} MiB")
    return 0


def register(subparsers: Any) -> None:
    """Add `oallama tp` to the CLI."""
    ap = subparsers.add_parser("tp", help="tensor-parallel generation across local ranks (gloo on loopback)",
                               description="Greedy generation with a llama GGUF split over hosts x ranks "
                               "processes on this machine; prints TTFT, tokens/s, memory and traffic.")
    add_arguments(ap, TpCommand)
    ap.set_defaults(func=_cmd_tp)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oallama.collective.tp.decoder")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="one rank of run_distributed (started by collective.launch)")
    w.add_argument("job")
    args = ap.parse_args(argv)
    return _worker(args.job)


if __name__ == "__main__":
    sys.exit(main())
