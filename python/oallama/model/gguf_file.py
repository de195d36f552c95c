"""A fast, strict reader of a GGUF file's header: metadata, tensor table, and whether the
file holds all the bytes its tensor table promises.

It exists so that a bad file gets a clear error naming the file (missing, not GGUF,
truncated, unknown architecture) before llama.cpp sees it, and so that a model's identity
(names, shapes, types of its tensors) can be hashed without loading it. Large string arrays
(the vocabulary) are skipped, not decoded.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from ..errors import ModelFileError

_MAGIC = b"GGUF"
# GGUF value types -> struct format of one element (8 = string, 9 = array: special)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_KEEP_ARRAY_MAX = 4096  # arrays longer than this are skipped (their length is kept)
# limits ggml's gguf.cpp enforces (a file past them is refused by llama.cpp, so it is refused here first)
_MAX_STRING = 1 << 30  # GGUF_MAX_STRING_LENGTH
_MAX_NAME = 64  # GGML_MAX_NAME, with the terminating NUL
_INT64_MAX = (1 << 63) - 1
_TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] (row length) first
    type: str  # ggml type name, e.g. "q4_K", "f16"
    type_id: int
    offset: int  # bytes, from the start of the data section
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFInfo:
    path: Path
    version: int
    metadata: dict[str, Any]  # scalars, short arrays; long arrays as ("array", type, length)
    tensors: list[TensorInfo]
    data_offset: int  # bytes
    file_size: int  # bytes
    _by_name: dict[str, TensorInfo] = field(default_factory=dict, repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor(self, name: str) -> TensorInfo:
        if not self._by_name:
            self._by_name = {t.name: t for t in self.tensors}
        return self._by_name[name]

    def hparam(self, key: str, default: Any = None) -> Any:
        """Architecture-scoped metadata: hparam("block_count") reads "<arch>.block_count"."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def shape_only(self) -> bool:
        """Written by `oallama synth --shape-only`: real shapes, zero weights (never to be run)."""
        return bool(self.metadata.get("oallama.synthetic.shape_only", False))

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def identity(self) -> str:
        """sha256 over (name, shape, type) of every tensor: equal for the same model shape+quant."""
        h = hashlib.sha256()
        h.update(self.architecture.encode())
        for t in sorted(self.tensors, key=lambda t: t.name):
            h.update(f"\n{t.name}:{','.join(map(str, t.shape))}:{t.type}".encode())
        return h.hexdigest()


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise ModelFileError(
                f"{self.path}: truncated GGUF: file ends at byte {len(self.buf)} while reading {what}"
            )
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > len(self.buf) or n > _MAX_STRING:
            raise ModelFileError(f"{self.path}: corrupt GGUF: {what} claims {n} bytes")
        return self.take(n, what).decode("utf-8", errors="replace")

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise ModelFileError(f"{self.path}: truncated GGUF: file ends while reading {what}")
        self.pos += n


def _read_value(c: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALAR:
        return c.unpack(_SCALAR[vtype], f"value of {key}")
    if vtype == 8:
        return c.string(f"value of {key}")
    if vtype == 9:
        etype = c.unpack("<I", f"array type of {key}")
        count = c.unpack("<Q", f"array length of {key}")
        if etype in _SCALAR:
            size = struct.calcsize(_SCALAR[etype])
            if count > _KEEP_ARRAY_MAX:
                c.skip(size * count, f"array {key}")
                return ("array", etype, count)
            raw = c.take(size * count, f"array {key}")
            return list(struct.unpack(f"<{count}{_SCALAR[etype][1]}", raw))
        if etype == 8:
            if key == _TOKENS:
                return _read_tokens(c, count)
            if count > _KEEP_ARRAY_MAX:
                for _ in range(count):
                    c.skip(c.unpack("<Q", f"array {key}"), f"array {key}")
                return ("array", etype, count)
            return [c.string(f"array {key}") for _ in range(count)]
        raise ModelFileError(f"{c.path}: corrupt GGUF: array {key} has element type {etype}")
    raise ModelFileError(f"{c.path}: corrupt GGUF: key {key} has value type {vtype}")


def _read_tokens(c: _Cursor, count: int) -> list[str] | tuple[str, int, int]:
    """The vocabulary (kept when short), refusing a token listed twice: llama.cpp's vocabulary
    loader asserts (aborts the process) on one. It compares raw bytes, and names an empty token
    "[EMPTY_<id>]" as llama.cpp does."""
    what = f"array {_TOKENS}"
    keep = count <= _KEEP_ARRAY_MAX
    seen: dict[bytes, int] = {}
    out: list[str] = []
    for i in range(count):
        n = c.unpack("<Q", what)
        if n > _MAX_STRING:
            raise ModelFileError(f"{c.path}: corrupt GGUF: token {i} of {_TOKENS} claims {n} bytes")
        raw = c.take(n, what) or f"[EMPTY_{i}]".encode()
        first = seen.setdefault(raw, i)
        if first != i:
            raise ModelFileError(f"{c.path}: corrupt GGUF: {_TOKENS} lists token {raw[:40]!r} twice "
                                 f"(ids {first} and {i})")
        if keep:
            out.append(raw.decode("utf-8", errors="replace") if n else "")
    return out if keep else ("array", 8, count)


def _nbytes(type_id: int, shape: tuple[int, ...], name: str, path: Path) -> tuple[str, int]:
    try:
        qtype = gguf.GGMLQuantizationType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelFileError(f"{path}: tensor '{name}' has unknown ggml type id {type_id}") from None
    n = 1
    for d in shape:
        n *= d
    row = shape[0] if shape else 1  # ggml's ne[0] of a 0-d tensor is 1
    if row % block:
        raise ModelFileError(f"{path}: tensor '{name}' row of {row} is not a multiple of {block}")
    return qtype.name.lower().replace("_k", "_K"), n // block * type_size


def read(path: str | Path, *, check_size: bool = True) -> GGUFInfo:
    """Parse the header of a GGUF file; raise ModelFileError naming the file on any defect."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"{p}: no such model file")
    if p.is_dir():
        raise ModelFileError(f"{p}: is a directory, not a GGUF file")
    size = p.stat().st_size
    if size < 24:
        raise ModelFileError(f"{p}: not a GGUF file ({size} bytes, too short for a header)")
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        known = (str(p.resolve()), check_size)
        if (seen := _parsed.get(known)) is not None and seen[0] == size and seen[2].data_offset <= size \
                and hashlib.blake2b(buf[:seen[2].data_offset]).digest() == seen[1]:
            return _copy(seen[2], p)
        c = _Cursor(buf, p)
        magic = c.take(4, "magic")
        if magic != _MAGIC:
            raise ModelFileError(f"{p}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        version = c.unpack("<I", "version")
        if version not in (2, 3):
            raise ModelFileError(f"{p}: unsupported GGUF version {version}")
        n_tensors = c.unpack("<Q", "tensor count")
        n_kv = c.unpack("<Q", "metadata count")
        if n_tensors > size or n_kv > size:
            raise ModelFileError(f"{p}: truncated or corrupt GGUF: its header lists {n_tensors} tensors and "
                                 f"{n_kv} keys, which cannot fit in the file's {size} bytes")
        meta: dict[str, Any] = {}
        for i in range(n_kv):
            key = c.string("metadata key")
            if not key:
                raise ModelFileError(f"{p}: corrupt GGUF: metadata key {i} is empty")
            if key in meta:
                raise ModelFileError(f"{p}: corrupt GGUF: metadata key '{key}' appears twice")
            vtype = c.unpack("<I", f"type of {key}")
            meta[key] = _read_value(c, vtype, key)
            if key == "general.alignment" and (vtype != 4 or not meta[key] or meta[key] & (meta[key] - 1)):
                raise ModelFileError(f"{p}: corrupt GGUF: general.alignment must be a power of 2 "
                                     f"stored as uint32, not {meta[key]!r} (value type {vtype})")
        tensors = []
        seen: set[str] = set()
        for _ in range(n_tensors):
            name = c.string("tensor name")
            if len(name.encode()) >= _MAX_NAME:
                raise ModelFileError(f"{p}: corrupt GGUF: tensor name '{name[:80]}' is longer than "
                                     f"{_MAX_NAME - 1} bytes")
            if name in seen:
                raise ModelFileError(f"{p}: corrupt GGUF: tensor '{name}' appears twice in the tensor table")
            seen.add(name)
            n_dims = c.unpack("<I", f"dimensions of {name}")
            if n_dims > 4:
                raise ModelFileError(f"{p}: tensor '{name}' has {n_dims} dimensions")
            shape = tuple(c.unpack("<Q", f"shape of {name}") for _ in range(n_dims))
            n_elements = 1
            for d in shape:
                n_elements *= d
            if any(d > _INT64_MAX for d in shape) or n_elements > _INT64_MAX:
                raise ModelFileError(f"{p}: corrupt GGUF: tensor '{name}' has an impossible shape "
                                     f"{list(shape)} (more than 2**63 - 1 elements, or a negative dimension)")
            type_id = c.unpack("<I", f"type of {name}")
            offset = c.unpack("<Q", f"offset of {name}")
            tname, nbytes = _nbytes(type_id, shape, name, p)
            tensors.append(TensorInfo(name, shape, tname, type_id, offset, nbytes))
        align = int(meta.get("general.alignment", 32))
        data_offset = (c.pos + align - 1) // align * align
        digest = hashlib.blake2b(buf[:data_offset]).digest() if data_offset <= size else b""
    info = GGUFInfo(p, version, meta, tensors, data_offset, size)
    # gguf.cpp's layout: each tensor's data starts where the previous one's (padded to the
    # alignment) ends; anything else is refused by llama.cpp, so refuse it here with the tensor's name
    expected = 0
    for t in tensors:
        if t.offset != expected:
            raise ModelFileError(f"{p}: corrupt GGUF: tensor '{t.name}' has data offset {t.offset}, expected "
                                 f"{expected} (its data is out of bounds or overlaps another tensor's)")
        expected += (t.nbytes + align - 1) // align * align
    if check_size:
        for t in tensors:
            end = data_offset + t.offset + t.nbytes
            if end > size:
                raise ModelFileError(
                    f"{p}: truncated GGUF: tensor '{t.name}' needs bytes up to {end}, "
                    f"the file has {size}"
                )
    if digest:
        _parsed.pop(known, None)
        _parsed[known] = (size, digest, info)
        while len(_parsed) > _PARSED_MAX:
            del _parsed[next(iter(_parsed))]
    return _copy(info, p)


# Headers read before (a planning run reads one model's 14-15 times: every graph built checks it, and
# a 150k-token vocabulary takes 0.3 s to parse): (resolved path, check_size) -> (file size, blake2b
# of the header bytes, what they parsed to). A header is taken again only where every one of its
# bytes and the file's size are the same, which is all a parse reads.
_parsed: dict[tuple[str, bool], tuple[int, bytes, GGUFInfo]] = {}
_PARSED_MAX = 8


def _copy(info: GGUFInfo, path: Path) -> GGUFInfo:
    """A caller's own GGUFInfo (its metadata dict and tensor list its own to change), named as it asked."""
    return GGUFInfo(path, info.version, dict(info.metadata), list(info.tensors), info.data_offset, info.file_size)


def check_model(path: str | Path, *, vocab_only: bool = False) -> GGUFInfo:
    """read() plus: the architecture must be one this llama.cpp build supports, and (unless only
    the vocabulary is wanted) the file must hold tensors."""
    from .. import _core

    info = read(path)
    arch = info.architecture
    if not arch:
        raise ModelFileError(f"{info.path}: GGUF has no general.architecture")
    if not isinstance(info.metadata["general.architecture"], str):
        raise ModelFileError(f"{info.path}: GGUF's general.architecture is not a string")
    if not info.tensors and not vocab_only:
        raise ModelFileError(f"{info.path}: GGUF has no tensors (a vocabulary-only file?): nothing to load "
                             "(load it with vocab_only=True for its tokenizer)")
    if not _core.arch_is_supported(arch):
        raise ModelFileError(f"{info.path}: architecture '{arch}' is not supported by this llama.cpp build")
    if not vocab_only:
        _check_hparams(info)
    return info


_MAX_LAYERS, _MAX_EXPERTS = 512, 1024  # llama.cpp's LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS
_ROPE_SCALING = ("none", "linear", "yarn", "longrope")


def _check_hparams(info: GGUFInfo) -> None:
    """The hyperparameter checks llama.cpp's loader makes with GGML_ASSERT, which aborts the whole
    process, made here first as a ModelFileError (values of the wrong type are left to llama.cpp,
    which refuses them with an error of its own)."""

    def count(key: str) -> int | None:
        v = info.hparam(key)
        if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
            v = max(v)  # a per-layer array: llama.cpp checks its largest entry
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def bad(key: str, why: str) -> ModelFileError:
        return ModelFileError(f"{info.path}: corrupt model: {info.architecture}.{key} = {info.hparam(key)!r}: {why}")

    n_layer = count("block_count")
    if n_layer is not None and not 0 < n_layer <= _MAX_LAYERS:
        raise bad("block_count", f"a model has 1 to {_MAX_LAYERS} blocks")
    n_nextn = count("nextn_predict_layers")
    if n_layer is not None and n_nextn is not None and n_nextn > n_layer:
        raise bad("nextn_predict_layers", f"more than the {n_layer} blocks")
    n_expert, n_used = count("expert_count") or 0, count("expert_used_count") or 0
    n_groups, n_group_used = count("expert_group_count") or 0, count("expert_group_used_count") or 0
    if n_expert > _MAX_EXPERTS:
        raise bad("expert_count", f"at most {_MAX_EXPERTS} experts")
    if n_used > n_expert or (n_expert > 0 and n_used == 0):
        raise bad("expert_used_count", f"must be in [1, expert_count = {n_expert}]" if n_expert
                  else "a model without experts uses none")
    if n_groups and (n_groups >= max(n_expert, 1) or (n_groups > 1 and (n_expert % n_groups or
                                                                         not 0 < n_group_used < n_groups))):
        raise bad("expert_group_count", f"does not divide expert_count = {n_expert} into groups "
                  f"(expert_group_used_count = {n_group_used})")
    n_head, n_head_kv = count("attention.head_count"), count("attention.head_count_kv")
    if n_head is not None and n_head_kv is not None and n_head_kv > n_head:  # (n_embd_head * n_head_kv wraps)
        raise bad("attention.head_count_kv", f"more KV heads than the {n_head} attention heads")
    scaling = info.hparam("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in _ROPE_SCALING:
        raise bad("rope.scaling.type", f"not one of {', '.join(_ROPE_SCALING)}")
