"""Presets of architectures whose tensor sets differ from llama's: phi3 (query, key and value in
one fused matrix, gate and up in another) and gemma3 (sliding-window attention on five layers of
six, query/key norms, norms after attention and FFN, a tied 262144-row embedding), the held-out
architectures of the planner's evaluation (bench/heldout, protocol version 1): none of the
benchmark grids the cost model was developed on used them; and those of its protocol version 2,
which neither the grids nor version 1 used: qwen3 (a dense model with query/key norms per head) and
starcoder2 (LayerNorm with biases, biases on every projection, a GELU FFN without a gate).

`tensor_layout` and `arch_kvs` follow llama.cpp's loaders (src/models/phi3.cpp, gemma3.cpp, qwen3.cpp,
starcoder2.cpp): every
tensor they create, and the keys they read beyond the ones every preset writes (presets.arch_kvs).
gemma3-270m matches the real Gemma 3 270M GGUF tensor for tensor (tests/test_synthetic.py checks
it against the registry's file where it is cached).
"""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType, TokenType

from .presets import _QWQ_ADDED, QWQ_TEMPLATE, Preset, TensorSpec

ARCHS = ("phi3", "gemma3", "qwen3", "starcoder2")

PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


# Phi-3's added tokens (llama.cpp's vocab loader looks three of them up for a model named phi3)
_PHI3_ADDED: dict[int, tuple[str, TokenType]] = {
    32000 + i: (t, TokenType.CONTROL)
    for i, t in enumerate(["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
                           "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>",
                           "<|placeholder6|>", "<|user|>"])
}


def _gemma3(name: str, description: str, n_embd: int, n_layer: int, n_head: int, n_head_kv: int,
            n_ff: int) -> Preset:
    return Preset(
        name=name, arch="gemma3", description=description,
        n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_ctx=32768,
        vocab="llama-spm", n_vocab=262144,  # Gemma's own SentencePiece vocabulary has 262144 pieces
        rope_freq_base=1000000.0, rms_eps=1e-6, chat_template=GEMMA_TEMPLATE,
        tied_output=True, head_dim=256, head_dim_v=256, sliding_window=512,
        keep_tokens=("\u2581",),
        # the embedding enters the residual stream scaled by sqrt(n_embd) and is also the output
        # matrix (tied): small, as minicpm3's (see synthetic.py)
        embd_std=0.002, output_norm=100.0,
    )


ARCH_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="phi3-mini",
            arch="phi3",
            description="microsoft/Phi-3-mini-4k-instruct (fused qkv and gate-up; llama-spm vocab padded to 32064)",
            n_embd=3072, n_layer=32, n_head=32, n_head_kv=32, n_ff=8192, n_ctx=4096,
            vocab="llama-spm", n_vocab=32064,
            rope_freq_base=10000.0, rms_eps=1e-5,
            chat_template=PHI3_TEMPLATE,
            keep_tokens=("\u2581",),
            added_tokens=_PHI3_ADDED, token_ids={"eos": 32000},
        ),
        _gemma3("gemma3-270m", "google/gemma-3-270m (sliding-window attention, tied 262144-row embedding)",
                640, 18, 4, 1, 2048),
        _gemma3("gemma3-1b", "google/gemma-3-1b-it", 1152, 26, 4, 1, 6912),
        _gemma3("gemma3-4b", "google/gemma-3-4b-it (its text model)", 2560, 34, 8, 4, 10240),
        Preset(
            name="qwen3-8b",
            arch="qwen3",
            description="Qwen/Qwen3-8B (query/key norms per head; qwen2 vocab padded to 151936 rows)",
            n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, n_ff=12288, n_ctx=40960,
            vocab="qwen2", n_vocab=151936,
            rope_freq_base=1000000.0, rms_eps=1e-6,
            chat_template=QWQ_TEMPLATE, head_dim=128,
            added_tokens=_QWQ_ADDED, token_ids={"bos": 151643, "eos": 151645, "padding": 151643}, add_bos=False,
        ),
        Preset(
            name="starcoder2-7b",
            arch="starcoder2",
            description="bigcode/starcoder2-7b's shapes (LayerNorm and biases, GELU FFN; llama-spm vocab padded "
                        "to its 49152 rows)",
            n_embd=4608, n_layer=32, n_head=36, n_head_kv=4, n_ff=18432, n_ctx=16384,
            vocab="llama-spm", n_vocab=49152,
            rope_freq_base=1000000.0, rms_eps=1e-5,
            chat_template=PHI3_TEMPLATE,  # a base model for code: no template of its own
            keep_tokens=("\u2581",),
        ),
    ]
}


def tensor_layout(p: Preset, n_layer: int) -> list[TensorSpec]:
    """Every tensor llama.cpp's phi3 / gemma3 / qwen3 / starcoder2 loader creates for this preset."""
    E, F, V = p.n_embd, p.n_ff, p.n_vocab
    hk, hv = p.n_embd_head_k, p.n_embd_head_v
    n_q, n_kv = p.n_head * hk, p.n_head_kv * hk  # query / key-value widths
    out = [TensorSpec("token_embd.weight", (E, V), "embd"), TensorSpec("output_norm.weight", (E,), "output_norm")]
    if p.arch == "starcoder2":
        out.append(TensorSpec("output_norm.bias", (E,), "bias"))
    if not p.tied_output:
        out.append(TensorSpec("output.weight", (E, V), "output"))
    for i in range(n_layer):
        b = f"blk.{i}."
        if p.arch == "phi3":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "attn_qkv.weight", (E, n_q + 2 * n_kv), "qk"),  # q, k, v side by side
                    TensorSpec(b + "attn_output.weight", (n_q, E), "linear"),
                    TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "ffn_down.weight", (F, E), "linear"),
                    TensorSpec(b + "ffn_up.weight", (E, 2 * F), "linear")]  # gate and up side by side
        elif p.arch == "gemma3":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "attn_q.weight", (E, n_q), "qk"),
                    TensorSpec(b + "attn_k.weight", (E, n_kv), "qk"),
                    TensorSpec(b + "attn_v.weight", (E, p.n_head_kv * hv), "linear"),
                    TensorSpec(b + "attn_output.weight", (p.n_head * hv, E), "linear"),
                    TensorSpec(b + "post_attention_norm.weight", (E,), "norm"),
                    TensorSpec(b + "attn_k_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "attn_q_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "ffn_gate.weight", (E, F), "linear"),
                    TensorSpec(b + "ffn_up.weight", (E, F), "linear"),
                    TensorSpec(b + "ffn_down.weight", (F, E), "linear"),
                    TensorSpec(b + "post_ffw_norm.weight", (E,), "norm")]
        elif p.arch == "qwen3":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "attn_q.weight", (E, n_q), "qk"),
                    TensorSpec(b + "attn_k.weight", (E, n_kv), "qk"),
                    TensorSpec(b + "attn_v.weight", (E, p.n_head_kv * hv), "linear"),
                    TensorSpec(b + "attn_output.weight", (p.n_head * hv, E), "linear"),
                    TensorSpec(b + "attn_k_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "attn_q_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "ffn_gate.weight", (E, F), "linear"),
                    TensorSpec(b + "ffn_down.weight", (F, E), "linear"),
                    TensorSpec(b + "ffn_up.weight", (E, F), "linear")]
        elif p.arch == "starcoder2":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "attn_norm.bias", (E,), "bias"),
                    TensorSpec(b + "attn_q.weight", (E, n_q), "qk"),
                    TensorSpec(b + "attn_k.weight", (E, n_kv), "qk"),
                    TensorSpec(b + "attn_v.weight", (E, p.n_head_kv * hv), "linear"),
                    TensorSpec(b + "attn_q.bias", (n_q,), "bias"),
                    TensorSpec(b + "attn_k.bias", (n_kv,), "bias"),
                    TensorSpec(b + "attn_v.bias", (p.n_head_kv * hv,), "bias"),
                    TensorSpec(b + "attn_output.weight", (n_q, E), "linear"),
                    TensorSpec(b + "attn_output.bias", (E,), "bias"),
                    TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "ffn_norm.bias", (E,), "bias"),
                    TensorSpec(b + "ffn_down.weight", (F, E), "linear"),
                    TensorSpec(b + "ffn_up.weight", (E, F), "linear"),
                    TensorSpec(b + "ffn_down.bias", (E,), "bias"),
                    TensorSpec(b + "ffn_up.bias", (F,), "bias")]
        else:  # pragma: no cover - presets only use the archs above
            raise AssertionError(p.arch)
    return out


def arch_kvs(p: Preset) -> list[tuple[str, Any, GGUFValueType]]:
    """The <arch>.* keys these loaders read beyond presets.arch_kvs."""
    if p.arch == "starcoder2":  # LayerNorm: its epsilon under the key of a norm with a bias
        return [(f"{p.arch}.attention.layer_norm_epsilon", p.rms_eps, GGUFValueType.FLOAT32)]
    if p.sliding_window:
        # gemma3: with the key, layers 0-4 of every 6 attend over the window (the default pattern)
        return [(f"{p.arch}.attention.sliding_window", p.sliding_window, GGUFValueType.UINT32)]
    return []
