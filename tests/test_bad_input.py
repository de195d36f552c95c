"""Bad input, case by case: broken GGUF files, plans and profiles that do not fit, options out of
range. Each case must end in a clear oallama error that names the file, tensor, key or option at
fault: no traceback, no native abort, no hang, and no partial output file.

Model files go through the public entry points: `gguf_file.check_model` in this process (pure
Python) and `oallama.Llama(...)` in a child process (`helpers.load_batch`: one process loads every
bad file, so a native abort in llama.cpp's loader is reported as a failed case, not a dead pytest).
Options go through the `oallama` command itself."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest

from helpers import LoadOutcome, closed_port, load_batch, raises_cleanly
from oallama import (
    Llama,
    ModelFileError,
    OallamaError,
    PlanError,
    ProfileError,
    RpcServerError,
    UnknownDeviceError,
)
from oallama.cluster.problem import read_devices
from oallama.model import gguf_file
from oallama.planner.cost.profile import SCHEMA as PROFILE_SCHEMA
from oallama.planner.cost.profile import Link, Profile, Settings, build_info
from oallama.runtime import planfile, rpc

CLI_TIMEOUT_S = 180
KW: dict[str, Any] = {"n_ctx": 64, "n_threads": 1, "verbose": False}


def _newer(schema: str) -> str:
    """'oallama.x/2' -> 'oallama.x/3': the schema a later oallama would write."""
    name, version = schema.rsplit("/", 1)
    return f"{name}/{int(version) + 1}"


# --- GGUF: corrupt copies of a good tiny model ------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A corrupt file and what every reader must say about it (a regex; the file's path is
    checked separately). loads_header: check_model accepts it (only llama.cpp or llama_cpp can
    tell it is bad); extra: further Llama kwargs."""

    data: bytes
    match: str
    loads_header: bool = False
    extra: tuple[tuple[str, Any], ...] = ()


def _value_at(r: gguf.GGUFReader, key: str) -> int:
    """Offset of a metadata field's value (after its key and type)."""
    f = r.fields[key]
    return f.offset + sum(int(p.nbytes) for p in f.parts[:3])


def _info_at(t: gguf.ReaderTensor, what: str, dim: int = 0) -> int:
    """Offset of a field of a tensor-info record: name (u64 length + bytes), n_dims u32, ne[] u64,
    type u32, offset u64."""
    n = len(t.field.parts[1])
    at = {"n_dims": 8 + n, "ne": 8 + n + 4 + 8 * dim, "type": 8 + n + 4 + 8 * len(t.shape),
          "offset": 8 + n + 4 + 8 * len(t.shape) + 4}[what]
    return t.field.offset + at


def _put(data: bytes, at: int, fmt: str, value: Any) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def _replace(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def _two_d(r: gguf.GGUFReader) -> gguf.ReaderTensor:
    return next(t for t in r.tensors if len(t.shape) == 2)


def _same_length_pair(r: gguf.GGUFReader) -> tuple[gguf.ReaderTensor, gguf.ReaderTensor]:
    for i, a in enumerate(r.tensors):
        for b in r.tensors[i + 1:]:
            if len(a.name) == len(b.name):
                return a, b
    raise AssertionError("no two tensor names of one length")


def _cut_in_metadata(d: bytes, r: gguf.GGUFReader) -> Bad:
    at = _value_at(r, "general.name") + 8 + 3  # inside the string's bytes
    return Bad(d[:at], rf"truncated GGUF: file ends at byte {at} while reading value of general\.name")


def _cut_in_tensor_infos(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[len(r.tensors) // 2]
    at = _info_at(t, "ne") + 3
    return Bad(d[:at], rf"truncated GGUF: file ends at byte {at} while reading shape of {re.escape(t.name)}")


def _cut_in_tensor_data(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[-1]
    at = int(t.data_offset) + int(t.n_bytes) // 2
    return Bad(d[:at], rf"truncated GGUF: tensor '{re.escape(t.name)}' needs bytes up to \d+, the file has {at}")


def _out_of_bounds(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[-1]
    return Bad(_put(d, _info_at(t, "offset"), "<Q", 1 << 40),
               rf"tensor '{re.escape(t.name)}' has data offset 1099511627776, expected \d+ \(its data is out of bounds")


def _misaligned(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[1]
    off = struct.unpack_from("<Q", d, _info_at(t, "offset"))[0]
    return Bad(_put(d, _info_at(t, "offset"), "<Q", off + 1),
               rf"tensor '{re.escape(t.name)}' has data offset {off + 1}, expected {off}")


def _duplicate_tensor(d: bytes, r: gguf.GGUFReader) -> Bad:
    a, b = _same_length_pair(r)
    return Bad(_replace(d, b.field.offset + 8, a.name.encode()),
               rf"tensor '{re.escape(a.name)}' appears twice in the tensor table")


def _duplicate_key(d: bytes, r: gguf.GGUFReader) -> Bad:
    f = r.fields["general.name"]
    assert len("general.name") == len("general.type")
    return Bad(_replace(d, f.offset + 8, b"general.type"), r"metadata key 'general\.type' appears twice")


def _absurd_dims(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = _two_d(r)
    return Bad(_put(d, _info_at(t, "ne", 1), "<Q", 1 << 62),
               rf"tensor '{re.escape(t.name)}' has an impossible shape \[\d+, {1 << 62}\]")


def _negative_dim(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = _two_d(r)
    return Bad(_put(d, _info_at(t, "ne", 1), "<q", -1), rf"tensor '{re.escape(t.name)}' has an impossible shape")


def _too_many_dims(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[0]
    return Bad(_put(d, _info_at(t, "n_dims"), "<I", 7), rf"tensor '{re.escape(t.name)}' has 7 dimensions")


def _unknown_type(d: bytes, r: gguf.GGUFReader) -> Bad:
    t = r.tensors[0]
    return Bad(_put(d, _info_at(t, "type"), "<I", 99), rf"tensor '{re.escape(t.name)}' has unknown ggml type id 99")


def _unknown_arch(d: bytes, r: gguf.GGUFReader) -> Bad:
    at = _value_at(r, "general.architecture") + 8
    assert d[at:at + 5] == b"llama"
    # the arch-scoped keys ("llama.block_count", ...) still say llama: only the architecture is unknown
    return Bad(_replace(d, at, b"llamX"), r"architecture 'llamX' is not supported by this llama\.cpp build")


def _vocab_only(d: bytes, r: gguf.GGUFReader) -> Bad:
    body = d[:r.tensors[0].field.offset]  # header and metadata, no tensor infos, no data
    return Bad(_put(body, 8, "<Q", 0), r"GGUF has no tensors \(a vocabulary-only file\?\)")


def _no_layers(d: bytes, r: gguf.GGUFReader) -> Bad:
    return Bad(_put(d, _value_at(r, "llama.block_count"), "<I", 0),
               r"llama\.block_count = 0: a model has 1 to 512 blocks")


def _too_many_layers(d: bytes, r: gguf.GGUFReader) -> Bad:
    return Bad(_put(d, _value_at(r, "llama.block_count"), "<I", 4096), r"llama\.block_count = 4096")


def _kv_heads_overflow(d: bytes, r: gguf.GGUFReader) -> Bad:
    # 134217730 KV heads of 64: n_embd_head * n_head_kv wraps uint32 to the file's real K width
    return Bad(_put(d, _value_at(r, "llama.attention.head_count_kv"), "<I", 134217730),
               r"llama\.attention\.head_count_kv = 134217730: more KV heads than")


def _duplicate_token(d: bytes, r: gguf.GGUFReader) -> Bad:
    # token 300 spelled like token 299 (llama.cpp's vocabulary loader asserts on a token listed twice)
    f = r.fields["tokenizer.ggml.tokens"]
    a, b = (bytes(f.parts[f.data[i]]) for i in (299, 300))
    assert len(a) == len(b) and a != b
    at = f.offset + sum(int(p.nbytes) for p in f.parts[:f.data[300]])
    return Bad(_replace(d, at, a), rf"tokenizer\.ggml\.tokens lists token {re.escape(repr(a))} twice \(ids 299 and 300\)")


def _bad_chat_template(d: bytes, r: gguf.GGUFReader) -> Bad:
    at = _value_at(r, "tokenizer.chat_template") + 8
    n = struct.unpack_from("<Q", d, at - 8)[0]
    i = d.index(b"{%", at, at + n)
    return Bad(_replace(d, i, b"{{"), r"a chat template in the model \(tokenizer\.chat_template\) is not valid Jinja",
               loads_header=True)


def _bad_alignment(d: bytes, r: gguf.GGUFReader) -> Bad:
    # general.file_type's u32 value renamed into general.alignment = its value (7: not a power of 2)
    f = r.fields["general.file_type"]
    key = b"general.alignment"
    assert len(key) == len("general.file_type") and r.fields["general.file_type"].contents() == 7
    return Bad(_replace(d, f.offset + 8, key), r"general\.alignment must be a power of 2 stored as uint32, not 7")


GGUF_CASES: dict[str, Callable[[bytes, gguf.GGUFReader], Bad]] = {
    "cut-in-fixed-header": lambda d, r: Bad(d[:16], r"not a GGUF file \(16 bytes, too short for a header\)"),
    "cut-in-metadata": _cut_in_metadata,
    "cut-in-tensor-infos": _cut_in_tensor_infos,
    "cut-in-tensor-data": _cut_in_tensor_data,
    "wrong-magic": lambda d, r: Bad(b"GGML" + d[4:], r"not a GGUF file \(starts with b'GGML', expected b'GGUF'\)"),
    "wrong-version": lambda d, r: Bad(_put(d, 4, "<I", 4), r"unsupported GGUF version 4"),
    "data-out-of-bounds": _out_of_bounds,
    "data-misaligned": _misaligned,
    "duplicate-tensor-name": _duplicate_tensor,
    "duplicate-metadata-key": _duplicate_key,
    "absurd-dimensions": _absurd_dims,
    "negative-dimension": _negative_dim,
    "too-many-dimensions": _too_many_dims,
    "unknown-ggml-type": _unknown_type,
    "bad-alignment": _bad_alignment,
    "unknown-architecture": _unknown_arch,
    "vocab-only": _vocab_only,
    "no-layers": _no_layers,
    "too-many-layers": _too_many_layers,
    "kv-heads-overflow": _kv_heads_overflow,
    "duplicate-token": _duplicate_token,
    "bad-chat-template": _bad_chat_template,
}


@pytest.fixture(scope="module")
def bad_models(tiny_q8: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Bad]]:
    d = tiny_q8.read_bytes()
    r = gguf.GGUFReader(tiny_q8)
    out_dir = tmp_path_factory.mktemp("bad-gguf")
    out = {}
    for name, make in GGUF_CASES.items():
        bad = make(d, r)
        p = out_dir / f"{name}.gguf"
        p.write_bytes(bad.data)
        out[name] = (p, bad)
    return out


@pytest.fixture(scope="module")
def loaded(bad_models: dict[str, tuple[Path, Bad]], tiny_q8: Path) -> dict[str, LoadOutcome]:
    """oallama.Llama on every bad file (and two good controls), all in one child process."""
    vocab = bad_models["vocab-only"][0]
    vocab_copy = vocab.with_name("vocab-only-loaded-as-vocab.gguf")
    vocab_copy.write_bytes(vocab.read_bytes())
    jobs: list[tuple[Path, dict[str, Any]]] = [(p, dict(bad.extra)) for p, bad in bad_models.values()]
    jobs += [(tiny_q8, {}), (vocab_copy, {"vocab_only": True})]
    res = load_batch(jobs, timeout_s=300, **KW)
    res["vocab-only with vocab_only=True"] = res[str(vocab_copy)]
    return res


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf(case: str, bad_models: dict[str, tuple[Path, Bad]], loaded: dict[str, LoadOutcome]) -> None:
    path, bad = bad_models[case]
    if bad.loads_header:
        gguf_file.check_model(path)  # nothing wrong with the header: llama.cpp or llama_cpp finds it
    else:
        msg = raises_cleanly(ModelFileError, bad.match, lambda: gguf_file.check_model(path))
        assert msg.startswith(f"{path}: "), msg
    got = loaded[str(path)]
    assert got.kind == "error", f"Llama({path.name}): {got}"  # not ok, not a crash, not a hang
    assert got.error == "ModelFileError" and got.oallama, got
    assert re.search(bad.match, got.message) and got.message.startswith(f"{path}: "), got.message


def test_good_controls_load(loaded: dict[str, LoadOutcome], tiny_q8: Path) -> None:
    """The cases above fail because of their defect: the file they were cut from loads, and so
    does the vocabulary-only file when only the vocabulary is asked for."""
    assert loaded[str(tiny_q8)].kind == "ok", loaded[str(tiny_q8)]
    assert loaded["vocab-only with vocab_only=True"].kind == "ok", loaded["vocab-only with vocab_only=True"]


# --- plans, profiles, devices files -------------------------------------------------------------------


def _oallama(*args: str | Path, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oallama", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def real_plan(tiny_q8: Path, rpc_server: rpc.RpcServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A plan (``oallama.plan/1``: blocks 1-2 on an rpc-server) that loads, and a profile (written
    by Profile.save with this build's build info) that loads: the good documents the cases break."""
    out = tmp_path_factory.mktemp("plans")
    info = gguf_file.read(tiny_q8)
    acc = rpc_server.device_name
    doc = {"schema": planfile.PLAN_SCHEMA, "strategy": "layers", "accelerator": acc, "devices": ["CPU", acc],
           "model": {"name": info.metadata["general.name"], "identity": info.identity()}, "load": "overrides",
           "placement": {t.name: (acc if t.name.startswith(("blk.1.", "blk.2.")) else "CPU") for t in info.tensors}}
    plan = out / "plan.json"
    plan.write_text(json.dumps(doc))
    llm = Llama(str(tiny_q8), placement=str(plan), **KW)
    try:
        assert set(llm.tensor_devices().values()) == {"CPU", acc}
    finally:
        llm.close()
    key = Profile.op_key("MUL_MAT", "q8_0", (256, 256), 1)
    link = Link(5.0, 1000.0, [(1024, 6.0)])
    prof = Profile(key="k" * 64, model_shapes="s" * 64, devices={"CPU": {"kind": "cpu"}, acc: {"kind": "rpc"}},
                   settings=Settings(1), build=build_info(),
                   ops={"CPU": {key: {"median_us": 10.0}}, acc: {key: {"median_us": 5.0}}},
                   links={acc: {"h2d": link, "d2h": link}})
    profile = prof.save(out / "profile.json")
    assert Profile.load(profile).ops == prof.ops
    return plan, profile


def _plan_variant(name: str, doc: dict[str, Any]) -> str | dict[str, Any]:
    """A broken copy of a good plan document (a str: the file's text)."""
    acc = doc["accelerator"]
    if name == "malformed-json":
        return json.dumps(doc)[:-40]
    if name == "newer-schema":
        return {**doc, "schema": _newer(planfile.PLAN_SCHEMA)}
    if name == "unknown-device":
        moved = {w: ("CUDA7" if d == acc else d) for w, d in doc["placement"].items()}
        return {**doc, "placement": moved, "devices": ["CPU", "CUDA7"], "accelerator": "CUDA7"}
    if name == "unreachable-rpc-device":
        gone = f"RPC[127.0.0.1:{closed_port()}]"
        moved = {w: (gone if d == acc else d) for w, d in doc["placement"].items()}
        return {**doc, "placement": moved, "devices": ["CPU", gone], "accelerator": gone}
    if name == "placement-not-a-device-name":
        w = next(iter(doc["placement"]))
        return {**doc, "placement": {**doc["placement"], w: 3}}
    if name == "model-identity-not-a-string":
        return {**doc, "model": {**doc["model"], "identity": 12}}
    raise AssertionError(name)


PLAN_CASES: dict[str, tuple[type[OallamaError], str]] = {
    "malformed-json": (PlanError, r"not a JSON placement/plan file"),
    "newer-schema": (PlanError, rf"unsupported plan schema '{re.escape(_newer(planfile.PLAN_SCHEMA))}' \(this oallama "
                                rf"reads {re.escape(planfile.PLAN_SCHEMA)}"),
    "unknown-device": (UnknownDeviceError, r"unknown device 'CUDA7'"),
    "unreachable-rpc-device": (RpcServerError, r"cannot reach rpc-server at 127\.0\.0\.1:\d+"),
    "placement-not-a-device-name": (PlanError, r"placement of '[^']+' is 3, not a device name"),
    "model-identity-not-a-string": (PlanError, r"the plan's model identity is 12, not a string"),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_bad_plan(case: str, real_plan: tuple[Path, Path], tiny_q8: Path, tmp_path: Path) -> None:
    exc, match = PLAN_CASES[case]
    variant = _plan_variant(case, json.loads(real_plan[0].read_text()))
    p = tmp_path / f"{case}.json"
    p.write_text(variant if isinstance(variant, str) else json.dumps(variant))
    msg = raises_cleanly(exc, match, lambda: Llama(str(tiny_q8), placement=str(p), **KW))
    assert msg.startswith(f"{p}: "), msg


def test_another_models_plan(real_plan: tuple[Path, Path], synth_model: Callable[..., Path]) -> None:
    other = synth_model("tiny", "q4_0")  # same shapes, other quantization: another model identity
    msg = raises_cleanly(PlanError, r"plan was made for model 'oallama synthetic tiny' \(identity [0-9a-f]{12}\), "
                         rf"not {other.name}", lambda: Llama(str(other), placement=str(real_plan[0]), **KW))
    assert msg.startswith(f"{real_plan[0]}: ")
    with pytest.raises(PlanError, match="plan was made for model"):
        planfile.read(real_plan[0], gguf_file.read(other))


def _profile_variant(name: str, doc: dict[str, Any]) -> str | dict[str, Any]:
    if name == "malformed-json":
        return json.dumps(doc)[:100]
    if name == "newer-schema":
        return {**doc, "schema": _newer(PROFILE_SCHEMA)}
    if name == "another-build":
        return {**doc, "build": {**doc["build"], "llama_cpp_commit": "0" * 40}}
    if name == "missing-field":
        return {k: v for k, v in doc.items() if k != "links"}
    if name == "not-an-object":
        return "[1, 2, 3]"
    raise AssertionError(name)


PROFILE_CASES: dict[str, str] = {
    "malformed-json": r"not a JSON profile",
    "newer-schema": rf"not an oallama profile \(schema '{re.escape(_newer(PROFILE_SCHEMA))}', expected "
                    rf"{re.escape(PROFILE_SCHEMA)}\)",
    "another-build": r"profile was measured by another build \(llama_cpp_commit: '0{40}'; this build has '[0-9a-f]+'\)",
    "missing-field": r"corrupt oallama profile: missing or bad field \(KeyError: 'links'\)",
    "not-an-object": r"not an oallama profile \(schema None",
}


@pytest.mark.parametrize("case", list(PROFILE_CASES))
def test_bad_profile(case: str, real_plan: tuple[Path, Path], tmp_path: Path) -> None:
    variant = _profile_variant(case, json.loads(real_plan[1].read_text()))
    p = tmp_path / f"{case}.json"
    p.write_text(variant if isinstance(variant, str) else json.dumps(variant))
    msg = raises_cleanly(ProfileError, PROFILE_CASES[case], lambda: Profile.load(p))
    assert msg.startswith(f"{p}: "), msg


def test_bad_devices_file(tmp_path: Path) -> None:
    p = tmp_path / "devices.json"
    p.write_text('{"devices": [{"name": "a"')
    assert raises_cleanly(PlanError, "not a JSON devices file", lambda: read_devices(p)).startswith(f"{p}: ")
    p.write_text('{"devices": [{"name": "a", "memory_free": "lots"}]}')
    assert "missing or bad field" in raises_cleanly(PlanError, str(p), lambda: read_devices(p))


# --- the command line -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cli:
    args: tuple[str, ...]  # {model}, {plan}, {profile}, {out}, {missing} are filled in
    match: str  # in stderr, after "oallama <command>: error: "


CLI_CASES: dict[str, Cli] = {
    "budget-12-GB": Cli(("plan", "{model}", "--gpu-budget", "12 GB", "--rpc-local", "-o", "{out}"),
                        r"budget '12 GB': write binary units without a space"),
    "budget-150%": Cli(("plan", "{model}", "--gpu-budget", "150%", "--rpc-local", "-o", "{out}"),
                       r"budget '150%': a share of the model's weights must be in \(0%, 100%\]"),
    "budget--1": Cli(("plan", "{model}", "--gpu-budget=-1", "--rpc-local", "-o", "{out}"), r"budget '-1': expected bytes"),
    "budget-empty": Cli(("plan", "{model}", "--gpu-budget=", "--rpc-local", "-o", "{out}"), r"budget '': expected bytes"),
    "budget-0": Cli(("plan", "{model}", "--gpu-budget", "0", "--rpc-local", "-o", "{out}"),
                    r"budget '0': must be at least 1 byte"),
    "unknown-device": Cli(("plan", "{model}", "--gpu-budget", "50%", "--device", "NOPE0", "-o", "{out}"),
                          r"unknown device 'NOPE0' \(known devices: CPU"),
    "prompt-0": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "--prompt", "0", "-o", "{out}"),
                    r"workload needs prompt, gen and n_ubatch >= 1 \(got 0, "),
    "plan-threads--1": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "--threads", "-1", "-o", "{out}"),
                           r"argument --threads: '-1': --threads must be at least 1"),
    "plan-ctv-q4_0-fa-off": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "--cache-type-v", "q4_0",
                                 "-o", "{out}"), r"--cache-type-v q4_0 needs flash attention"),
    "run-ctv-q8_0-fa-off": Cli(("run", "{model}", "--cache-type-v", "q8_0", "-n", "1"),
                               r"--cache-type-v q8_0 needs flash attention"),
    "run-fa-auto-unplanned": Cli(("run", "{model}", "--flash-attn", "auto", "-n", "1"),
                                 r"--flash-attn auto is resolved by planning"),
    "plan-np4-ubatch2": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "-np", "4", "--ubatch", "2",
                             "-o", "{out}"), r"--ubatch 2: a decode pass of 4 sequences needs at least 4 tokens"),
    "plan-np-ctx-short": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "--parallel", "4", "--ctx",
                              "1024", "--prompt", "300", "-o", "{out}"),
                             r"--ctx 1024: .* in each of 4 sequences \(256 cells each\)"),
    "run-threads--2": Cli(("run", "{model}", "--threads", "-2", "-n", "1"),
                          r"argument --threads: '-2': --threads must be at least 1"),
    "missing-model": Cli(("plan", "{missing}", "--gpu-budget", "50%", "--rpc-local", "-o", "{out}"),
                         r"{missing}: no such model file"),
    "profile-of-another-build": Cli(("plan", "{model}", "--gpu-budget", "50%", "--rpc-local", "--profile",
                                     "{profile}", "-o", "{out}"), r"{profile}: profile was measured by another build"),
    "run-malformed-plan": Cli(("run", "{model}", "--placement", "{plan}", "-n", "1"),
                              r"{plan}: not a JSON placement/plan file"),
    "synth-layers-0": Cli(("synth", "-o", "{out}", "--layers", "0", "-q"), r"argument --layers: '0': --layers must be at least 1"),
    "synth-layers-600": Cli(("synth", "-o", "{out}", "--layers", "600", "-q"),
                            r"{out}: cannot write the model: n_layer must be in \[1, 512\], got 600"),
    "synth-seed--1": Cli(("synth", "-o", "{out}", "--seed", "-1", "-q"), r"argument --seed: '-1': --seed must be at least 0"),
    "synth-to-missing-dir": Cli(("synth", "-o", "{missing}/m.gguf", "-q"),
                                r"{missing}/m\.gguf: cannot write the model: No such file or directory"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_option(case: str, tiny_q8: Path, real_plan: tuple[Path, Path], tmp_path: Path) -> None:
    c = CLI_CASES[case]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(_profile_variant("another-build", json.loads(real_plan[1].read_text()))))
    plan = tmp_path / "plan.json"
    plan.write_text(real_plan[0].read_text()[:-30])
    out = tmp_path / ("out.gguf" if c.args[0] == "synth" else "out.json")
    names = {"model": tiny_q8, "plan": plan, "profile": profile, "out": out, "missing": tmp_path / "missing"}
    proc = _oallama(*(a.format(**names) for a in c.args))
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err
    line = next((ln for ln in err.splitlines() if f"oallama {c.args[0]}: error: " in ln), "")
    assert re.search(c.match.format(**{k: re.escape(str(v)) for k, v in names.items()}), line), err[-2000:]
    left = [p.name for p in tmp_path.rglob("*") if p not in (profile, plan)]
    assert not left, f"partial output left behind: {left}"
