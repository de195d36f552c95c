"""The native boundary (issue 11): handles cross `oallama._core` as typed objects that keep their
owner alive and refuse use after it was closed, never as integers; results come back as read-only
typed records whose values are llama.cpp's own view of the loaded GGUF.

Expected values are read from the GGUF file with gguf-py (llama.cpp's own reader, independent of
oallama's), never written down here."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest

from oallama import Llama, _core
from oallama.errors import ClosedError

N_CTX = 64


@pytest.fixture(scope="module")
def tiny_f16(synth_model) -> Path:
    # f16: weights stay in plain CPU buffers, so llama.cpp's byte counts are the file's
    return synth_model("tiny", "f16", n_layer=2)


@pytest.fixture(scope="module")
def llm(tiny_f16: Path) -> Iterator[Llama]:
    model = Llama(str(tiny_f16), n_ctx=N_CTX, n_threads=1, verbose=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def session(tiny_f16: Path) -> Iterator[_core.Session]:
    s = _core.Session(str(tiny_f16), n_ctx=N_CTX, n_batch=8, n_ubatch=8, n_threads=1)
    yield s
    s.close()


def _gguf_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """name -> (ggml type name, ne padded to 4 dimensions, bytes), as the file states them."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        ne = tuple(int(x) for x in t.shape) + (1,) * (4 - len(t.shape))
        out[t.name] = (t.tensor_type.name.lower(), ne, int(t.n_bytes))
    return out


# --- handles: typed, never integers -------------------------------------------------------------

CONTEXT_CALLS: dict[str, Callable[[Any], object]] = {
    "graph": lambda c: _core.graph(c, 4),
    "memory": lambda c: _core.memory(c),
    "set_offload_policy": lambda c: _core.set_offload_policy(c, {}),
    "get_offload_policy": lambda c: _core.get_offload_policy(c),
    "reserve": lambda c: _core.reserve(c),
}


@pytest.mark.parametrize("call", sorted(CONTEXT_CALLS))
def test_the_live_context_address_is_refused_as_an_int(llm: Llama, call: str) -> None:
    address = llm._ctx.ctx  # llama-cpp-python's own value: a real, live llama_context*, as an int
    assert isinstance(address, int) and address != 0
    with pytest.raises(TypeError, match="Context"):
        CONTEXT_CALLS[call](address)
    CONTEXT_CALLS[call](llm.native_context)  # the typed handle of the same context works


@pytest.mark.parametrize("call", sorted(CONTEXT_CALLS))
def test_a_model_handle_is_not_a_context(llm: Llama, call: str) -> None:
    with pytest.raises(TypeError, match="Context"):
        CONTEXT_CALLS[call](llm.native_model)


def test_the_live_model_address_is_refused_as_an_int(llm: Llama) -> None:
    with pytest.raises(TypeError, match="Model"):
        _core.model_tensors(llm._model.model)
    with pytest.raises(TypeError, match="Model"):
        _core.model_tensors(llm.native_context)


@pytest.mark.parametrize("owner", ["int-address", "none", "llama", "llama-model", "session"])
def test_context_is_built_only_from_llama_cpp_context(llm: Llama, session: _core.Session, owner: str) -> None:
    obj = {"int-address": llm._ctx.ctx, "none": None, "llama": llm, "llama-model": llm._model,
           "session": session}[owner]
    with pytest.raises(TypeError, match=r"llama_cpp\._internals\.LlamaContext"):
        _core.Context(obj)


@pytest.mark.parametrize("owner", ["int-address", "llama-context"])
def test_model_is_built_only_from_llama_cpp_model(llm: Llama, owner: str) -> None:
    obj = {"int-address": llm._model.model, "llama-context": llm._ctx}[owner]
    with pytest.raises(TypeError, match=r"llama_cpp\._internals\.LlamaModel"):
        _core.Model(obj)


def test_session_hands_out_typed_handles(session: _core.Session) -> None:
    ctx, model = session.context(), session.model()
    assert isinstance(ctx, _core.Context) and isinstance(model, _core.Model)
    assert ctx.owner is session and model.owner is session
    assert not ctx.closed and not model.closed


# --- handles: owner kept alive, use after close refused ---------------------------------------


@pytest.mark.parametrize("call", sorted(CONTEXT_CALLS))
def test_context_of_a_closed_llama_raises_closed_error(tiny_f16: Path, call: str) -> None:
    llm = Llama(str(tiny_f16), n_ctx=N_CTX, n_threads=1, verbose=False)
    ctx, mine = llm.native_context, _core.Context(llm._ctx)
    llm.close()
    assert ctx.closed and mine.closed
    for handle in (ctx, mine):
        with pytest.raises(ClosedError, match=r"LlamaContext is closed"):
            CONTEXT_CALLS[call](handle)
    with pytest.raises(ClosedError, match=r"LlamaContext is closed"):
        _core.Context(llm._ctx)  # a closed owner is refused at once


def test_model_of_a_closed_llama_raises_closed_error(tiny_f16: Path) -> None:
    llm = Llama(str(tiny_f16), n_ctx=N_CTX, n_threads=1, verbose=False)
    model = llm.native_model
    llm.close()
    with pytest.raises(ClosedError, match=r"LlamaModel is closed"):
        _core.model_tensors(model)
    with pytest.raises(ClosedError, match="closed"):
        llm.tensor_devices()
    assert isinstance(ClosedError("x"), RuntimeError)  # what callers of a closed llama_cpp.Llama catch


@pytest.mark.parametrize("handle", ["context", "model"])
def test_handle_of_a_closed_session_raises_closed_error(tiny_f16: Path, handle: str) -> None:
    s = _core.Session(str(tiny_f16), n_ctx=N_CTX, n_batch=8, n_ubatch=8, n_threads=1)
    h = s.context() if handle == "context" else s.model()
    s.close()
    assert s.closed and h.closed
    with pytest.raises(ClosedError, match="Session is closed"):
        _core.memory(h) if handle == "context" else _core.model_tensors(h)


def test_a_handle_keeps_its_session_alive(tiny_f16: Path, session: _core.Session) -> None:
    # the only reference to the Session is the handle's: the session (and its llama_context)
    # must live as long as the handle does
    ctx = _core.Session(str(tiny_f16), n_ctx=N_CTX, n_batch=8, n_ubatch=8, n_threads=1).context()
    gc.collect()
    assert not ctx.closed
    got, ref = _core.graph(ctx, 4), _core.graph(session.context(), 4)
    assert [n.name for n in got.nodes] == [n.name for n in ref.nodes]


def test_a_handle_keeps_its_llama_cpp_owner_alive(tiny_f16: Path) -> None:
    llm = Llama(str(tiny_f16), n_ctx=N_CTX, n_threads=1, verbose=False)
    ctx = _core.Context(llm._ctx)
    owner = weakref.ref(llm._ctx)
    del llm  # llama_cpp.Llama.__del__ closes it; the LlamaContext object itself stays with the handle
    gc.collect()
    assert owner() is not None and ctx.owner is owner()
    with pytest.raises(ClosedError):
        _core.graph(ctx, 4)


# --- structs: read-only, typed ----------------------------------------------------------------


@pytest.fixture(scope="module")
def records(llm: Llama) -> dict[str, Any]:
    """One of each record type, from real calls."""
    rec: dict[str, Any] = {
        "Device": _core.devices_list()[0],
        "TensorInfo": _core.model_tensors(llm.native_model)[0],
        "Graph": _core.graph(llm.native_context, 4),
        "MemoryUse": _core.memory(llm.native_context)[0],
        "Timing": _core.profile_launch("CPU", 1, 0, 1),
    }
    rec["GraphTensor"] = rec["Graph"].nodes[0]
    if hasattr(_core, "fit_params"):
        rec["FitResult"] = _core.fit_params(llm.model_path, [], [], N_CTX)
    return rec


FIELDS = {
    "Device": ["name", "ggml_name", "description", "backend", "kind", "buffer_type", "memory_free", "memory_total"],
    "TensorInfo": ["name", "type", "ne", "nbytes", "buffer_type", "device", "is_host"],
    "GraphTensor": ["name", "op", "type", "ne", "nbytes", "srcs", "view_src", "weight", "weight_slot", "backend",
                    "pinned", "host_buffer", "supported_on", "caller_pinned", "is_view", "is_input", "is_output"],
    "Graph": ["backends", "nodes", "leafs", "n_splits", "n_copies"],
    "MemoryUse": ["buffer_type", "device", "model", "context", "compute"],
    "Timing": ["samples_us", "buffer_type"],
    "FitResult": ["fits", "n_gpu_layers", "n_ctx", "overrides"],
}


@pytest.mark.parametrize(("record", "field"), [(r, f) for r, fs in FIELDS.items() for f in fs])
def test_record_fields_are_read_only(records: dict[str, Any], record: str, field: str) -> None:
    if record not in records:
        pytest.skip("built without llama-common (OALLAMA_TOOLS=OFF): no fit_params")
    obj = records[record]
    assert type(obj) is getattr(_core, record)
    before = getattr(obj, field)
    with pytest.raises(AttributeError):
        setattr(obj, field, before)
    with pytest.raises(AttributeError):
        delattr(obj, field)
    assert not isinstance(obj, dict)


@pytest.mark.parametrize("record", sorted(FIELDS))
def test_records_cannot_be_made_in_python(record: str) -> None:
    with pytest.raises(TypeError):
        getattr(_core, record)()


# --- readback through the typed objects matches the GGUF ----------------------------------------


@pytest.mark.parametrize("owner", ["llama", "session"])
def test_model_tensors_match_the_gguf(tiny_f16: Path, llm: Llama, session: _core.Session, owner: str) -> None:
    want = _gguf_tensors(tiny_f16)
    model = llm.native_model if owner == "llama" else session.model()
    got = {t.name: t for t in _core.model_tensors(model)}
    assert sorted(got) == sorted(want)
    for name, (typ, ne, nbytes) in want.items():
        t = got[name]
        assert (t.type, t.ne, t.nbytes) == (typ, ne, nbytes), name
        assert isinstance(t.ne, tuple)
        if owner == "llama":  # a real load on llama.cpp's default devices: host memory here
            assert t.is_host and t.device == "CPU"


def test_graph_weight_leaves_match_the_gguf(tiny_f16: Path, llm: Llama) -> None:
    want = _gguf_tensors(tiny_f16)
    g = _core.graph(llm.native_context, 4)
    weights = {t.name: t for t in g.leafs if t.name in want}
    # every 2-d block weight of the file is read by the graph (the embedding through GET_ROWS)
    assert {n for n, (_, ne, _) in want.items() if ne[1] > 1} <= set(weights)
    for name, t in weights.items():
        assert (t.type, t.ne, t.nbytes) == want[name], name
    users = [n for n in g.nodes if n.weight and n.op == "MUL_MAT"]
    assert users and all(n.srcs[n.weight_slot] < 0 and g.leafs[-1 - n.srcs[n.weight_slot]].name == n.weight
                         for n in users)
    assert g.backends[-1] == "CPU" and all(n.backend in g.backends for n in g.nodes if not n.is_view)


def test_memory_counts_the_gguf_weights(tiny_f16: Path, llm: Llama) -> None:
    weight_bytes = sum(nb for _, _, nb in _gguf_tensors(tiny_f16).values())
    rows = _core.memory(llm.native_context)
    model_bytes = sum(m.model for m in rows)
    # llama.cpp's buffers hold the file's tensors, each padded to the buffer alignment (<= 64 bytes here)
    assert weight_bytes <= model_bytes <= weight_bytes + 64 * len(_gguf_tensors(tiny_f16))
    assert any(m.device == "CPU" and m.context > 0 for m in rows)  # the KV cache


def test_devices_list_records_name_their_devices() -> None:
    devs = [d for d in _core.devices_list() if d.kind != "rpc"]  # rpc: other modules' servers, named by endpoint
    cpu = [d for d in devs if d.kind == "cpu"]
    assert len(cpu) == 1 and cpu[0].name == cpu[0].ggml_name == "CPU" and cpu[0].memory_total > 0
    for d in devs:
        assert _core.device_name(d.name) == _core.device_name(d.ggml_name) == d.name
