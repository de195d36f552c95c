"""Can a long KV cache be written instead of computed, for timing what runs after it?

Timing a pass after N cells needs N cells in the KV cache. Filling them by evaluating a prompt costs
the prompt's time (Llama-3-8B cut to 1 layer, 4096 tokens at 1 thread: about 13 s; 8192: about 38 s),
which is why the calibration times attention only up to 1024 cells. A pass's cost does not depend on the
cached values (no op of a dense attention skips work by value), only on how many cells there are, so the
cache could be restored from a sequence state written for N cells: the state of a short real fill
(`llama_state_seq_get_data`), its cells repeated up to N with positions 0..N-1, restored with
`llama_state_seq_set_data`. This script times the same passes after the cells three ways, in one load:
`computed` (a real prompt of N tokens, timed right after it, each round), `restored` (that round's computed
cells saved and restored) and `written` (the short fill's cells repeated); restored and written alternate
rep by rep, so their ratio is paired against the VM's drift, and restored against computed says whether
restoring alone changes a pass:

    python bench/scripts/bench_kvsynth.py MODEL.gguf --cells 4096 [--seed-cells 1024] [--threads 1]
        [--rounds 3] [--reps 5] [--fa on --cache f16] --out bench/results/SET

Passes timed after the N cells: a decode pass (1 token) and a 512-token prompt pass, each as a whole
(wall time, synchronised; `realpass.timed_eval`). Writes SET/kvsynth-<model>-<N>-fa<on/off>-<cache>.json (every run, fill
times, settings, commit, machine, load averages) and a line of the table to SET/kvsynth.md. CPU only,
models with one KV cache (no sliding window). Nothing else may run on the machine meanwhile."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import struct
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from provenance import git_commit  # bench/scripts/provenance.py (the script's own directory is on sys.path)


def _state(llm: Any) -> bytes:
    """Sequence 0's state (its KV cells), as llama.cpp writes it."""
    import llama_cpp

    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    if n != size:
        raise SystemExit(f"llama_state_seq_get_data wrote {n} of {size} bytes")
    return bytes(buf)


def widen(state: bytes, n_cells: int) -> bytes:
    """The state of one stream's cells (a magic and the sequence id; then llama_kv_cache::state_write: n_stream; cell_count; per cell pos,
    n_seq_id, seq ids; v_trans, n_layer; per layer K type, row bytes, rows; per layer V the same, or with a
    transposed V type, element bytes, rows' width and each row's elements) with its cells repeated up to
    n_cells, at positions 0..n_cells-1. Raises on any other layout (several streams, cell extensions)."""
    off = 0

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal off
        v = struct.unpack_from("<" + fmt, state, off)
        off += struct.calcsize("<" + fmt)
        return v

    magic, seq = take("Ii")  # llama_context::state_seq_get_data's header
    (n_stream,) = take("I")
    (count,) = take("I")
    if n_stream != 1 or count == 0:
        raise SystemExit(f"state: {n_stream} stream(s), {count} cell(s): one stream with cells expected")
    for _ in range(count):
        _, n_seq = take("iI")
        if n_seq != 1:
            raise SystemExit("state: a cell of several sequences (or with extensions): not handled")
        take("i")
    v_trans, n_layer = take("II")
    out = [struct.pack("<IiII", magic, seq, 1, n_cells)]
    out += [struct.pack("<iIi", p, 1, 0) for p in range(n_cells)]
    out.append(struct.pack("<II", v_trans, n_layer))

    def rows(data: bytes, row: int) -> bytes:  # count rows of `row` bytes -> n_cells rows, repeated
        reps, rest = divmod(n_cells, count)
        return data * reps + data[:rest * row]

    for _ in range(n_layer):  # K: every layer's
        k_type, k_row = take("iQ")
        out.append(struct.pack("<iQ", k_type, k_row) + rows(state[off:off + count * k_row], k_row))
        off += count * k_row
    for _ in range(n_layer):  # V
        if not v_trans:
            v_type, v_row = take("iQ")
            out.append(struct.pack("<iQ", v_type, v_row) + rows(state[off:off + count * v_row], v_row))
            off += count * v_row
        else:
            v_type, el, width = take("iII")
            out.append(struct.pack("<iII", v_type, el, width))
            for _ in range(width):
                out.append(rows(state[off:off + count * el], el))
                off += count * el
    if off != len(state):
        raise SystemExit(f"state: {len(state) - off} bytes left unread: not the layout this script knows")
    return b"".join(out)


def _restore(llm: Any, state: bytes, tokens: list[int]) -> None:
    """Sequence 0's cells from `state`; the generation continues after them (tokens: what they stand for)."""
    import llama_cpp

    llm.reset()
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buf, len(state), 0) != len(state):
        raise SystemExit("llama_state_seq_set_data refused the written state")
    llm.input_ids[:len(tokens)] = tokens
    llm.n_tokens = len(tokens)


def measure(model: Path, cells: int, seed: int, threads: int, rounds: int, reps: int, fa: str,
            cache: str) -> dict[str, Any]:
    from oallama.planner.cost.realpass import timed_eval
    from oallama.runtime.generate import prompt_tokens
    from oallama.runtime.kvcache import llama_kwargs
    from oallama.runtime.llama import Llama

    prompt = 512
    n_ctx = -(-(cells + prompt + 1) // 256) * 256
    llm = Llama(str(model), n_gpu_layers=0, op_offload=False, n_ctx=n_ctx, n_batch=prompt, n_ubatch=prompt,
                n_threads=threads, n_threads_batch=threads, verbose=False, **llama_kwargs(fa == "on", cache, cache))
    try:
        toks = prompt_tokens(llm, n_ctx)
        llm.eval(toks[:seed])
        wide = widen(_state(llm), cells)
        kinds = ("computed", "restored", "written")
        runs: dict[str, dict[str, list[float]]] = {k: {"1": [], str(prompt): []} for k in kinds}
        fills: dict[str, list[float]] = {k: [] for k in kinds}

        def timed(kind: str) -> None:
            for n in (1, prompt):
                r = timed_eval(llm, None, toks[:cells], toks[cells:cells + n], [])
                runs[kind][str(n)].append(r.wall_us)

        for rnd in range(rounds):
            print(f"round {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            llm.reset()
            llm.eval(toks[:cells])  # the cache computed: a real prompt of `cells` tokens
            fills["computed"].append(time.perf_counter() - t0)
            for _ in range(reps):
                timed("computed")
            real = _state(llm)
            # then rep by rep, alternated: the computed cells restored, and the written ones
            for rep in range(reps):
                for kind in (("restored", "written") if (rnd + rep) % 2 == 0 else ("written", "restored")):
                    t0 = time.perf_counter()
                    _restore(llm, real if kind == "restored" else wide, toks[:cells])
                    fills[kind].append(time.perf_counter() - t0)
                    timed(kind)
    finally:
        llm.close()
    return {"runs_us": runs, "fill_s": fills, "state_bytes": len(wide)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--cells", type=int, default=4096, help="KV cells before the timed passes")
    ap.add_argument("--seed-cells", type=int, default=1024, help="cells filled for real and repeated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per pass, fill and round")
    ap.add_argument("--fa", choices=("on", "off"), default="on")
    ap.add_argument("--cache", default="f16", help="K and V cache type")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if not a.model.is_file():
        raise SystemExit(f"{a.model}: no such model file")
    load0 = os.getloadavg()
    res = measure(a.model, a.cells, a.seed_cells, a.threads, a.rounds, a.reps, a.fa, a.cache)
    res.update(model=a.model.name, cells=a.cells, seed_cells=a.seed_cells, commit=git_commit(),
               machine=platform.node(), cpu=platform.processor(), date=date.today().isoformat(), threads=a.threads,
               rounds=a.rounds, reps=a.reps, flash_attn=a.fa, cache_type=a.cache, loadavg_before=load0,
               loadavg_after=os.getloadavg())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"kvsynth-{a.model.stem}-{a.cells}-fa{a.fa}-{a.cache}.json").write_text(json.dumps(res, indent=1) + "\n")
    cols = []
    for n in ("1", "512"):
        r = res["runs_us"]
        c, rs, w = (statistics.median(r[k][n]) for k in ("computed", "restored", "written"))
        paired = statistics.median(x / y for x, y in zip(r["written"][n], r["restored"][n], strict=True))
        cols.append(f"{c / 1e3:.2f} / {rs / 1e3:.2f} / {w / 1e3:.2f} ms (written / restored paired "
                    f"{paired:.3f})")
    fill = " / ".join(f"{statistics.median(res['fill_s'][k]):.2f}" for k in ("computed", "restored", "written"))
    line = (f"| {a.model.name} | {a.cells} | {a.fa}, {a.cache}, {a.threads} thr | {cols[0]} | {cols[1]} | {fill} s | "
            f"{load0[0]:.2f}-{res['loadavg_after'][0]:.2f} | {res['commit'][:10]} |\n")
    md = a.out / "kvsynth.md"
    if not md.exists():
        md.write_text("| model | cells | settings | decode pass: computed / restored / written | 512-token pass: "
                      "the same | fill: computed / restored / written | load avg | commit |\n"
                      "|---|---|---|---|---|---|---|---|\n")
    with md.open("a") as f:
        f.write(line)
    print(line, end="")


if __name__ == "__main__":
    main()
