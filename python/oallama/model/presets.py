"""Architecture presets for `oallama synth`: shapes, hyper-parameters, tokenizers and chat
templates of real models, so that synthetic GGUFs exercise llama.cpp exactly like the real ones.

A preset says *what* a model looks like; `oallama.model.synthetic` decides the values and writes the
file. Everything here follows what llama.cpp's loader reads (src/llama-model.cpp,
src/models/<arch>.cpp) and what convert_hf_to_gguf.py writes for the real checkpoint.

Shapes are in ggml order: ne[0] (the row length, the matmul's input dimension) first.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, TokenType

from .. import _libs

# --------------------------------------------------------------------------------------------
# chat templates (the checkpoints' own, as in their tokenizer_config.json)
# --------------------------------------------------------------------------------------------

# meta-llama/Llama-2-7b-chat-hf
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Qwen/QwQ-32B (as kept in llama.cpp's models/templates/Qwen-QwQ-32B.jinja)
QWQ_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
  {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {%- set content = message.content %}
        {%- if not loop.last %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if not loop.last %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}
"""

# openbmb/MiniCPM3-4B: chatml with a default system turn (the checkpoint's tool-calling
# extensions are left out; llama.cpp detects this as chatml either way)
MINICPM3_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------

# token ids the real checkpoints add on top of the base vocabulary: id -> (text, token type)
_QWQ_ADDED: dict[int, tuple[str, TokenType]] = {
    151646 + i: (t, TokenType.CONTROL)
    for i, t in enumerate(
        [
            "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
            "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
        ]
    )
} | {
    151657: ("<tool_call>", TokenType.USER_DEFINED),
    151658: ("</tool_call>", TokenType.USER_DEFINED),
    151659: ("<|fim_prefix|>", TokenType.CONTROL),
    151660: ("<|fim_middle|>", TokenType.CONTROL),
    151661: ("<|fim_suffix|>", TokenType.CONTROL),
    151662: ("<|fim_pad|>", TokenType.CONTROL),
    151663: ("<|repo_name|>", TokenType.CONTROL),
    151664: ("<|file_sep|>", TokenType.CONTROL),
    151665: ("<tool_response>", TokenType.USER_DEFINED),
    151666: ("</tool_response>", TokenType.USER_DEFINED),
    151667: ("<think>", TokenType.USER_DEFINED),
    151668: ("</think>", TokenType.USER_DEFINED),
}

_MINICPM3_ADDED: dict[int, tuple[str, TokenType]] = {
    73440 + i: (t, TokenType.CONTROL)
    for i, t in enumerate(
        [
            "<|im_end|>", "<|im_start|>", "<|tool_call|>", "<|execute_start|>", "<|execute_end|>",
            "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
        ]
    )
}


@dataclass(frozen=True)
class MoE:
    """What a mixture-of-experts preset adds to a dense one. Sizes are element counts."""

    n_expert: int  # <arch>.expert_count
    n_expert_used: int  # <arch>.expert_used_count: experts each token is routed to
    n_ff_exp: int  # <arch>.expert_feed_forward_length: rows of one expert's gate/up
    sliding_window: int = 0  # gpt-oss: <arch>.attention.sliding_window (tokens), every other layer
    rope_yarn: tuple[float, int] | None = None  # (factor, original context) of yarn rope scaling


@dataclass(frozen=True)
class Preset:
    """The shape of one real model. Sizes are element counts; n_ctx is tokens."""

    name: str
    arch: str  # llama.cpp's architecture name (general.architecture)
    description: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int  # context the model was trained for (<arch>.context_length)
    vocab: str  # which oallama/vocab/ggml-vocab-<vocab>.gguf the tokenizer comes from
    n_vocab: int  # rows of token_embd/output: the base vocabulary truncated or padded to this
    rope_freq_base: float
    rms_eps: float
    chat_template: str
    tied_output: bool = False  # True: no output.weight, llama.cpp reuses token_embd
    qkv_bias: bool = False  # qwen2: attn_{q,k,v}.bias
    head_dim: int | None = None  # attention.key_length; default n_embd / n_head
    head_dim_v: int | None = None  # attention.value_length; default head_dim
    rope_dim: int | None = None  # rope.dimension_count; default head_dim
    q_lora_rank: int = 0  # MLA (minicpm3 / deepseek2): rank of the q projection
    kv_lora_rank: int = 0  # MLA: rank of the shared kv projection
    added_tokens: dict[int, tuple[str, TokenType]] = field(default_factory=dict)
    token_ids: dict[str, int] = field(default_factory=dict)  # tokenizer.ggml.<x>_token_id overrides
    add_bos: bool | None = None  # tokenizer.ggml.add_bos_token override
    keep_tokens: tuple[str, ...] = ()  # tokens that must survive truncation (take the last ids)
    embd_std: float | None = None  # std of token_embd; None: oallama.model.synthetic.EMBD_STD
    output_norm: float = 1.0  # mean of output_norm.weight (sets the logits' scale)
    moe: MoE | None = None  # mixture of experts (its presets: oallama.model.presets_moe)
    sliding_window: int = 0  # <arch>.attention.sliding_window of a dense model (tokens; gemma3: presets_arch)

    @property
    def n_embd_head_k(self) -> int:
        return self.head_dim if self.head_dim is not None else self.n_embd // self.n_head

    @property
    def n_embd_head_v(self) -> int:
        return self.head_dim_v if self.head_dim_v is not None else self.n_embd_head_k

    @property
    def n_rot(self) -> int:
        return self.rope_dim if self.rope_dim is not None else self.n_embd_head_k


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="tiny",
            arch="llama",
            description="llama-shaped, a few MB, for CI (llama-spm vocab cut to 4096 tokens)",
            n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512, n_ctx=2048,
            vocab="llama-spm", n_vocab=4096,
            rope_freq_base=10000.0, rms_eps=1e-5,
            chat_template=LLAMA2_TEMPLATE,
            # SentencePiece writes a space as U+2581; llama's lone "▁" piece (id 29871, score
            # -1e9) must stay, or a space before a byte-fallback token decodes as "▁"
            keep_tokens=("\u2581",),
        ),
        Preset(
            name="mid",
            arch="llama",
            description="llama-shaped, n_embd 1024, 16 blocks of 12.5 MB at q8_0 (~210 MB): a block's "
                        "compute outweighs a pass's fixed costs on a small CPU (distributed benchmark, timing tests)",
            n_embd=1024, n_layer=16, n_head=8, n_head_kv=4, n_ff=2816, n_ctx=2048,
            vocab="llama-spm", n_vocab=4096,
            rope_freq_base=10000.0, rms_eps=1e-5,
            chat_template=LLAMA2_TEMPLATE,
            keep_tokens=("\u2581",),
        ),
        Preset(
            name="llama3-8b",
            arch="llama",
            description="Meta-Llama-3-8B(-Instruct)",
            n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_ctx=8192,
            vocab="llama-bpe", n_vocab=128256,
            rope_freq_base=500000.0, rms_eps=1e-5,
            chat_template=LLAMA3_TEMPLATE,
        ),
        Preset(
            name="qwq-32b",
            arch="qwen2",
            description="Qwen/QwQ-32B (qwen2 vocab padded to 152064 rows)",
            n_embd=5120, n_layer=64, n_head=40, n_head_kv=8, n_ff=27648, n_ctx=40960,
            vocab="qwen2", n_vocab=152064,
            rope_freq_base=1000000.0, rms_eps=1e-5,
            chat_template=QWQ_TEMPLATE,
            qkv_bias=True,
            added_tokens=_QWQ_ADDED,
            token_ids={"bos": 151643, "eos": 151645, "padding": 151643},
            add_bos=False,
        ),
        Preset(
            name="minicpm3-4b",
            arch="minicpm3",
            description="openbmb/MiniCPM3-4B (MLA attention, tied embeddings; llama-spm vocab padded)",
            n_embd=2560, n_layer=62, n_head=40, n_head_kv=40, n_ff=6400, n_ctx=32768,
            vocab="llama-spm", n_vocab=73448,
            rope_freq_base=10000.0, rms_eps=1e-5,
            chat_template=MINICPM3_TEMPLATE,
            tied_output=True,
            # small: the embedding is scaled by 12 into the residual stream and is also the
            # output matrix; a big one makes every token predict itself (see synthetic.py)
            embd_std=0.002,
            # logits = (256/2560) * output_norm * h . embd, |h| ~ sqrt(2560): std ~1 with 100
            output_norm=100.0,
            head_dim=96,  # qk_nope_head_dim 64 + qk_rope_head_dim 32
            head_dim_v=64,
            rope_dim=32,
            q_lora_rank=768,
            kv_lora_rank=256,
            added_tokens=_MINICPM3_ADDED,
        ),
    ]
}


# --------------------------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write. kind says how its values are drawn (see oallama.model.synthetic)."""

    name: str
    shape: tuple[int, ...]  # ggml order, ne[0] first
    # "embd" | "output" | "linear" | "qk" (makes queries or keys) | "q_mla" (MLA's q_b: makes
    # queries against normalized keys) | "norm" | "output_norm" | "bias" | "rope_long" | "rope_short"
    # | "sinks" (gpt-oss attention sinks, f32 logits)
    kind: str


def tensor_layout(p: Preset, n_layer: int) -> list[TensorSpec]:
    """Every tensor llama.cpp's loader creates for this preset, in the loader's create order."""
    E, F, V = p.n_embd, p.n_ff, p.n_vocab
    hk, hv = p.n_embd_head_k, p.n_embd_head_v
    n_q = p.n_head * hk  # query width
    n_kv = p.n_head_kv * hk  # key/value width (GQA)
    out: list[TensorSpec] = [TensorSpec("token_embd.weight", (E, V), "embd")]
    out.append(TensorSpec("output_norm.weight", (E,), "output_norm"))
    if not p.tied_output:
        out.append(TensorSpec("output.weight", (E, V), "output"))
    if p.arch == "minicpm3":
        # read once (layer 0) and shared by all layers: get_rope_factors() picks long or short
        # by n_ctx_seq > n_ctx_orig_yarn; {n_rot/2} f32 frequency divisors
        out.append(TensorSpec("rope_factors_long.weight", (p.n_rot // 2,), "rope_long"))
        out.append(TensorSpec("rope_factors_short.weight", (p.n_rot // 2,), "rope_short"))

    for i in range(n_layer):
        b = f"blk.{i}."
        out.append(TensorSpec(b + "attn_norm.weight", (E,), "norm"))
        if p.arch in ("llama", "qwen2"):
            out += [
                TensorSpec(b + "attn_q.weight", (E, n_q), "qk"),
                TensorSpec(b + "attn_k.weight", (E, n_kv), "qk"),
                TensorSpec(b + "attn_v.weight", (E, p.n_head_kv * hv), "linear"),
            ]
            if p.qkv_bias:
                out += [
                    TensorSpec(b + "attn_q.bias", (n_q,), "bias"),
                    TensorSpec(b + "attn_k.bias", (n_kv,), "bias"),
                    TensorSpec(b + "attn_v.bias", (p.n_head_kv * hv,), "bias"),
                ]
            out.append(TensorSpec(b + "attn_output.weight", (p.n_head * hv, E), "linear"))
        elif p.arch == "minicpm3":
            rope, nope = p.n_rot, hk - p.n_rot
            out += [
                TensorSpec(b + "attn_q_a_norm.weight", (p.q_lora_rank,), "norm"),
                TensorSpec(b + "attn_kv_a_norm.weight", (p.kv_lora_rank,), "norm"),
                TensorSpec(b + "attn_q_a.weight", (E, p.q_lora_rank), "linear"),
                # k comes out of a norm (kv_a_norm) except its small rope part: q carries the
                # whole query-key gain
                TensorSpec(b + "attn_q_b.weight", (p.q_lora_rank, p.n_head * hk), "q_mla"),
                # compressed kv and the shared rope key, side by side
                TensorSpec(b + "attn_kv_a_mqa.weight", (E, p.kv_lora_rank + rope), "linear"),
                TensorSpec(b + "attn_kv_b.weight", (p.kv_lora_rank, p.n_head * (nope + hv)), "linear"),
                TensorSpec(b + "attn_output.weight", (p.n_head * hv, E), "linear"),
            ]
        else:  # pragma: no cover - presets only use the archs above
            raise AssertionError(p.arch)
        out += [
            TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
            TensorSpec(b + "ffn_gate.weight", (E, F), "linear"),
            TensorSpec(b + "ffn_down.weight", (F, E), "linear"),
            TensorSpec(b + "ffn_up.weight", (E, F), "linear"),
        ]
    return out


def arch_kvs(p: Preset, n_layer: int) -> list[tuple[str, Any, GGUFValueType]]:
    """The <arch>.* hyper-parameter keys llama.cpp's loader reads for this preset."""
    a = p.arch
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    kv: list[tuple[str, Any, GGUFValueType]] = [
        (f"{a}.context_length", p.n_ctx, u32),
        (f"{a}.embedding_length", p.n_embd, u32),
        (f"{a}.block_count", n_layer, u32),
        (f"{a}.feed_forward_length", p.n_ff, u32),
        (f"{a}.attention.head_count", p.n_head, u32),
        (f"{a}.attention.head_count_kv", p.n_head_kv, u32),
        (f"{a}.rope.freq_base", p.rope_freq_base, f32),
        (f"{a}.attention.layer_norm_rms_epsilon", p.rms_eps, f32),
        (f"{a}.vocab_size", p.n_vocab, u32),
        # llama insists rope.dimension_count == key_length ("invalid n_rot")
        (f"{a}.rope.dimension_count", p.n_rot, u32),
    ]
    if p.head_dim is not None:
        kv.append((f"{a}.attention.key_length", p.n_embd_head_k, u32))
    if p.head_dim_v is not None:
        kv.append((f"{a}.attention.value_length", p.n_embd_head_v, u32))
    if p.q_lora_rank:
        kv.append((f"{a}.attention.q_lora_rank", p.q_lora_rank, u32))
    if p.kv_lora_rank:
        kv.append((f"{a}.attention.kv_lora_rank", p.kv_lora_rank, u32))
    return kv


def quant_hparams(p: Preset, n_layer: int) -> dict[str, Any]:
    """The model description `_core.quant_compute_types` builds its mock model from."""
    return {
        "architecture": p.arch,
        "n_embd": p.n_embd,
        "n_ff": p.n_ff,
        "n_layer": n_layer,
        "n_head": p.n_head,
        "n_head_kv": p.n_head_kv,
        "n_embd_head_k": p.n_embd_head_k,
        "n_embd_head_v": p.n_embd_head_v,
        "n_expert": p.moe.n_expert if p.moe is not None else 0,
    }


# --------------------------------------------------------------------------------------------
# tokenizers, from the vocab-only GGUFs llama.cpp ships for its tokenizer tests
# --------------------------------------------------------------------------------------------

# GGUF value type -> (struct format, size) of scalars; 8 = string, 9 = array
_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
           6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
       12: "<f8"}


@dataclass(frozen=True)
class KV:
    """A GGUF metadata value: strings are bytes, string arrays lists of bytes, numeric arrays numpy."""

    type: GGUFValueType
    value: Any
    sub_type: GGUFValueType | None = None


@functools.cache
def read_tokenizer_kvs(path: Path) -> dict[str, KV]:
    """The tokenizer.* keys of a GGUF file, read fast (gguf.GGUFReader takes ~8 s on the
    280k-merge llama-bpe vocab; this takes well under a second)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = bytes(mm)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    _version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos = 24
    out: dict[str, KV] = {}

    def string(pos: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return buf[pos + 8 : pos + 8 + n], pos + 8 + n

    for _ in range(n_kv):
        key_b, pos = string(pos)
        key = key_b.decode()
        (vt,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if vt == 8:
            val: Any
            val, pos = string(pos)
            kv = KV(GGUFValueType.STRING, val)
        elif vt == 9:
            st, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if st == 8:
                items = []
                for _ in range(n):
                    (ln,) = struct.unpack_from("<Q", buf, pos)
                    items.append(buf[pos + 8 : pos + 8 + ln])
                    pos += 8 + ln
                kv = KV(GGUFValueType.ARRAY, items, GGUFValueType.STRING)
            elif st in _NP:
                arr = np.frombuffer(buf, dtype=_NP[st], count=n, offset=pos).copy()
                pos += arr.nbytes
                kv = KV(GGUFValueType.ARRAY, arr, GGUFValueType(st))
            else:
                raise ValueError(f"{path}: nested array in key {key}")
        else:
            fmt, size = _SCALAR[vt]
            (val,) = struct.unpack_from(fmt, buf, pos)
            pos += size
            kv = KV(GGUFValueType(vt), val)
        if key.startswith("tokenizer."):
            out[key] = kv
    return out


@dataclass
class Tokenizer:
    kvs: dict[str, KV]  # every tokenizer.* key to write
    token_types: np.ndarray  # [n_vocab] int32 gguf.TokenType per row


def build_tokenizer(p: Preset) -> Tokenizer:
    """The base vocabulary cut or padded to the preset's n_vocab rows, with its added tokens."""
    base = read_tokenizer_kvs(_libs.vocab_dir() / f"ggml-vocab-{p.vocab}.gguf")
    kvs = dict(base)  # shallow: the lists/arrays below are copied before they are changed
    tokens: list[bytes] = list(base["tokenizer.ggml.tokens"].value)
    types = base["tokenizer.ggml.token_type"].value.astype(np.int32)
    scores = base["tokenizer.ggml.scores"].value.astype(np.float32) if "tokenizer.ggml.scores" in base else None
    n = p.n_vocab
    if n < len(tokens):
        # SentencePiece pieces are ordered by score, so the first n keep the specials, the 256
        # byte tokens (byte fallback: any text still tokenizes) and the most frequent pieces
        keep = [tokens.index(k.encode()) for k in p.keep_tokens]
        ids = [i for i in range(n) if i not in keep][: n - len(keep)] + keep
        tokens, types = [tokens[i] for i in ids], types[ids]
        scores = scores[ids] if scores is not None else None
    elif n > len(tokens):
        extra = n - len(tokens)
        tokens += [f"[PAD{i}]".encode() for i in range(len(tokens), n)]
        types = np.concatenate([types, np.full(extra, TokenType.UNUSED, np.int32)])
        if scores is not None:
            scores = np.concatenate([scores, np.full(extra, -1e9, np.float32)])
    for tid, (text, ttype) in p.added_tokens.items():
        tokens[tid] = text.encode()
        types[tid] = ttype
        if scores is not None:
            scores[tid] = 0.0
    kvs["tokenizer.ggml.tokens"] = KV(GGUFValueType.ARRAY, tokens, GGUFValueType.STRING)
    kvs["tokenizer.ggml.token_type"] = KV(GGUFValueType.ARRAY, types, GGUFValueType.INT32)
    if scores is not None:
        kvs["tokenizer.ggml.scores"] = KV(GGUFValueType.ARRAY, scores, GGUFValueType.FLOAT32)
    for what, tid in p.token_ids.items():
        kvs[f"tokenizer.ggml.{what}_token_id"] = KV(GGUFValueType.UINT32, tid)
    if p.add_bos is not None:
        kvs["tokenizer.ggml.add_bos_token"] = KV(GGUFValueType.BOOL, p.add_bos)
    kvs["tokenizer.chat_template"] = KV(GGUFValueType.STRING, p.chat_template.encode())
    for key, kv in kvs.items():
        if key.endswith("_token_id") and not 0 <= int(kv.value) < n:
            raise ValueError(f"preset {p.name}: {key} = {kv.value} is outside the {n}-token vocabulary")
    return Tokenizer(kvs=kvs, token_types=types)

