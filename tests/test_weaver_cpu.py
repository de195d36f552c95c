"""Weaver on the CPU (oallama.weaver.cpu, patch 0008): a cold model's llama.cpp decode serves
offloaded attention tasks at polling points between its graph nodes and inside its matmuls."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oallama import Llama, _core
from oallama.weaver.cpu import ColdOp, CpuPoller, cut_times, pieces_of, receiver_ops, record_ops
from oallama.weaver.host import Receiver, Sender, decode_attention
from oallama.weaver.splitting import plan_splits

N_HEAD, N_KV, HEAD_DIM, CTX = 4, 2, 64, 16


@pytest.fixture(scope="module")
def cold(synth_model) -> Iterator[Llama]:
    # one thread (one "queue"), plain weights: repacked matmuls have no chunk polling points
    path: Path = synth_model("tiny", "q4_k_m")
    llm = Llama(str(path), n_threads=1, n_threads_batch=1, n_ctx=256, layouts={"output.weight": "CPU"}, verbose=False)
    llm.eval([1, 2, 3])
    yield llm
    llm.close()


def _step(llm: Llama) -> None:
    if llm.n_tokens > 200:
        llm.reset()
        llm.eval([1, 2, 3])
    llm.eval([7])


@pytest.fixture()
def ring() -> Iterator[tuple[Receiver, Sender]]:
    rx = Receiver(n_head=N_HEAD, n_head_kv=N_KV, head_dim=HEAD_DIM, max_seqs=2, max_ctx=64, dtype="f32")
    rng = np.random.default_rng(0)
    rx.load_kv(0, rng.standard_normal((CTX, N_KV, HEAD_DIM)).astype(np.float32),
               rng.standard_normal((CTX, N_KV, HEAD_DIM)).astype(np.float32))
    tx = Sender(rx.name)
    yield rx, tx
    tx.close()
    rx.close()


def _task(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (rng.standard_normal((N_HEAD, HEAD_DIM)).astype(np.float32),
            rng.standard_normal((N_KV, HEAD_DIM)).astype(np.float32),
            rng.standard_normal((N_KV, HEAD_DIM)).astype(np.float32))


def test_recording_names_every_node_and_the_chunked_matmuls(cold: Llama) -> None:
    ops = record_ops(lambda: _step(cold), repeats=2)
    names = [o.name for o in ops]
    assert "result_output" in names
    out = next(o for o in ops if o.name == "result_output")
    # ggml cuts a one-column matmul into chunks of 64 output rows (the vocabulary here)
    assert out.op == "MUL_MAT" and out.n_chunks == math.ceil(cold.n_vocab() / 64)
    assert all(o.us >= 0 for o in ops)
    assert all(o.n_chunks == 0 for o in ops if o.op != "MUL_MAT")
    # the planner sees chunked matmuls as splittable along their chunks, the rest as one piece
    rops = receiver_ops(ops)
    assert [r.splittable for r in rops] == [o.n_chunks > 1 for o in ops]


@pytest.mark.parametrize("mode", ["step", "node", "split"])
def test_a_posted_task_is_served_where_the_mode_polls(cold: Llama, ring: tuple[Receiver, Sender], mode: str) -> None:
    rx, tx = ring
    rng = np.random.default_rng(1)
    q, k, v = _task(rng)
    k_before, v_before = rx.kv(0)
    pieces = {"result_output": 4} if mode == "split" else None
    with CpuPoller(rx, mode, pieces=pieces) as poller:
        t = tx.post(0, CTX, q, k, v)
        _step(cold)  # the task is pending from the first polling point on
        inside = poller.stats()["served"]
        between = poller.between_steps()
    out = tx.wait(t, timeout=5.0)
    assert (inside, between) == ((0, 1) if mode == "step" else (1, 0))
    kk = np.concatenate([k_before, k[None]])
    vv = np.concatenate([v_before, v[None]])
    want = decode_attention(q, kk, vv, rx.config.scale)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pieces", [1, 2, 4, 64])
def test_split_polls_where_the_cut_falls(cold: Llama, ring: tuple[Receiver, Sender], pieces: int) -> None:
    rx, _ = ring
    n_nodes = len(record_ops(lambda: _step(cold), repeats=1, warmup=0))
    with CpuPoller(rx, "split", pieces={"result_output": pieces, "no-such-node": 8}) as poller:
        for _ in range(3):
            _step(cold)
        st = poller.stats()
    # pieces - 1 polling points inside the output matmul per decode; none for a name not in the graph
    assert st["chunk_polls"] == 3 * (pieces - 1)
    assert st["node_polls"] == 3 * n_nodes
    assert st["served"] == 0


def test_an_exception_in_serving_stops_serving_and_is_raised(cold: Llama, ring: tuple[Receiver, Sender]) -> None:
    rx, tx = ring
    calls = []

    def bad() -> None:
        calls.append(1)
        raise ValueError("task failed")

    hook = _core.PollHook(rx, bad)
    try:
        tx.post(0, CTX, *_task(np.random.default_rng(2)))
        _step(cold)  # the decode itself completes
        assert len(calls) == 1  # then the hook stopped asking
        with pytest.raises(ValueError, match="task failed"):
            hook.check()
        hook.check()  # raised once
    finally:
        hook.close()
    assert rx.poll() == 1  # the task is still there for whoever serves next


def test_one_hook_at_a_time(ring: tuple[Receiver, Sender]) -> None:
    rx, _ = ring
    with _core.PollHook(rx, rx.poll), pytest.raises(RuntimeError, match="process-wide"):
        _core.PollHook(rx, rx.poll)
    with _core.PollHook(None, None, record=True) as h:  # installable again once closed
        assert not h.closed
    with pytest.raises(ValueError, match="pieces"):
        _core.PollHook(rx, rx.poll, pieces={"x": 0})


@pytest.mark.parametrize("mode,pieces", [("bogus", None), ("split", None), ("node", {"result_output": 2})])
def test_poller_options_are_checked(ring: tuple[Receiver, Sender], mode: str, pieces: dict[str, int] | None) -> None:
    with pytest.raises(ValueError, match="mode"):
        CpuPoller(ring[0], mode, pieces=pieces)


def test_pieces_are_counted_per_op_not_per_name() -> None:
    # llama.cpp names a matmul and the rope after it alike ("Qcur-0"): only the cut matmul counts
    ops = [ColdOp("Qcur-0", "MUL_MAT", 900.0, 64), ColdOp("Qcur-0", "ROPE", 50.0, 0),
           ColdOp("result_output", "MUL_MAT", 8000.0, 128)]
    plan = plan_splits(receiver_ops(ops), sender_attention_time=0.0, offloaded_time=0.0, threshold=100.0)
    cuts = pieces_of(plan)
    assert "result_output" in cuts and cuts.get("Qcur-0", 1) == sum(1 for p in plan.pieces if p.index == 0)
    # the equal cuts PollHook makes keep each op's time
    assert sum(cut_times(ops, cuts)) == pytest.approx(sum(o.us for o in ops))

