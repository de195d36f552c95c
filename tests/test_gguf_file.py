"""Model files: oallama's GGUF header reader, its checks, and what `Llama(...)` says about a bad
file (a ModelFileError naming the file, before llama.cpp ever sees it)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from helpers import raises_cleanly
from oallama import Llama, ModelFileError
from oallama.model import gguf_file

KW: dict[str, Any] = {"n_ctx": 256, "verbose": False, "n_threads": 2}


def _raises(match: str, build: Callable[[], object]) -> str:
    return raises_cleanly(ModelFileError, match, build)


def _all_refuse(path: Path, match: str) -> list[str]:
    """read, check_model and Llama all raise ModelFileError matching `match`, naming the file."""
    messages = [_raises(match, lambda: gguf_file.read(path)),
                _raises(match, lambda: gguf_file.check_model(path)),
                _raises(match, lambda: Llama(str(path), **KW))]
    for m in messages:
        assert str(path) in m, m
    return messages


# --- files that are not a usable GGUF -------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    _all_refuse(tmp_path / "nope.gguf", "no such model file")


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "model.gguf"
    d.mkdir()
    _all_refuse(d, "is a directory")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_text("this is a text file, not a model\n" * 4)
    _all_refuse(p, r"not a GGUF file \(starts with b'this', expected b'GGUF'\)")


def test_too_short_for_a_header(tmp_path: Path) -> None:
    p = tmp_path / "short.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00\x00\x00")
    _all_refuse(p, r"not a GGUF file \(10 bytes, too short")


def test_unsupported_version(tmp_path: Path, tiny_q8: Path) -> None:
    data = bytearray(tiny_q8.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    p = tmp_path / "v99.gguf"
    p.write_bytes(bytes(data))
    _all_refuse(p, "unsupported GGUF version 99")


def _tensor_table_bytes(info: gguf_file.GGUFInfo) -> int:
    # per tensor: name (u64 length + bytes), n_dims u32, ne u64 each, type u32, offset u64
    return sum(8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4 + 8 for t in info.tensors)


def _cut(info: gguf_file.GGUFInfo, where: str) -> int:
    table = _tensor_table_bytes(info)
    assert table >= 64
    return {
        "in-the-first-key": 40,  # fixed header: 24 bytes, then general.architecture's key
        "in-the-metadata": 1000,  # inside the vocabulary arrays
        # the table ends between data_offset - (alignment - 1) and data_offset
        "in-the-tensor-table": info.data_offset - 32 - table // 2,
        "in-the-tensor-data": info.data_offset + info.weight_bytes // 2,
        "one-byte-short": info.file_size - 1,
    }[where]


@pytest.mark.parametrize("where", ["in-the-first-key", "in-the-metadata", "in-the-tensor-table"])
def test_truncated_in_the_header(tmp_path: Path, tiny_q8: Path, where: str) -> None:
    info = gguf_file.read(tiny_q8)
    cut = _cut(info, where)
    assert cut < info.data_offset
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(tiny_q8.read_bytes()[:cut])
    for m in _all_refuse(p, "truncated GGUF: file ends"):
        if where == "in-the-tensor-table":
            assert "tensor name" in m or any(f"of {t.name}" in m for t in info.tensors), m


@pytest.mark.parametrize("where", ["in-the-tensor-data", "one-byte-short"])
def test_truncated_in_the_tensor_data(tmp_path: Path, tiny_q8: Path, where: str) -> None:
    info = gguf_file.read(tiny_q8)
    cut = _cut(info, where)
    assert info.data_offset < cut < info.file_size
    # the first tensor, in table order, whose bytes the cut removes
    victim = next(t for t in info.tensors if info.data_offset + t.offset + t.nbytes > cut)
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(tiny_q8.read_bytes()[:cut])
    end = info.data_offset + victim.offset + victim.nbytes
    _all_refuse(p, rf"truncated GGUF: tensor '{victim.name}' needs bytes up to {end}, the file has {cut}")
    # the header alone is still readable when asked not to check the data
    assert len(gguf_file.read(p, check_size=False).tensors) == len(info.tensors)


def test_unknown_architecture(tmp_path: Path) -> None:
    p = tmp_path / "odd-arch.gguf"
    w = gguf.GGUFWriter(p, "notanarch")
    w.add_block_count(1)
    w.add_tensor("blk.0.w.weight", np.ones((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = gguf_file.read(p)  # a well-formed file: the reader itself has no opinion on architectures
    assert info.architecture == "notanarch" and [t.name for t in info.tensors] == ["blk.0.w.weight"]
    msg = r"architecture 'notanarch' is not supported"
    _raises(msg, lambda: gguf_file.check_model(p))
    assert str(p) in _raises(msg, lambda: Llama(str(p), **KW))


# --- a good file ----------------------------------------------------------------------------


def test_good_file_agrees_with_gguf_py(tiny_q8: Path) -> None:
    info = gguf_file.check_model(tiny_q8)
    assert info.architecture == "llama" and info.version == 3
    assert info.hparam("block_count") == 4 and info.hparam("embedding_length") == 256
    assert len(info.tensors) == 4 * 9 + 3  # per layer: 7 matrices + 2 norms; embd, output, output_norm
    assert info.metadata["tokenizer.ggml.model"] == "llama"
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 4096 and tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert info.file_size == tiny_q8.stat().st_size
    assert info.weight_bytes == sum(t.nbytes for t in info.tensors)

    reader = gguf.GGUFReader(tiny_q8)  # gguf-py's full reader, as the reference
    assert info.data_offset == reader.data_offset
    expected = [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name.lower(), int(t.data_offset),
                 int(t.n_bytes)) for t in reader.tensors]
    got = [(t.name, t.shape, t.type.lower(), info.data_offset + t.offset, t.nbytes) for t in info.tensors]
    assert got == expected
    assert info.tensor("output.weight").n_elements == 256 * 4096


def test_identity_is_stable_and_tells_models_apart(tiny_q8: Path, synth_model: Callable[..., Path],
                                                   tmp_path: Path) -> None:
    ident = gguf_file.read(tiny_q8).identity()
    assert len(ident) == 64 and int(ident, 16) >= 0
    assert gguf_file.read(tiny_q8).identity() == ident  # read again
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(tiny_q8, copy)
    assert gguf_file.read(copy).identity() == ident  # content, not path
    other_type = synth_model("tiny", "q4_0")
    other_preset = synth_model("llama3-8b", "q8_0", n_layer=1, shape_only=True)
    idents = {ident, gguf_file.read(other_type).identity(), gguf_file.read(other_preset).identity()}
    assert len(idents) == 3
