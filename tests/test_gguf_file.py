"""Model files: oallama's GGUF header reader, its checks, and what `Llama(...)` says about a bad
file (a ModelFileError naming the file, before llama.cpp ever sees it)."""

from __future__ import annotations

import re
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
from oallama.model.synthetic import PRESETS

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


# Where to cut a good file, and what the reader must then say it was reading. Positions come from
# gguf-py's reader (each metadata field's and tensor-info record's offset), not from oallama's.
Cut = Callable[[gguf.GGUFReader], tuple[int, str]]


def _in_the_first_key(reader: gguf.GGUFReader) -> tuple[int, str]:
    first = next(f for f in reader.fields.values() if not f.name.startswith("GGUF."))
    assert first.offset == 24  # the fixed header: magic, version u32, tensor count u64, key count u64
    cut = first.offset + 8 + len(first.name) // 2  # halfway through the key's bytes (after its u64 length)
    return cut, rf"file ends at byte {cut} while reading metadata key"


def _in_the_metadata(reader: gguf.GGUFReader) -> tuple[int, str]:
    tokens = reader.fields["tokenizer.ggml.tokens"]  # the vocabulary: most of the metadata
    cut = tokens.offset + sum(int(p.nbytes) for p in tokens.parts) // 2
    return cut, r"file ends (at byte \d+ )?while reading array tokenizer\.ggml\.tokens"


def _in_the_tensor_table(reader: gguf.GGUFReader) -> tuple[int, str]:
    t = reader.tensors[len(reader.tensors) // 2]
    # a tensor-info record: name (u64 length + bytes), n_dims u32, then ne[0] u64: cut inside ne[0]
    cut = t.field.offset + 8 + len(t.name) + 4 + 4
    assert t.field.parts[0].nbytes == 8 and int(t.field.parts[2][0]) == len(t.shape)  # the layout assumed
    return cut, rf"file ends at byte {cut} while reading shape of {re.escape(t.name)}"


HEADER_CUTS: dict[str, Cut] = {"in-the-first-key": _in_the_first_key, "in-the-metadata": _in_the_metadata,
                               "in-the-tensor-table": _in_the_tensor_table}
DATA_CUTS: dict[str, Callable[[gguf.GGUFReader, int], int]] = {
    "in-the-tensor-data": lambda r, size: int(r.data_offset) + sum(int(t.n_bytes) for t in r.tensors) // 2,
    "one-byte-short": lambda r, size: size - 1,
}


@pytest.mark.parametrize("where", list(HEADER_CUTS))
def test_truncated_in_the_header(tmp_path: Path, tiny_q8: Path, where: str) -> None:
    reader = gguf.GGUFReader(tiny_q8)
    cut, what = HEADER_CUTS[where](reader)
    assert cut < reader.data_offset
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(tiny_q8.read_bytes()[:cut])
    _all_refuse(p, "truncated GGUF: " + what)


@pytest.mark.parametrize("where", list(DATA_CUTS))
def test_truncated_in_the_tensor_data(tmp_path: Path, tiny_q8: Path, where: str) -> None:
    reader = gguf.GGUFReader(tiny_q8)
    size = tiny_q8.stat().st_size
    cut = DATA_CUTS[where](reader, size)
    assert reader.data_offset < cut < size
    # the first tensor, in table order, whose bytes the cut removes (gguf-py's absolute offsets)
    victim = next(t for t in reader.tensors if int(t.data_offset) + int(t.n_bytes) > cut)
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(tiny_q8.read_bytes()[:cut])
    end = int(victim.data_offset) + int(victim.n_bytes)
    _all_refuse(p, rf"truncated GGUF: tensor '{victim.name}' needs bytes up to {end}, the file has {cut}")
    # the header alone is still readable when asked not to check the data
    assert [t.name for t in gguf_file.read(p, check_size=False).tensors] == [t.name for t in reader.tensors]


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
    reader = gguf.GGUFReader(tiny_q8)  # gguf-py's full reader, as the reference
    preset = PRESETS["tiny"]  # what the file was written to be
    assert info.architecture == preset.arch and info.version == reader.fields["GGUF.version"].contents() == 3
    # every key, with its full value (the tiny vocabulary is short enough to be kept, not skipped)
    assert info.metadata == {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert info.hparam("block_count") == preset.n_layer and info.hparam("embedding_length") == preset.n_embd
    assert len(info.tensors) == len(reader.tensors) == reader.fields["GGUF.tensor_count"].contents()
    assert info.metadata["tokenizer.ggml.model"] == "llama"
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == preset.n_vocab and tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert info.file_size == tiny_q8.stat().st_size
    assert info.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors)

    assert info.data_offset == reader.data_offset
    expected = [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name.lower(), int(t.data_offset),
                 int(t.n_bytes)) for t in reader.tensors]
    got = [(t.name, t.shape, t.type.lower(), info.data_offset + t.offset, t.nbytes) for t in info.tensors]
    assert got == expected
    out = next(t for t in reader.tensors if t.name == "output.weight")
    assert info.tensor("output.weight").n_elements == int(out.n_elements) == preset.n_embd * preset.n_vocab


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


def test_a_header_read_again_is_not_parsed_again(tiny_q8: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning reads one model's header every time it builds a graph (14-15 times for the 30B-A3B
    shape, 0.3 s each with its 150k-token vocabulary): an unchanged file's is parsed once; each read
    still hands out its own GGUFInfo."""
    first = gguf_file.read(tiny_q8)
    monkeypatch.setattr(gguf_file, "_read_value", lambda *a: pytest.fail("the unchanged header was parsed again"))
    again = gguf_file.read(tiny_q8)
    assert again is not first and again.metadata is not first.metadata and again.tensors is not first.tensors
    assert (again.metadata, again.tensors, again.data_offset, again.file_size) == \
        (first.metadata, first.tensors, first.data_offset, first.file_size)
    again.metadata["general.architecture"] = "changed by a caller"
    assert gguf_file.read(tiny_q8).architecture == first.architecture


@pytest.mark.parametrize("same_size", [True, False], ids=["rewritten-same-size", "rewritten-longer"])
def test_a_header_changed_since_it_was_read_is_parsed_again(tmp_path: Path, tiny_q8: Path, same_size: bool) -> None:
    """A file rewritten between two reads, within the file system's timestamp granularity and at the
    same size too, reads as it now is: what a header parses to is kept only with its every byte."""
    p = tmp_path / "m.gguf"
    shutil.copy(tiny_q8, p)
    assert gguf_file.read(p).architecture == "llama"
    data = bytearray(p.read_bytes())
    at = data.index(b"general.architecture") + len(b"general.architecture") + 4 + 8  # key, value type, length
    assert data[at:at + 5] == b"llama"
    data[at:at + 5] = b"llamb"
    p.write_bytes(bytes(data) + (b"" if same_size else b"\0" * 64))
    info = gguf_file.read(p)
    assert info.architecture == "llamb" and info.file_size == len(data) + (0 if same_size else 64)
