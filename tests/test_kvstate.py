"""A KV cache written instead of computed (runtime.kvstate): restored into a real load, it holds the
cells it was widened to, and the next pass runs after them as after a prompt of that many tokens."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from oallama.planner.cost import attnspan
from oallama.runtime import kvcache, kvstate
from oallama.runtime.generate import prompt_tokens
from oallama.runtime.llama import Llama


@pytest.mark.parametrize("fa,cache", [("on", "f16"), ("off", "f16"), ("on", "q8_0")],
                         ids=["fa-on-f16", "fa-off-f16", "fa-on-q8_0"])
def test_a_written_cache_holds_its_cells_and_the_next_pass_attends_them(tiny_q8: Path, fa: str, cache: str) -> None:
    llm = Llama(str(tiny_q8), n_gpu_layers=0, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, verbose=False,
                **kvcache.llama_kwargs(fa == "on", cache, cache))
    try:
        toks = prompt_tokens(llm, 1024)
        llm.eval(toks[:64])
        state = kvstate.seq_state(llm)
        wide = kvstate.widen(state, 700)
        assert wide is not None and kvstate.widen(state, 64) == state  # its own length: the same bytes
        kvstate.restore(llm, wide, toks[:700])
        mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
        assert llama_cpp.llama_memory_seq_pos_min(mem, 0) == 0 and llama_cpp.llama_memory_seq_pos_max(mem, 0) == 699
        # a decode pass after them: its attention's work is a 700-cell pass's (as after a computed cache)
        written = attnspan.node_list(llm, toks, 1, 700)
        assert llm.n_tokens == 701
        llm.reset()
        llm.eval(toks[:700])
        computed = attnspan.node_list(llm, toks, 1, 700)
        assert [(r.op, list(r.ne)) for r in written] == [(r.op, list(r.ne)) for r in computed]
        assert attnspan.works(written, 1, 700) == attnspan.works(computed, 1, 700)
    finally:
        llm.close()


def test_a_state_not_of_one_cache_is_not_widened() -> None:
    assert kvstate.widen(b"\x00" * 12, 100) is None  # no cells
    assert kvstate.widen(b"\x01\x02", 100) is None  # truncated
