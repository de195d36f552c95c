"""A long KV cache written instead of computed: for timing what runs after many cells.

A pass after N cells costs what N cells cost, not what they hold (no op of dense attention skips work by
value). Filling them by a real prompt costs the prompt (a 1-layer Llama-3-8B shape, 8192 tokens at 1
thread: about 38 s); writing them costs a copy. `widen` takes sequence 0's state after a short real fill
(`llama_state_seq_get_data`: a header, then llama_kv_cache::state_write) and repeats its cells up to N at
positions 0..N-1; `restore` puts it back (`llama_state_seq_set_data`) and lets generation continue after
them. Timed after a computed and a written cache, alternated, the same passes agree within the VM's
noise (bench/results/2026-11-28-vm-kv-written; bench/scripts/bench_kvsynth.py). The calibration times its
prompt spans after 3072 written cells (planner.cost.attnspan.PROMPT_TAIL) and its decode spans after the
cells a workload decodes after (attnspan.measure_decode); decode spans after fixed pasts (2048-16384),
with the decode lines bent through them, made held-out TPOT worse (bench/results/2026-11-28-vm-decode-tails).

    state = kvstate.seq_state(llm)              # after llm.eval(tokens[:1024])
    wide = kvstate.widen(state, 8192)           # None: a cache this does not know (SWA, recurrent)
    kvstate.restore(llm, wide, tokens[:8192])   # llm.n_ctx() >= 8192 + the next pass
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import llama_cpp

from ..errors import OallamaError


def seq_state(llm: Any) -> bytes:
    """Sequence 0's state (its KV cells), as llama.cpp writes it."""
    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    if size == 0 or llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0) != size:
        raise OallamaError(f"llama_state_seq_get_data: could not read sequence 0's state ({size} bytes)")
    return bytes(buf)


def widen(state: bytes, n_cells: int) -> bytes | None:
    """`state` with its cells repeated up to n_cells at positions 0..n_cells-1, or None for a layout
    other than one stream of one KV cache (llama_kv_cache::state_write: n_stream; cell_count; per cell
    pos, n_seq_id, its ids; v_trans, n_layer; per layer K type, row bytes, rows; per layer V the same,
    or transposed: type, element bytes, row width, each row's elements)."""
    off = 0

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal off
        v = struct.unpack_from("<" + fmt, state, off)
        off += struct.calcsize("<" + fmt)
        return v

    try:
        magic, seq, n_stream, count = take("IiII")
        if n_stream != 1 or count == 0:
            return None
        for _ in range(count):
            _, n_seq = take("iI")
            if n_seq != 1:  # several sequences, or cell extensions (M-RoPE)
                return None
            take("i")
        v_trans, n_layer = take("II")
        reps, rest = divmod(n_cells, count)

        def rows(size: int) -> bytes:  # the next `count` rows of `size` bytes, repeated to n_cells rows
            nonlocal off
            data = state[off:off + count * size]
            off += count * size
            return data * reps + data[:rest * size]

        out = [struct.pack("<IiII", magic, seq, 1, n_cells), *(struct.pack("<iIi", p, 1, 0) for p in range(n_cells)),
               struct.pack("<II", v_trans, n_layer)]
        for _ in range(n_layer):  # K
            k_type, k_row = take("iQ")
            out += [struct.pack("<iQ", k_type, k_row), rows(k_row)]
        for _ in range(n_layer):  # V
            if not v_trans:
                v_type, v_row = take("iQ")
                out += [struct.pack("<iQ", v_type, v_row), rows(v_row)]
            else:
                v_type, el, width = take("iII")
                out.append(struct.pack("<iII", v_type, el, width))
                out += [rows(el) for _ in range(width)]
    except struct.error:
        return None
    return b"".join(out) if off == len(state) else None  # bytes left: another layout (an SWA cache's second)


def restore(llm: Any, state: bytes, tokens: list[int]) -> None:
    """Sequence 0's cells from `state` (written for len(tokens) cells); the next eval continues after
    them, as after evaluating `tokens`."""
    llm.reset()
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buf, len(state), 0) != len(state):
        raise OallamaError(f"llama_state_seq_set_data refused a state of {len(tokens)} cells (n_ctx {llm.n_ctx()})")
    llm.input_ids[:len(tokens)] = tokens
    llm.n_tokens = len(tokens)
