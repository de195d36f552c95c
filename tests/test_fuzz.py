"""Fuzzing the readers of untrusted files with Hypothesis: the GGUF header reader and model check
(oallama.model.gguf_file), llama.cpp's loader behind oallama.Llama, and the plan, profile and
devices-file readers. Whatever the bytes, only an oallama error (or success) may come out: no
other exception, no native abort, no hang.

Inputs are mutations of valid documents: bytes flipped, overwritten (bytes, and 32/64-bit words
with boundary values), inserted, deleted, the file truncated; positions are drawn from the
structure of the file (every field and tensor-info record of the GGUF, the whole JSON text) as
well as uniformly. JSON documents are also mutated structurally (a value anywhere replaced by
any JSON value, or a key removed). Loads that reach llama.cpp run in child processes, many
inputs per process (`helpers.load_batch`), so a native abort is reported as a failing input,
not a dead pytest.

Runs are deterministic (derandomize=True). The default run tries 500 GGUF inputs against the
reader in-process, 4 batches of 30 GGUF inputs through oallama.Llama in child processes (120, of
which 47 pass oallama's checks and reach llama.cpp's loader; the rest are refused before it), and
300 inputs for each of the 4 JSON readers (1200): about 20 s on 2 cores. A longer run:
OALLAMA_FUZZ_EXAMPLES=N multiplies every count by N, e.g. OALLAMA_FUZZ_EXAMPLES=20 (10000 reader
inputs, 2400 loads, 24000 JSON documents; N=1 is the default run).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from helpers import load_batch
from oallama import OallamaError
from oallama.cluster.problem import DEVICES_SCHEMA, read_devices
from oallama.model import gguf_file
from oallama.planner.cost.profile import Link, Profile, Settings, build_info
from oallama.runtime import planfile

SCALE = max(int(os.environ.get("OALLAMA_FUZZ_EXAMPLES", "1") or 1), 1)
READER_EXAMPLES = 500 * SCALE
LOAD_BATCHES, LOAD_BATCH = 4 * SCALE, 30
JSON_EXAMPLES = 300 * SCALE
BOUNDARY = [0, 1, 2, 3, 7, 8, 31, 32, 64, 255, 256, 511, 512, 513, 4095, 4096, 2**15, 2**16 - 1, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _settings(n: int, **kw: Any) -> Callable[[Any], Any]:
    return settings(max_examples=n, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture], **kw)


# --- byte mutations --------------------------------------------------------------------------------


Op = tuple[str, int, int, bytes]  # (kind, position, value, inserted bytes)


def _value_ops(positions: st.SearchStrategy[int], word_positions: st.SearchStrategy[int],
               max_ops: int = 3) -> st.SearchStrategy[list[Op]]:
    """Mutations that keep every length in place (flips, bytes, 32-bit words at values' starts)."""
    flip = st.tuples(st.just("flip"), positions, st.integers(0, 7), st.just(b""))
    byte = st.tuples(st.just("byte"), positions, st.integers(0, 255), st.just(b""))
    u32 = st.tuples(st.just("u32"), word_positions, st.sampled_from([b for b in BOUNDARY if b < 2**32]),
                    st.just(b""))
    return st.lists(st.one_of(flip, byte, u32), min_size=1, max_size=max_ops)


def _ops(positions: st.SearchStrategy[int], max_ops: int = 4) -> st.SearchStrategy[list[Op]]:
    flip = st.tuples(st.just("flip"), positions, st.integers(0, 7), st.just(b""))
    byte = st.tuples(st.just("byte"), positions, st.integers(0, 255), st.just(b""))
    u32 = st.tuples(st.just("u32"), positions, st.sampled_from([b for b in BOUNDARY if b < 2**32]), st.just(b""))
    u64 = st.tuples(st.just("u64"), positions, st.sampled_from(BOUNDARY), st.just(b""))
    insert = st.tuples(st.just("insert"), positions, st.just(0), st.binary(min_size=1, max_size=16))
    delete = st.tuples(st.just("delete"), positions, st.integers(1, 16), st.just(b""))
    cut = st.tuples(st.just("cut"), positions, st.just(0), st.just(b""))
    return st.lists(st.one_of(flip, byte, u32, u64, insert, delete, cut), min_size=1, max_size=max_ops)


def mutate(data: bytes, ops: list[Op]) -> bytes:
    b = bytearray(data)
    for kind, pos, value, extra in ops:
        pos = pos % max(len(b), 1)
        if kind == "flip" and b:
            b[pos] ^= 1 << value
        elif kind == "byte" and b:
            b[pos] = value
        elif kind in ("u32", "u64"):
            width = 4 if kind == "u32" else 8
            if pos + width <= len(b):
                struct.pack_into("<I" if width == 4 else "<Q", b, pos, value)
        elif kind == "insert":
            b[pos:pos] = extra
        elif kind == "delete":
            del b[pos:pos + value]
        elif kind == "cut":
            del b[pos:]
    return bytes(b)


def _only_oallama_errors(fn: Callable[[], object]) -> OallamaError | None:
    """Run fn: success or an oallama error (returned); anything else propagates and fails the test."""
    try:
        fn()
    except OallamaError as e:
        return e
    return None


# --- GGUF -----------------------------------------------------------------------------------------


class Seed:
    """A valid small GGUF and the offsets of its structure (from gguf-py's reader)."""

    def __init__(self, path: Path) -> None:
        self.path, self.data = path, path.read_bytes()
        r = gguf.GGUFReader(path)
        self.header_end = int(r.data_offset)
        fields = set(range(0, 24, 4))
        for f in r.fields.values():
            off = f.offset
            for part in f.parts[:12]:  # keys, types, lengths, first elements
                fields.add(off)
                off += int(part.nbytes)
        for t in r.tensors:
            off = t.field.offset
            for part in t.field.parts:
                fields.add(off)
                off += int(part.nbytes)
        self.structure = sorted(fields)
        # where a mutation leaves the header readable, so llama.cpp's loader gets to see it: the
        # values of scalar metadata, the bytes of strings, the first elements of arrays
        self.value_ranges = []
        for k, f in r.fields.items():
            if k.startswith("GGUF."):
                continue
            first = {gguf.GGUFValueType.STRING: 4, gguf.GGUFValueType.ARRAY: 5}.get(f.types[0], 3)
            start = f.offset + sum(int(p.nbytes) for p in f.parts[:first])
            end = start + sum(int(p.nbytes) for p in f.parts[first:first + 16])
            if end > start:
                self.value_ranges.append((start, end))

    def positions(self) -> st.SearchStrategy[int]:
        near = st.tuples(st.sampled_from(self.structure), st.integers(-2, 9)).map(lambda t: max(t[0] + t[1], 0))
        return st.one_of(near, st.integers(0, self.header_end), st.integers(0, len(self.data) - 1))

    def value_positions(self) -> st.SearchStrategy[int]:
        return st.sampled_from(self.value_ranges).flatmap(lambda r: st.integers(r[0], r[1] - 1))

    def value_starts(self) -> st.SearchStrategy[int]:
        return st.sampled_from([a for a, b in self.value_ranges if b - a >= 4])


@pytest.fixture(scope="module")
def seed(synth_model: Callable[..., Path]) -> Seed:
    return Seed(synth_model("tiny", "q8_0", n_layer=1))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _read_all(p: Path) -> None:
    info = gguf_file.read(p, check_size=False)
    info.identity()
    info = gguf_file.check_model(p)
    assert info.weight_bytes <= p.stat().st_size and info.data_offset <= p.stat().st_size


def test_gguf_reader(seed: Seed, work: Path) -> None:
    p = work / "reader.gguf"

    @_settings(READER_EXAMPLES, deadline=5000, phases=[Phase.generate, Phase.shrink])
    @given(_ops(seed.positions()))
    def run(ops: list[Op]) -> None:
        p.write_bytes(mutate(seed.data, ops))
        err = _only_oallama_errors(lambda: _read_all(p))
        if err is not None:
            assert str(p) in str(err), err  # names the file

    run()


def test_gguf_loader_in_child_processes(seed: Seed, work: Path) -> None:
    """Mutations that keep the header readable, loaded by oallama.Llama (llama.cpp's loader, the
    tokenizer, llama_cpp's chat templates) in one child process per batch."""
    out = work / "load"
    out.mkdir(exist_ok=True)
    values = _value_ops(seed.value_positions(), seed.value_starts())
    one = st.one_of(values, values, values, _ops(seed.positions(), max_ops=2))
    tried = {"inputs": 0, "loaded": 0}

    # no shrinking: a failing batch is reported with the ops of each failing input
    @_settings(LOAD_BATCHES, deadline=None, phases=[Phase.generate])
    @given(st.lists(one, min_size=LOAD_BATCH, max_size=LOAD_BATCH))
    def run(batch: list[list[Op]]) -> None:
        jobs: list[tuple[Path, dict[str, Any]]] = []
        ops_of: dict[str, list[Op]] = {}
        for i, ops in enumerate(batch):
            p = out / f"m{i}.gguf"
            p.write_bytes(mutate(seed.data, ops))
            tried["inputs"] += 1
            if _only_oallama_errors(lambda p=p: gguf_file.check_model(p)) is None:
                jobs.append((p, {}))
                ops_of[str(p)] = ops
        got = load_batch(jobs, timeout_s=60 + 10 * len(jobs))
        tried["loaded"] += len(jobs)
        bad = {p: (o, ops_of[p]) for p, o in got.items() if o.kind != "ok" and not (o.kind == "error" and o.oallama)}
        assert not bad, "\n".join(f"{o.kind} {o.error}: {o.message[:300]}\n  mutation: {ops!r}" for o, ops in bad.values())

    run()
    print(f"{tried['loaded']} of {tried['inputs']} inputs reached llama.cpp's loader")
    assert tried["inputs"] == LOAD_BATCHES * LOAD_BATCH
    assert tried["loaded"] >= tried["inputs"] // 4, tried  # most batches reach llama.cpp's loader


# --- plans, profiles, devices files -------------------------------------------------------------------


def _json_values() -> st.SearchStrategy[Any]:
    leaf = st.one_of(st.none(), st.booleans(), st.sampled_from([*BOUNDARY, -1, -(2**63)]), st.integers(),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                     st.sampled_from(["CPU", "RPC[127.0.0.1:1]", "oallama.plan/1", "oallama.profile/1", ""]))
    return st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), kids, max_size=3)),
                        max_leaves=6)


@st.composite
def _structural(draw: st.DrawFn, doc: Any) -> Any:
    """`doc` with one value somewhere replaced by any JSON value, or one key removed."""
    doc = json.loads(json.dumps(doc))
    if not isinstance(doc, dict | list) or not doc or draw(st.integers(0, 5)) == 0:
        return draw(_json_values())
    node: Any = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return doc
        k = draw(st.sampled_from(keys))
        child = node[k]
        if isinstance(child, dict | list) and child and draw(st.booleans()):
            node = child
            continue
        if isinstance(node, dict) and draw(st.integers(0, 3)) == 0:
            del node[k]
        else:
            node[k] = draw(_json_values())
        return doc


def _documents(seed_doc: dict[str, Any]) -> st.SearchStrategy[bytes]:
    text = json.dumps(seed_doc, indent=1).encode()
    as_bytes = _ops(st.integers(0, len(text) - 1)).map(lambda ops: mutate(text, ops))
    structural = _structural(seed_doc).map(lambda d: json.dumps(d, allow_nan=True).encode())
    return st.one_of(as_bytes, structural)


def _plan_doc(info: gguf_file.GGUFInfo) -> dict[str, Any]:
    acc = "RPC[127.0.0.1:1]"
    return {"schema": planfile.PLAN_SCHEMA, "strategy": "optimal", "accelerator": acc, "devices": ["CPU", acc],
            "model": {"name": "tiny", "identity": info.identity()}, "load": "overrides", "n_gpu_layers": 1,
            "placement": {t.name: (acc if i % 3 == 0 else "CPU") for i, t in enumerate(info.tensors[:8])},
            "overrides": [["blk\\.0\\..*", acc]], "offload_min_batch": {info.tensors[1].name: 32,
                                                                        info.tensors[2].name: None}}


def _distplan_doc(info: gguf_file.GGUFInfo) -> dict[str, Any]:
    devs = ["RPC[127.0.0.1:1]", "RPC[127.0.0.1:2]"]
    return {"schema": planfile.DISTPLAN_SCHEMA, "model": {"name": "tiny", "identity": info.identity()},
            "devices": devs, "placement": {t.name: devs[i % 2] for i, t in enumerate(info.tensors[:6])},
            "load": {"n_gpu_layers": 99, "tensor_split": [1.0, 1.0], "split_mode": 1}}


def _profile_doc() -> dict[str, Any]:
    key = Profile.op_key("MUL_MAT", "q8_0", (256, 256), 1)
    acc = "RPC[127.0.0.1:1]"
    link = Link(5.0, 1000.0, [(1024, 6.0)])
    return Profile(key="k", model_shapes="s", devices={"CPU": {"kind": "cpu", "launch_us": 1.0}, acc: {"kind": "rpc"}},
                   settings=Settings(1), build=build_info(),
                   ops={"CPU": {key: {"median_us": 10.0}}, acc: {key: {"median_us": 5.0}}},
                   links={acc: {"h2d": link, "d2h": link}}).to_json()


def _devices_doc() -> dict[str, Any]:
    return {"schema": DEVICES_SCHEMA, "client": {"flops": {"1": 1e9, "64": 5e9}},
            "devices": [{"name": "RPC[127.0.0.1:1]", "memory_free": 2**30, "flops": {"1": 2e9, "64": 9e9},
                         "link": {"bandwidth_Bps": 1e9, "rtt_s": 1e-4, "jitter_s": 0.0, "loss": 0.0}},
                        {"name": "RPC[127.0.0.1:2]", "memory_free": 2**29, "flops": 3e9,
                         "link": {"bandwidth_up_Bps": 1e8, "bandwidth_down_Bps": 2e8, "latency_s": 1e-3}}]}


READERS: dict[str, tuple[Callable[[gguf_file.GGUFInfo], dict[str, Any]], Callable[[Path, gguf_file.GGUFInfo], object]]] = {
    "plan": (_plan_doc, lambda p, info: (planfile.read(p, info), planfile.read(p))),
    "distplan": (_distplan_doc, lambda p, info: planfile.read(p, info)),
    "profile": (lambda info: _profile_doc(), lambda p, info: Profile.load(p)),
    "devices": (lambda info: _devices_doc(), lambda p, info: read_devices(p)),
}


@pytest.mark.parametrize("kind", list(READERS))
def test_json_reader(kind: str, seed: Seed, work: Path) -> None:
    make, read = READERS[kind]
    info = gguf_file.read(seed.path)
    doc = make(info)
    p = work / f"{kind}.json"
    p.write_text(json.dumps(doc))
    read(p, info)  # the seed document itself is good

    @_settings(JSON_EXAMPLES, deadline=2000)
    @given(_documents(doc))
    def run(data: bytes) -> None:
        p.write_bytes(data)
        err = _only_oallama_errors(lambda: read(p, info))
        if err is not None:
            assert str(p) in str(err), err  # names the file

    run()
