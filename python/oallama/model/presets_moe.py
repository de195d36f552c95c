"""Mixture-of-experts presets for `oallama synth`: Qwen3-MoE (`qwen3moe`) and gpt-oss (`gpt-oss`,
llama.cpp's LLM_ARCH_OPENAI_MOE), full-size shapes and small variants that run on a laptop.

oallama.model.synthetic offers these beside the dense presets (its PRESETS table). Tensors and keys follow
llama.cpp's loaders (src/models/qwen3moe.cpp, src/models/openai-moe.cpp: load_arch_hparams,
load_arch_tensors) and what convert_hf_to_gguf.py writes for the real checkpoints. Expert weights
are 3-D, ggml order [n_in, n_out, n_expert]; llama.cpp multiplies them with MUL_MAT_ID.
"""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType, TokenType

from .presets import _QWQ_ADDED, QWQ_TEMPLATE, MoE, Preset, TensorSpec

__all__ = ["MOE_PRESETS", "MoE", "arch_kvs", "tensor_layout"]


# openai/gpt-oss-20b: the harmony format, cut down to plain turns (the checkpoint's template,
# llama.cpp's models/templates/openai-gpt-oss-120b.jinja, adds tools, reasoning and channels;
# llama.cpp recognises both by "<|channel|>")
HARMONY_TEMPLATE = (
    "{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n"
    "Knowledge cutoff: 2024-06\\n\\nReasoning: medium\\n\\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'system' -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' -}}"
    "{%- else -%}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

# o200k_harmony's special tokens (ids of the real vocabulary, 201088 rows); the rest of the
# vocabulary is llama-bpe's (o200k itself is not among llama.cpp's test vocabularies), padded
_HARMONY_NAMED = {
    199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
    200018: "<|endofprompt|>",
}
_HARMONY_ADDED: dict[int, tuple[str, TokenType]] = {
    i: (_HARMONY_NAMED.get(i, f"<|reserved_{i}|>"), TokenType.CONTROL) for i in range(199998, 200019)
}
_HARMONY_IDS = {"bos": 199998, "eos": 200002, "padding": 199999}
_QWEN3_IDS = {"bos": 151643, "eos": 151645, "padding": 151643}

MOE_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="qwen3-30b-a3b",
            arch="qwen3moe",
            description="Qwen/Qwen3-30B-A3B (128 experts, 8 used; qwen2 vocab padded to 151936 rows)",
            n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, n_ff=6144, n_ctx=40960,
            vocab="qwen2", n_vocab=151936,
            rope_freq_base=1000000.0, rms_eps=1e-6,
            chat_template=QWQ_TEMPLATE,
            head_dim=128, head_dim_v=128,
            added_tokens=_QWQ_ADDED, token_ids=_QWEN3_IDS, add_bos=False,
            moe=MoE(n_expert=128, n_expert_used=8, n_ff_exp=768),
        ),
        Preset(
            name="qwen3moe-small",
            arch="qwen3moe",
            description="qwen3moe, 2 layers of n_embd 256, 128 experts (8 used) of 256: ~90 MB at q4_k_m",
            n_embd=256, n_layer=2, n_head=4, n_head_kv=1, n_ff=768, n_ctx=40960,
            vocab="qwen2", n_vocab=151936,
            rope_freq_base=1000000.0, rms_eps=1e-6,
            chat_template=QWQ_TEMPLATE,
            head_dim=128, head_dim_v=128,
            added_tokens=_QWQ_ADDED, token_ids=_QWEN3_IDS, add_bos=False,
            moe=MoE(n_expert=128, n_expert_used=8, n_ff_exp=256),
        ),
        Preset(
            name="gpt-oss-20b",
            arch="gpt-oss",
            description="openai/gpt-oss-20b (32 experts, 4 used, SWA on even layers, attention sinks; "
            "llama-bpe vocab padded to 201088 with harmony tokens; use --type mxfp4_moe)",
            n_embd=2880, n_layer=24, n_head=64, n_head_kv=8, n_ff=2880, n_ctx=131072,
            vocab="llama-bpe", n_vocab=201088,
            rope_freq_base=150000.0, rms_eps=1e-5,
            chat_template=HARMONY_TEMPLATE,
            qkv_bias=True,
            head_dim=64, head_dim_v=64,
            added_tokens=_HARMONY_ADDED, token_ids=_HARMONY_IDS, add_bos=False,
            moe=MoE(n_expert=32, n_expert_used=4, n_ff_exp=2880, sliding_window=128, rope_yarn=(32.0, 4096)),
        ),
        Preset(
            name="gpt-oss-small",
            arch="gpt-oss",
            description="gpt-oss, 4 layers of n_embd 128, 32 experts (4 used) of 128: ~70 MB at mxfp4_moe",
            n_embd=128, n_layer=4, n_head=4, n_head_kv=2, n_ff=128, n_ctx=131072,
            vocab="llama-bpe", n_vocab=201088,
            rope_freq_base=150000.0, rms_eps=1e-5,
            chat_template=HARMONY_TEMPLATE,
            qkv_bias=True,
            head_dim=64, head_dim_v=64,
            added_tokens=_HARMONY_ADDED, token_ids=_HARMONY_IDS, add_bos=False,
            moe=MoE(n_expert=32, n_expert_used=4, n_ff_exp=128, sliding_window=128, rope_yarn=(32.0, 4096)),
        ),
    ]
}


def _moe(p: Preset) -> MoE:
    if p.moe is None:
        raise ValueError(f"preset {p.name} is not a mixture of experts")
    return p.moe


def tensor_layout(p: Preset, n_layer: int) -> list[TensorSpec]:
    """Every tensor llama.cpp's qwen3moe / gpt-oss loader creates, in its create order."""
    moe = _moe(p)
    E, V, X, F = p.n_embd, p.n_vocab, moe.n_expert, moe.n_ff_exp
    hk = p.n_embd_head_k
    n_q, n_kv = p.n_head * hk, p.n_head_kv * hk  # query / key-value widths
    out = [TensorSpec("token_embd.weight", (E, V), "embd"), TensorSpec("output_norm.weight", (E,), "output_norm"),
           TensorSpec("output.weight", (E, V), "output")]
    # experts: gate/up [n_embd, n_ff_exp, n_expert], down [n_ff_exp, n_embd, n_expert]
    exps = [TensorSpec("ffn_gate_exps.weight", (E, F, X), "linear"),
            TensorSpec("ffn_down_exps.weight", (F, E, X), "linear"),
            TensorSpec("ffn_up_exps.weight", (E, F, X), "linear")]
    for i in range(n_layer):
        b = f"blk.{i}."
        qkv = [TensorSpec(b + "attn_q.weight", (E, n_q), "qk"), TensorSpec(b + "attn_k.weight", (E, n_kv), "qk"),
               TensorSpec(b + "attn_v.weight", (E, n_kv), "linear")]
        router = TensorSpec(b + "ffn_gate_inp.weight", (E, X), "linear")  # [n_embd, n_expert]
        if p.arch == "qwen3moe":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"), *qkv,
                    TensorSpec(b + "attn_output.weight", (n_q, E), "linear"),
                    TensorSpec(b + "attn_k_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "attn_q_norm.weight", (hk,), "norm"),
                    TensorSpec(b + "ffn_norm.weight", (E,), "norm"), router,
                    *[TensorSpec(b + s.name, s.shape, s.kind) for s in exps]]
        elif p.arch == "gpt-oss":
            out += [TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                    TensorSpec(b + "post_attention_norm.weight", (E,), "norm"), *qkv,
                    TensorSpec(b + "attn_q.bias", (n_q,), "bias"), TensorSpec(b + "attn_k.bias", (n_kv,), "bias"),
                    TensorSpec(b + "attn_v.bias", (n_kv,), "bias"),
                    TensorSpec(b + "attn_output.weight", (n_q, E), "linear"),
                    TensorSpec(b + "attn_sinks.weight", (p.n_head,), "sinks"),  # one logit per head
                    router, *[TensorSpec(b + s.name, s.shape, s.kind) for s in exps],
                    TensorSpec(b + "attn_output.bias", (E,), "bias"),
                    TensorSpec(b + "ffn_gate_inp.bias", (X,), "bias"),
                    TensorSpec(b + "ffn_gate_exps.bias", (F, X), "bias"),
                    TensorSpec(b + "ffn_down_exps.bias", (E, X), "bias"),
                    TensorSpec(b + "ffn_up_exps.bias", (F, X), "bias")]
        else:  # pragma: no cover - presets only use the archs above
            raise AssertionError(p.arch)
    return out


def arch_kvs(p: Preset) -> list[tuple[str, Any, GGUFValueType]]:
    """The <arch>.* keys a mixture of experts adds to the dense ones (presets.arch_kvs)."""
    moe, a = _moe(p), p.arch
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    kv: list[tuple[str, Any, GGUFValueType]] = [
        (f"{a}.expert_count", moe.n_expert, u32),
        (f"{a}.expert_used_count", moe.n_expert_used, u32),
        (f"{a}.expert_feed_forward_length", moe.n_ff_exp, u32),
    ]
    if moe.sliding_window:
        # no sliding_window_pattern key: llama.cpp's gpt-oss loader defaults to a pattern of 2
        # (even layers sliding-window, odd layers full attention), as the checkpoint has it
        kv.append((f"{a}.attention.sliding_window", moe.sliding_window, u32))
    if moe.rope_yarn is not None:
        factor, orig_ctx = moe.rope_yarn
        kv += [(f"{a}.rope.scaling.type", "yarn", GGUFValueType.STRING),
               (f"{a}.rope.scaling.factor", factor, f32),
               (f"{a}.rope.scaling.original_context_length", orig_ctx, u32)]
    return kv

