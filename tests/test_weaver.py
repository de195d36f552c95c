"""Weaver attention offload: the CPU reference of the protocol (threads, processes, std::atomic-
style ordering in POSIX shared memory, attention in numpy), and the GPU receiver (gpu marker)."""

from __future__ import annotations

import json
import math
import mmap
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oallama import _weaver
from oallama.errors import WeaverError, WeaverTaskError, WeaverTimeoutError
from oallama.weaver.host import (
    BAD_SEQ,
    CORRUPT,
    OK,
    Receiver,
    Sender,
    bf16_bits,
    bf16_to_f32,
    decode_attention,
    from_storage,
    to_storage,
)

ROOT = Path(__file__).resolve().parent.parent


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Straightforward reference, f64, one head at a time: q [H, D], k/v [L, Hkv, D]."""
    n_head = q.shape[0]
    group = n_head // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for h in range(n_head):
        kh = k[:, h // group, :].astype(np.float64)
        vh = v[:, h // group, :].astype(np.float64)
        scores = [float(np.dot(kh[t], q[h].astype(np.float64))) * scale for t in range(k.shape[0])]
        m = max(scores)
        p = np.array([math.exp(s - m) for s in scores])
        out[h] = (p / p.sum()) @ vh
    return out


def ref_attention_fast(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """ref_attention vectorised for the stress tests (f64; each KV head repeated for its query
    heads), written apart from the receiver's decode_attention and checked against ref_attention."""
    group = q.shape[0] // k.shape[1]
    kh = np.repeat(k.astype(np.float64), group, axis=1)           # [L, H, D]
    vh = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("hd,lhd->hl", q.astype(np.float64), kh) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return np.einsum("hl,lhd->hd", p / p.sum(axis=1, keepdims=True), vh)


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """What the receiver sees of f32 values sent in ``dtype``."""
    return from_storage(to_storage(x, dtype), dtype)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---- dtypes, layout, attention --------------------------------------------------------------

def test_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 0.0, np.inf], np.float32)
    assert bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x0000, 0x7F80]
    assert np.isnan(bf16_to_f32(bf16_bits(np.array([np.nan], np.float32))))[0]
    y = np.array([3.140625, -0.0078125], np.float32)  # exactly representable
    assert np.array_equal(bf16_to_f32(bf16_bits(y)), y)


def test_layout_and_checksum() -> None:
    lay = _weaver.layout(8, 2, 64, 1, 4, 128, 16)  # f16
    assert lay["q_offset"] == 64 and lay["k_offset"] == 64 + 8 * 64 * 2
    assert lay["v_offset"] == lay["k_offset"] + 2 * 64 * 2
    assert lay["out_offset"] % 16 == 0 and lay["slot_bytes"] % 128 == 0
    assert lay["total_bytes"] == lay["header_bytes"] + 16 * lay["slot_bytes"]
    # the checksum is sum_i splitmix64(i << 32 | word_i) mod 2^64
    data = bytes(range(16))
    mask = (1 << 64) - 1

    def mix(x: int) -> int:
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & mask
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    # mix is splitmix64's output function: seeded with 0, splitmix64's first three outputs (Vigna's
    # splitmix64.c) are mix(k * 0x9E3779B97F4A7C15) for k = 1, 2, 3
    assert [mix(k * 0x9E3779B97F4A7C15 & mask) for k in (1, 2, 3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, 16, 4)]
    assert _weaver.checksum(data) == sum(mix((i << 32) | w) for i, w in enumerate(words)) & mask
    with pytest.raises(ValueError):
        _weaver.layout(8, 3, 64, 1, 4, 128, 16)  # 8 heads over 3 KV heads
    with pytest.raises(ValueError):
        _weaver.layout(8, 2, 64, 1, 4, 128, 12)  # capacity not a power of two


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(8, 2, 64), (4, 4, 128), (6, 1, 64), (16, 4, 128)])
def test_decode_attention_matches_reference(n_head: int, n_kv: int, hd: int) -> None:
    rng = np.random.default_rng(n_head * 100 + hd)
    q, k, v = rand(rng, n_head, hd), rand(rng, 37, n_kv, hd), rand(rng, 37, n_kv, hd)
    out = decode_attention(q, k, v, 1 / math.sqrt(hd))
    assert out.dtype == np.float32 and out.shape == (n_head, hd)
    ref = ref_attention(q, k, v, 1 / math.sqrt(hd))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_attention_fast(q, k, v, 1 / math.sqrt(hd)), ref, rtol=1e-12, atol=1e-12)


# ---- one sender, one receiver -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("hd", [64, 128])
def test_offloaded_decode_matches_reference(dtype: str, hd: int) -> None:
    rng = np.random.default_rng(7)
    n_head, n_kv, prompt = 8, 2, 5
    with Receiver(n_head=n_head, n_head_kv=n_kv, head_dim=hd, max_seqs=3, max_ctx=32, dtype=dtype) as rx, \
            Sender(rx.name) as tx:
        assert tx.config == rx.config and rx.config.scale == pytest.approx(1 / math.sqrt(hd))
        ks, vs = rand(rng, prompt, n_kv, hd), rand(rng, prompt, n_kv, hd)
        rx.load_kv(2, ks, vs)  # a prefill done elsewhere
        ks, vs = rounded(ks, dtype), rounded(vs, dtype)
        for pos in range(prompt, prompt + 4):
            q, k, v = rand(rng, n_head, hd), rand(rng, n_kv, hd), rand(rng, n_kv, hd)
            ticket = tx.post(2, pos, q, k, v)
            assert rx.poll() == 1
            out = tx.wait(ticket)
            ks, vs = np.concatenate([ks, rounded(k, dtype)[None]]), np.concatenate([vs, rounded(v, dtype)[None]])
            np.testing.assert_allclose(out, ref_attention(rounded(q, dtype), ks, vs, rx.config.scale),
                                       rtol=1e-5, atol=1e-5)
        k_cache, v_cache = rx.kv(2)
        assert np.array_equal(k_cache, ks) and np.array_equal(v_cache, vs) and rx.seq_len(2) == prompt + 4
        assert rx.stats()["corrupt"] == 0 and not tx.pending


def test_positions_rewind_but_never_skip() -> None:
    rng = np.random.default_rng(1)
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=2, max_ctx=16, dtype="f32") as rx, \
            Sender(rx.name) as tx:
        hist_k, hist_v = [], []
        for pos in range(3):
            q, k, v = rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64)
            t = tx.post(0, pos, q, k, v)
            rx.poll()
            tx.wait(t)
            hist_k.append(k)
            hist_v.append(v)
        # rewind to position 1 (a rejected speculative token): attends over [0, 1]
        q, k, v = rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64)
        t = tx.post(0, 1, q, k, v)
        rx.poll()
        np.testing.assert_allclose(tx.wait(t), ref_attention(q, np.stack([hist_k[0], k]), np.stack([hist_v[0], v]),
                                                             rx.config.scale), rtol=1e-5, atol=1e-6)
        assert rx.seq_len(0) == 2
        # skipping ahead (position 5 of a 2-long sequence) is refused by the receiver
        t = tx.post(0, 5, q, k, v)
        rx.poll()
        with pytest.raises(WeaverTaskError, match="bad position"):
            tx.wait(t)
        # out-of-range ids are refused by the sender before they reach the ring
        with pytest.raises(WeaverTaskError):
            tx.post(2, 0, q, k, v)
        with pytest.raises(WeaverTaskError):
            tx.post(0, 16, q, k, v)
        with pytest.raises(WeaverTaskError, match="must be"):
            tx.post(0, 0, q[:2], k, v)
        # ... and by the receiver when a sender skips the check (raw ring post)
        out = np.empty((4, 64), np.float32)
        ticket = tx._ring.post(7, 0, q, k, v, 0, 1.0)
        rx.poll()
        assert tx._ring.wait(ticket, out, 1.0) == ("done", BAD_SEQ)


def test_poll_is_bounded_and_returns_at_once_when_idle() -> None:
    rng = np.random.default_rng(2)
    with Receiver(n_head=4, n_head_kv=1, head_dim=64, max_seqs=10, max_ctx=4, dtype="f16", max_tasks=3) as rx, \
            Sender(rx.name) as tx:
        start = time.perf_counter()
        for _ in range(100):
            assert rx.poll() == 0
        assert time.perf_counter() - start < 0.5
        tickets = [tx.post(s, 0, rand(rng, 4, 64), rand(rng, 1, 64), rand(rng, 1, 64)) for s in range(10)]
        assert [rx.poll() for _ in range(5)] == [3, 3, 3, 1, 0]
        assert rx.poll(max_tasks=1) == 0
        assert all(tx.done(t) for t in tickets)
        for t in tickets:
            tx.wait(t)
        assert rx.counters() == {"claim": 10, "tasks": 10, "head": 10, "completed": 10, "closed": 0}
        stats = rx.stats()
        assert stats["taken"] == stats["completed"] == 10 and stats["empty_polls"] == 102
        assert not rx.wait_tasks(0.01)  # nothing pending: times out


def test_full_ring_times_out_without_claiming() -> None:
    rng = np.random.default_rng(3)
    args = lambda s: (s, 0, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64))  # noqa: E731
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=8, max_ctx=4, capacity=4) as rx, \
            Sender(rx.name) as tx, Sender(rx.name) as other:
        tickets = [tx.post(*args(s)) for s in range(4)]
        with pytest.raises(WeaverTimeoutError, match="stayed full"):
            tx.post(*args(4), timeout=0.05)
        assert rx.counters()["claim"] == 4
        # completed but uncollected tasks still hold their slots: a sender owning none waits ...
        assert rx.poll() == 4
        with pytest.raises(WeaverTimeoutError):
            other.post(*args(4), timeout=0.05)
        # ... while their owner collects them to make room (flow control), outputs kept for wait()
        assert tx.post(*args(4), timeout=1.0) == 4
        assert tx.pending == {0, 1, 2, 3, 4} and rx.counters()["completed"] == 4
        tx.wait(tickets[0])
        with pytest.raises(WeaverError, match="not posted"):
            tx.wait(tickets[0])  # returned already
        with pytest.raises(WeaverTimeoutError, match="not completed"):
            tx.wait(4, timeout=0.05)
        assert 4 in tx.pending  # a timed-out wait can be retried
        rx.poll()
        for t in (1, 2, 3, 4):
            tx.wait(t)
        assert other.post(*args(5), timeout=1.0) == 5


def test_closing_the_receiver_releases_waiters() -> None:
    rng = np.random.default_rng(4)
    rx = Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=2, max_ctx=4)
    tx = Sender(rx.name)
    t = tx.post(0, 0, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64))
    threading.Timer(0.05, rx.close).start()
    with pytest.raises(WeaverError, match="closed"):
        tx.wait(t, timeout=5.0)
    with pytest.raises(WeaverError, match="closed"):
        tx.post(0, 1, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64))
    tx.close()
    with pytest.raises(WeaverError, match="cannot open"):
        Sender(rx.name)  # unlinked


def test_attach_refuses_foreign_memory(tmp_path: Path) -> None:
    with pytest.raises(WeaverError, match="cannot open"):
        Sender("/oallama-weaver-does-not-exist")
    name = f"oallama-weaver-test-{os.getpid()}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        with os.fdopen(os.dup(fd), "r+b") as f:
            f.write(b"\x07" * 128 + (1).to_bytes(8, "little"))  # garbage magic, ready word 1
        with pytest.raises(WeaverError, match="bad magic"):
            Sender("/" + name)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")


def test_receiver_failure_completes_every_taken_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from oallama.weaver import host as weaver

    rng = np.random.default_rng(5)
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=4, max_ctx=4) as rx, Sender(rx.name) as tx:
        tickets = [tx.post(s, 0, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64)) for s in range(3)]
        calls = []

        def failing(*a: object) -> np.ndarray:
            calls.append(1)
            if len(calls) == 2:
                raise FloatingPointError("boom")
            return decode_attention(*a)  # type: ignore[arg-type]

        monkeypatch.setattr(weaver, "decode_attention", failing)
        with pytest.raises(FloatingPointError):
            rx.poll()
        tx.wait(tickets[0])
        for t in tickets[1:]:
            with pytest.raises(WeaverTaskError, match="receiver failed"):
                tx.wait(t)


# ---- the reader never reads a slot before its writer published it ---------------------------

class RawRing:
    """The ring's shared words seen directly through /dev/shm, to play a misbehaving sender."""

    CLAIM, TASKS, HEAD, COMPLETED = 256, 384, 512, 640  # byte offsets (weaver_layout.h)

    def __init__(self, rx: Receiver) -> None:
        c = rx.config
        self.lay = _weaver.layout(c.n_head, c.n_head_kv, c.head_dim, {"f32": 0, "f16": 1, "bf16": 2}[c.dtype],
                                  c.max_seqs, c.max_ctx, c.capacity)
        self.fd = os.open(f"/dev/shm{rx.name}", os.O_RDWR)
        self.mm = mmap.mmap(self.fd, c.total_bytes)
        self.words = np.frombuffer(self.mm, np.uint64)

    def slot(self, ticket: int) -> int:
        return self.lay["header_bytes"] + self.lay["slot_bytes"] * (ticket % self.lay["capacity"])

    def word(self, byte_offset: int, value: int | None = None) -> int:
        if value is not None:
            self.words[byte_offset // 8] = value
        return int(self.words[byte_offset // 8])

    def write_task(self, ticket: int, seq_id: int, pos: int, payload: bytes) -> None:
        base = self.slot(ticket)
        self.mm[base + 24:base + 32] = np.array([seq_id, pos], np.int32).tobytes()
        self.mm[base + self.lay["q_offset"]:base + self.lay["q_offset"] + len(payload)] = payload
        self.mm[base + 16:base + 24] = np.uint64(_weaver.checksum(payload)).tobytes()

    def close(self) -> None:
        del self.words
        self.mm.close()
        os.close(self.fd)


def test_unpublished_slots_are_never_read() -> None:
    rng = np.random.default_rng(6)
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=4, max_ctx=4, dtype="f16", record=True) as rx, \
            Sender(rx.name) as tx:
        raw = RawRing(rx)
        try:
            c = rx.config
            nbytes = (c.n_head + 2 * c.n_head_kv) * c.head_dim * 2
            payload = to_storage(rand(rng, nbytes // 2), "f16").tobytes()
            # a slow sender claimed ticket 0 and wrote its payload, but has not published it
            raw.word(RawRing.CLAIM, 1)
            raw.write_task(0, 0, 0, payload)
            assert rx.poll() == 0                         # the task counter says nothing yet
            raw.word(RawRing.TASKS, 1)                    # even a counter ahead of the slot ...
            assert rx.poll() == 0                         # ... does not make the slot readable
            # a real sender publishes ticket 1 behind it: still nothing (tickets complete in order)
            t1 = tx.post(1, 0, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64))
            assert t1 == 1 and rx.poll() == 0 and rx.stats()["taken"] == 0
            # ticket 0 is published with a payload changed after its checksum: detected
            raw.mm[raw.slot(0) + 64] ^= 0xFF
            raw.word(raw.slot(0), 4 * 0 + 1)              # seq word = PUBLISHED(0)
            raw.word(RawRing.TASKS, 2)
            assert rx.poll() == 2
            assert [(r.ticket, r.status) for r in rx.history] == [(0, CORRUPT), (1, OK)]
            assert rx.stats()["corrupt"] == 1
            tx.wait(t1)
            assert raw.word(raw.slot(0)) == 4 * 0 + 2     # DONE(0), waiting for its (absent) sender
            assert raw.word(RawRing.COMPLETED) == 2
        finally:
            raw.close()


def test_take_while_a_batch_is_in_flight_is_refused() -> None:
    rng = np.random.default_rng(8)
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=4, max_ctx=4, dtype="f32") as rx, \
            Sender(rx.name) as tx:
        tx.post(0, 0, rand(rng, 4, 64), rand(rng, 2, 64), rand(rng, 2, 64))
        bufs = (rx._b_tickets, rx._b_tags, rx._b_seq, rx._b_pos, rx._b_status, rx._b_q, rx._b_k, rx._b_v)
        assert rx._ring.take(rx.max_tasks, *bufs) == 1
        with pytest.raises(RuntimeError, match="in flight"):
            rx._ring.take(rx.max_tasks, *bufs)
        with pytest.raises(RuntimeError, match="in flight"):
            rx._ring.complete(0, np.zeros(0, np.float32), np.zeros(0, np.uint32), np.zeros(0, np.uint32))


# ---- concurrency stress ----------------------------------------------------------------------------

def _sender_thread(tx: Sender, sender: int, seqs: list[int], n_tokens: int, window: int, dtype: str,
                   results: dict[int, dict[str, object]]) -> None:
    """Posts n_tokens per sequence, up to `window` tasks in flight, round-robin over its sequences;
    checks every output against the reference computed from its own K/V history."""
    c = tx.config
    rng = np.random.default_rng(1000 + sender)
    hist: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {s: ([], []) for s in seqs}
    inflight: list[tuple[int, int, np.ndarray]] = []
    tickets, worst = [], 0.0

    def collect() -> None:
        nonlocal worst
        ticket, _seq, expected = inflight.pop(0)
        out = tx.wait(ticket, timeout=20.0)
        worst = max(worst, float(np.abs(out - expected).max()))
        tickets.append(ticket)

    for pos in range(n_tokens):
        for s in seqs:
            q, k, v = rand(rng, c.n_head, c.head_dim), rand(rng, c.n_head_kv, c.head_dim), \
                rand(rng, c.n_head_kv, c.head_dim)
            hk, hv = hist[s]
            hk.append(rounded(k, dtype))
            hv.append(rounded(v, dtype))
            expected = ref_attention_fast(rounded(q, dtype), np.stack(hk), np.stack(hv), c.scale)
            tag = (sender << 32) | (s << 16) | pos
            inflight.append((tx.post(s, pos, q, k, v, tag=tag, timeout=20.0), s, expected))
            if len(inflight) >= window:
                collect()
    while inflight:
        collect()
    results[sender] = {"tickets": tickets, "worst": worst}


def test_stress_threads_no_task_lost_duplicated_or_torn() -> None:
    n_senders, seqs_per_sender, n_tokens, window = 4, 8, 64, 6  # 2048 tasks, 8-slot ring
    dtype = "f16"
    with Receiver(n_head=4, n_head_kv=2, head_dim=64, max_seqs=n_senders * seqs_per_sender, max_ctx=n_tokens,
                  dtype=dtype, capacity=8, max_tasks=4, record=True) as rx:
        stop = threading.Event()
        served: list[int] = []
        server = threading.Thread(target=lambda: served.append(rx.serve(stop, timeout=60.0, idle_wait=0.002)))
        server.start()
        results: dict[int, dict[str, object]] = {}
        senders = [Sender(rx.name) for _ in range(2)]  # two attachments, shared by the threads
        threads = [threading.Thread(target=_sender_thread, args=(
            senders[i % 2], i, list(range(i * seqs_per_sender, (i + 1) * seqs_per_sender)), n_tokens, window, dtype,
            results)) for i in range(n_senders)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60.0)
        stop.set()
        server.join(timeout=10.0)
        assert time.monotonic() - start < 60.0 and not any(t.is_alive() for t in threads)
        total = n_senders * seqs_per_sender * n_tokens
        assert len(results) == n_senders, "a sender thread failed"
        assert served == [total]
        # every ticket completed exactly once, and each sender got back exactly its own
        all_tickets = [t for r in results.values() for t in r["tickets"]]  # type: ignore[attr-defined]
        assert sorted(all_tickets) == list(range(total))
        hist = rx.history
        assert hist is not None and [r.ticket for r in hist] == list(range(total))
        assert all(r.status == OK for r in hist)
        tags = Counter(r.tag for r in hist)
        assert len(tags) == total and max(tags.values()) == 1
        # a sequence's tokens reached the receiver in order
        for s in range(n_senders * seqs_per_sender):
            assert [r.pos for r in hist if r.seq_id == s] == list(range(n_tokens))
        assert max(r["worst"] for r in results.values()) < 1e-5  # type: ignore[type-var]
        assert rx.stats()["corrupt"] == 0
        for tx in senders:
            tx.close()


_SENDER_PROCESS = r"""
import json, sys
import numpy as np
from oallama.weaver.host import Sender, from_storage, to_storage

def ref(q, k, v, scale):  # f64 attention, apart from the receiver's decode_attention
    g = q.shape[0] // k.shape[1]
    kh, vh = np.repeat(k.astype(np.float64), g, axis=1), np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("hd,lhd->hl", q.astype(np.float64), kh) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return np.einsum("hl,lhd->hd", p / p.sum(axis=1, keepdims=True), vh)

name, sender, seq0, n_seqs, n_tokens = sys.argv[1], *map(int, sys.argv[2:6])
tx = Sender(name)
c = tx.config
rng = np.random.default_rng(sender)
r = lambda *s: rng.standard_normal(s).astype(np.float32)
rd = lambda x: from_storage(to_storage(x, c.dtype), c.dtype)
hist = {s: ([], []) for s in range(seq0, seq0 + n_seqs)}
tickets, worst, inflight = [], 0.0, []
for pos in range(n_tokens):
    for s in hist:
        q, k, v = r(c.n_head, c.head_dim), r(c.n_head_kv, c.head_dim), r(c.n_head_kv, c.head_dim)
        hist[s][0].append(rd(k)); hist[s][1].append(rd(v))
        exp = ref(rd(q), np.stack(hist[s][0]), np.stack(hist[s][1]), c.scale)
        inflight.append((tx.post(s, pos, q, k, v, tag=(sender << 32) | (s << 16) | pos, timeout=20), exp))
        if len(inflight) >= 4:
            t, e = inflight.pop(0)
            worst = max(worst, float(np.abs(tx.wait(t, timeout=20) - e).max())); tickets.append(t)
while inflight:
    t, e = inflight.pop(0)
    worst = max(worst, float(np.abs(tx.wait(t, timeout=20) - e).max())); tickets.append(t)
print(json.dumps({"tickets": tickets, "worst": worst}))
"""


def test_stress_three_sender_processes() -> None:
    n_procs, n_seqs, n_tokens = 3, 4, 64  # 768 tasks through a 4-slot ring
    with Receiver(n_head=8, n_head_kv=2, head_dim=128, max_seqs=n_procs * n_seqs, max_ctx=n_tokens, dtype="bf16",
                  capacity=4, max_tasks=2, record=True) as rx:
        procs = [subprocess.Popen([sys.executable, "-c", _SENDER_PROCESS, rx.name, str(i + 1), str(i * n_seqs),
                                   str(n_seqs), str(n_tokens)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT)
                 for i in range(n_procs)]
        total = n_procs * n_seqs * n_tokens
        served = rx.serve(until=total, timeout=60.0, idle_wait=0.002)
        outs = [p.communicate(timeout=30) for p in procs]
        for p, (_out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err
        assert served == total
        reports = [json.loads(out) for out, _ in outs]
        assert sorted(t for r in reports for t in r["tickets"]) == list(range(total))
        assert max(r["worst"] for r in reports) < 1e-5
        assert rx.history is not None and all(r.status == OK for r in rx.history)
        assert len({r.tag for r in rx.history}) == total and rx.stats()["corrupt"] == 0


# ---- GPU (compiled here, never run without a device) -------------------------------------------

def _cuda_or_skip() -> Any:
    from oallama.weaver import cuda as weaver_cuda

    if not weaver_cuda.cuda_available():
        pytest.skip("oallama built without OALLAMA_KERNELS=ON (no oallama._weaver_cuda)")
    return weaver_cuda


def _torch_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    torch = pytest.importorskip("torch")
    qt = torch.from_numpy(q).double().cuda()                       # [H, D]
    kt = torch.from_numpy(k).double().cuda()                       # [L, Hkv, D]
    vt = torch.from_numpy(v).double().cuda()
    group = q.shape[0] // k.shape[1]
    kt = kt.repeat_interleave(group, dim=1).transpose(0, 1)        # [H, L, D]
    vt = vt.repeat_interleave(group, dim=1).transpose(0, 1)
    p = torch.softmax(torch.einsum("hd,hld->hl", qt, kt) * scale, dim=-1)
    return torch.einsum("hl,hld->hd", p, vt).cpu().numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(32, 8, 128), (8, 2, 64), (16, 16, 64), (32, 2, 64)])
def test_gpu_receiver_attention_matches_torch(dtype: str, n_head: int, n_kv: int, hd: int) -> None:
    weaver = _cuda_or_skip()
    rng = np.random.default_rng(11)
    with weaver.CudaReceiver(n_head=n_head, n_head_kv=n_kv, head_dim=hd, max_seqs=4, max_ctx=600,
                             dtype=dtype) as rx:
        with weaver.CudaSender(rx) as tx:  # this process: IPC cannot reopen its own memory
            ks, vs = rand(rng, 500, n_kv, hd), rand(rng, 500, n_kv, hd)
            rx.load_kv(1, ks, vs)
            ks, vs = rounded(ks, dtype), rounded(vs, dtype)
            for pos in range(500, 505):
                q, k, v = rand(rng, n_head, hd), rand(rng, n_kv, hd), rand(rng, n_kv, hd)
                h = tx.post(1, pos, q, k, v)
                rx.poll()
                out = tx.wait(h)
                ks, vs = np.concatenate([ks, rounded(k, dtype)[None]]), np.concatenate([vs, rounded(v, dtype)[None]])
                np.testing.assert_allclose(out, _torch_ref(rounded(q, dtype), ks, vs, rx.config.scale),
                                           rtol=2e-3, atol=2e-3)
        assert rx.stats()["corrupt"] == 0


@pytest.mark.gpu
def test_gpu_host_mapped_ring_serves_a_cpu_sender() -> None:
    weaver = _cuda_or_skip()
    rng = np.random.default_rng(12)
    try:
        rx = weaver.CudaReceiver(n_head=8, n_head_kv=2, head_dim=64, max_seqs=2, max_ctx=8, dtype="f16",
                                 memory="host")
    except WeaverError as e:
        pytest.skip(str(e))  # the device reports no native host atomics
    with rx, Sender(rx.name) as tx:
        q, k, v = rand(rng, 8, 64), rand(rng, 2, 64), rand(rng, 2, 64)
        t = tx.post(0, 0, q, k, v)
        rx.poll()
        rx.synchronize()
        out = tx.wait(t, timeout=10.0)
        np.testing.assert_allclose(out, ref_attention(rounded(q, "f16"), rounded(k, "f16")[None],
                                                      rounded(v, "f16")[None], rx.config.scale), rtol=2e-3, atol=2e-3)


_GPU_SENDER_PROCESS = r"""
import json, sys
import numpy as np
from oallama.weaver.cuda import CudaSender
handle = bytes.fromhex(sys.argv[1])
rng = np.random.default_rng(5)
outs = []
with CudaSender(handle, timeout=30.0) as tx:
    c = tx.config
    for pos in range(int(sys.argv[2])):
        q = rng.standard_normal((c.n_head, c.head_dim)).astype(np.float32)
        k = rng.standard_normal((c.n_head_kv, c.head_dim)).astype(np.float32)
        v = rng.standard_normal((c.n_head_kv, c.head_dim)).astype(np.float32)
        outs.append(tx.attention(0, pos, q, k, v).tolist())
print(json.dumps(outs))
"""


@pytest.mark.gpu
def test_gpu_sender_and_receiver_in_two_processes() -> None:
    weaver = _cuda_or_skip()
    n = 6
    with weaver.CudaReceiver(n_head=8, n_head_kv=2, head_dim=64, max_seqs=1, max_ctx=n, dtype="f16") as rx:
        proc = subprocess.Popen([sys.executable, "-c", _GPU_SENDER_PROCESS, rx.ipc_handle.hex(), str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            rx.poll()  # the receiver's stream: nothing else queued, so a poll per iteration
            rx.synchronize()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        outs = np.array(json.loads(out), np.float32)
        # the same tokens through the CPU reference
        rng = np.random.default_rng(5)
        ks, vs = [], []
        for pos in range(n):
            q, k, v = rand(rng, 8, 64), rand(rng, 2, 64), rand(rng, 2, 64)
            ks.append(rounded(k, "f16"))
            vs.append(rounded(v, "f16"))
            np.testing.assert_allclose(outs[pos], ref_attention(rounded(q, "f16"), np.stack(ks), np.stack(vs),
                                                                rx.config.scale), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_gpu_poll_is_bounded_and_takes_one_task_per_sequence() -> None:
    weaver = _cuda_or_skip()
    rng = np.random.default_rng(13)
    with weaver.CudaReceiver(n_head=8, n_head_kv=2, head_dim=64, max_seqs=4, max_ctx=8, dtype="bf16",
                             max_tasks=2) as rx, weaver.CudaSender(rx) as tx:
        rx.poll()
        assert rx.stats()["empty_polls"] == 1
        # seq 0 twice, then seqs 1 and 2: batches are [0] (stops at the second 0), [0, 1], [2]
        posts = [(0, 0), (0, 1), (1, 0), (2, 0)]
        handles = [tx.post(s, p, rand(rng, 8, 64), rand(rng, 2, 64), rand(rng, 2, 64)) for s, p in posts]
        taken = []
        for _ in range(4):
            rx.poll()
            taken.append(rx.stats()["taken"])
        assert taken == [1, 3, 4, 4]
        for h in handles:
            tx.wait(h)
