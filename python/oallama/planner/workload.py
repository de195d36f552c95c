"""The workload a plan is made for: prompt, generation, ubatch, context, attention, KV cache and
sequences (the workload flags of `oallama plan`), and the passes llama.cpp runs for it, each keyed
by its shape (`Ubatch`): how often each counts in the objective and the KV length it attends over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import PlanError
from ..options import option
from ..runtime import kvcache

OBJECTIVES = ("ttft", "tpot", "e2e")


def _pad256(n: float) -> int:
    return -(-round(n) // 256) * 256


class Ubatch(NamedTuple):
    """A pass's shape as llama.cpp's ubatch has it: n_tokens tokens of n_seqs sequences, n_tokens /
    n_seqs each, and a row of logits per sequence. A prompt's last 4 tokens and a decode pass of 4
    sequences are both 4-token graphs, yet neither's attention nor outputs are the other's, so a
    workload's passes, their graphs and their pass models are keyed by both. Written "4" (one
    sequence) or "4x1" (4 sequences of 1 token: [n_seqs x tokens each]) in plan files and records."""

    n_tokens: int
    n_seqs: int = 1

    def __str__(self) -> str:
        return str(self.n_tokens) if self.n_seqs == 1 else f"{self.n_seqs}x{self.n_tokens // self.n_seqs}"

    @staticmethod
    def parse(text: str) -> Ubatch:
        """The ubatch `str` wrote ("512", "4x1")."""
        seqs, _, each = text.partition("x")
        return Ubatch(int(seqs) * int(each), int(seqs)) if each else Ubatch(int(seqs))


ONE = Ubatch(1)  # a one-token pass of one sequence


@dataclass(frozen=True)
class Workload:
    """What the plan is optimised for: `parallel` sequences (llama-server's slots), each a prompt
    of `prompt` tokens and then `gen` generated tokens, decoded together (its fields are also the
    workload flags of `oallama plan`).

    The prompts run one sequence at a time, in ubatches of n_ubatch tokens; then each decode pass
    carries one token of every sequence (`decode` tokens). With several sequences each has a KV
    stream of its own, n_ctx / parallel cells, as llama-server keeps them when given -np; or, with
    `kv_unified` (llama-server's default when it picks its slots itself), all share one stream of
    n_ctx cells, which every pass's attention spans (the other sequences' cells masked). TTFT is one
    sequence's prompt, TPOT one decode pass, and e2e the whole workload: every prompt, then gen - 1
    decode passes.

    This is the lockstep schedule (`runtime.generate.timed_parallel`). llama-server's slots batch a
    generating slot's next token with the next prompt's tokens instead (`runtime.slots`): measured,
    its wall matches the lockstep's within the machine's spread, while a later slot's first token
    comes later than in lockstep, so TTFT here is the first request's
    (bench/results/2026-11-27-vm-server-slots)."""

    prompt: int = option(512, help="prompt tokens of the workload (of each sequence)")
    gen: int = option(128, help="generated tokens of the workload (of each sequence)")
    objective: str = option("e2e", choices=OBJECTIVES, help="predicted time to minimise")
    n_ubatch: int = option(512, flag="--ubatch", help="llama.cpp's n_ubatch (tokens per graph)")
    context: int | None = option(None, flag="--ctx", help="context size the model is loaded with (llama.cpp's n_ctx, "
                                 "tokens, all sequences together)",
                                 default_help="parallel x (prompt + gen rounded up to 256)")
    flash_attn: str = option("off", choices=kvcache.FLASH_ATTN, help="flash attention, as llama.cpp's -fa (auto: on "
                             "where llama.cpp would turn it on for every layer on each device; the plan pins the result)")
    cache_type_k: str = option("f16", choices=kvcache.CACHE_TYPES, help="the KV cache's K type (llama.cpp's -ctk)")
    cache_type_v: str = option("f16", choices=kvcache.CACHE_TYPES, help="the KV cache's V type (llama.cpp's -ctv; "
                               "a quantized one needs flash attention)")
    parallel: int = option(1, short="-np", help="sequences decoded together (llama.cpp's -np, llama-server's slots): "
                           "each has its own prompt, generation and KV stream of n_ctx / parallel cells",
                           minimum=1)
    kv_unified: bool = option(False, help="the sequences share one KV stream of n_ctx cells (llama.cpp's "
                              "--kv-unified, llama-server's default when it picks its slots itself)")

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise PlanError(f"objective '{self.objective}': choose one of {', '.join(OBJECTIVES)}")
        if self.prompt < 1 or self.gen < 1 or self.n_ubatch < 1:
            raise PlanError(f"workload needs prompt, gen and n_ubatch >= 1 (got {self.prompt}, {self.gen}, "
                            f"{self.n_ubatch})")
        if not 1 <= self.parallel <= kvcache.MAX_SEQ:
            raise PlanError(f"--parallel {self.parallel}: llama.cpp holds 1 to {kvcache.MAX_SEQ} sequences")
        if self.n_ubatch < self.parallel:  # llama.cpp reserves a pass of one token of every sequence
            raise PlanError(f"--ubatch {self.n_ubatch}: a decode pass of {self.parallel} sequences needs at least "
                            f"{self.parallel} tokens")
        kvcache.check(self.flash_attn, self.cache_type_k, self.cache_type_v)
        if self.context is not None and self.unified and self.n_ctx < self.parallel * (self.prompt + self.gen):
            raise PlanError(f"--ctx {self.context}: the workload's {self.parallel} sequences need "
                            f"{self.parallel * (self.prompt + self.gen)} cells of the unified KV cache ({self.n_ctx})")
        if self.context is not None and self.n_ctx_seq < self.prompt + self.gen:
            each = f" in each of {self.parallel} sequences ({self.n_ctx_seq} cells each)" if self.parallel > 1 else ""
            raise PlanError(f"--ctx {self.context}: the workload's prompt and generation need {self.prompt + self.gen} "
                            f"tokens of context{each}")

    def ubatches(self) -> list[int]:
        """Token counts of one prompt's ubatches (llama.cpp splits a prompt by n_ubatch)."""
        full, rest = divmod(self.prompt, self.n_ubatch)
        return [self.n_ubatch] * full + ([rest] if rest else [])

    @property
    def decode(self) -> int:
        """Tokens of a decode pass: one of each sequence."""
        return self.parallel

    @property
    def decode_pass(self) -> Ubatch:
        """The decode pass: one token of each sequence."""
        return Ubatch(self.parallel, self.parallel)

    def prompt_passes(self) -> list[Ubatch]:
        """One prompt's passes, in order (one sequence each)."""
        return [Ubatch(n) for n in self.ubatches()]

    @property
    def unified(self) -> bool:
        """Several sequences in one KV stream (`kv_unified`; with one sequence there is one anyway)."""
        return self.kv_unified and self.parallel > 1

    @property
    def n_ctx(self) -> int:
        """The context size (tokens, every sequence's cells) as llama.cpp sizes it: `context` (or
        parallel x (prompt + gen), each rounded up to 256) padded to 256, then (one stream per
        sequence) each sequence's stream padded to 256 and n_ctx their sum."""
        given = _pad256(self.context or self.parallel * max(256, _pad256(self.prompt + self.gen)))
        return given if self.unified else _pad256(given // self.parallel) * self.parallel

    @property
    def n_ctx_seq(self) -> int:
        """The cells a sequence's attention spans: its own stream's, or the unified stream's."""
        return self.n_ctx if self.unified else self.n_ctx // self.parallel

    def passes(self) -> list[tuple[Ubatch, int]]:
        """The passes of one sequence as (ubatch, cells of its stream before it): its prompt's
        ubatches, then a decode pass (one token of each sequence, all at the same length) per
        generated token but the first (which the prompt's last pass gives)."""
        out, pos = [], 0
        for u in self.prompt_passes():
            out.append((u, pos))
            pos += u.n_tokens
        return out + [(self.decode_pass, p) for p in range(self.prompt, self.prompt + max(self.gen - 1, 1))]

    def _mean_by_pass(self, value: Callable[[int, int], float]) -> dict[Ubatch, float]:
        """ubatch -> the mean of value(tokens of one sequence, cells before) over its passes."""
        seen: dict[Ubatch, list[float]] = {}
        for u, pos in self.passes():
            seen.setdefault(u, []).append(value(u.n_tokens // u.n_seqs, pos))
        return {u: sum(v) / len(v) for u, v in seen.items()}

    def pass_kv(self) -> dict[Ubatch, int]:
        """ubatch -> the KV length its passes attend over (tokens of one stream). llama.cpp pads
        the KV view to 256 cells: n_kv = min(n_ctx_seq, max(256, pad256(cells used))). Passes of
        one shape at several lengths get their mean, padded (attention is linear in it). In a
        unified stream the cells used are every sequence's: a decode pass after pos tokens of each
        spans parallel x (pos + 1), a prompt those of the prompts before it too (on average half
        the other sequences')."""
        def pad(used: float) -> int:
            return min(self.n_ctx_seq, max(256, _pad256(used)))

        seen: dict[Ubatch, list[int]] = {}
        for u, pos in self.passes():
            if not self.unified:
                used = pos + u.n_tokens // u.n_seqs
            elif u.n_seqs > 1:  # one token of every sequence
                used = self.parallel * (pos + 1)
            else:
                used = pos + u.n_tokens + (self.parallel - 1) * self.prompt // 2
            seen.setdefault(u, []).append(pad(used))
        return {u: pad(sum(v) / len(v)) for u, v in seen.items()}

    def pass_attended(self) -> dict[Ubatch, float]:
        """ubatch -> the KV cells a token of that pass attends to (mean over its tokens and its
        passes; flash attention's work, calfit.work): n tokens of a sequence after pos cells,
        pos + (n + 1) / 2."""
        return self._mean_by_pass(lambda n, pos: pos + (n + 1) / 2)

    def pass_weights(self, objective: str | None = None) -> dict[Ubatch, float]:
        """ubatch -> how often that pass counts in the objective."""
        obj = objective or self.objective
        prefill: dict[Ubatch, float] = {}
        for u in self.prompt_passes():
            prefill[u] = prefill.get(u, 0.0) + (1.0 if obj == "ttft" else float(self.parallel))
        if obj == "ttft":
            return prefill
        if obj == "tpot":
            return {self.decode_pass: 1.0}
        out = dict(prefill)
        out[self.decode_pass] = out.get(self.decode_pass, 0.0) + float(self.gen - 1)
        return out

    def sequences(self) -> dict[str, Any]:
        """llama.cpp's context parameters for the sequences (n_seq_max, kv_unified)."""
        return {"n_seq_max": self.parallel, "kv_unified": self.unified}
