"""A model's first layers as a GGUF of their own: the same metadata, tokenizer and tensors, with
`<arch>.block_count` cut and every per-layer array cut with it.

Why: what a layer's nodes cost does not depend on how many layers follow it, and timing a whole
model's passes many times over (the calibration's attention spans: 294-1242 s for a whole 4B shape
on this VM's CPU) costs what the layers it does not need cost. A slice's passes cost its layers,
the embeddings and the output.

    from oallama.model import gguf_slice
    path = gguf_slice.write("model.gguf", "model-2l.gguf", 2)   # layers 0 and 1, renumbered as they were
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import gguf

from ..errors import ModelFileError

_LAYER = re.compile(r"^blk\.(\d+)\.")


def write(src: str | Path, dst: str | Path, n_layer: int) -> Path:
    """Write the first `n_layer` layers of the GGUF at `src` to `dst` (atomically: a temporary file
    beside it, renamed); its tensors' data copied byte for byte. The slice keeps every tensor not of a
    layer (embeddings, output, norms, rope factors) and every key, `<arch>.block_count` set to n_layer
    and each `<arch>.*` array with one entry per layer cut to its first n_layer entries."""
    src, dst = Path(src), Path(dst)
    try:
        reader = gguf.GGUFReader(src)
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{src}: not a readable GGUF ({e})") from None
    arch_field = reader.fields.get(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise ModelFileError(f"{src}: no general.architecture")
    arch = str(arch_field.contents())
    count = reader.fields.get(f"{arch}.block_count")
    total = int(count.contents()) if count is not None else 0
    if not 1 <= n_layer < total:
        raise ModelFileError(f"{src}: a slice of {n_layer} layers of a model with {total} ({arch}.block_count)")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # written by GGUFWriter itself
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if field.name == f"{arch}.block_count":
                value = n_layer
            elif sub is not None and field.name.startswith(f"{arch}.") and len(value) == total:
                value = value[:n_layer]  # one entry per layer (head counts, window pattern, ...)
            writer.add_key_value(field.name, value, vtype, sub_type=sub)
        keep = [t for t in reader.tensors if (m := _LAYER.match(t.name)) is None or int(m[1]) < n_layer]
        for t in keep:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in keep:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return dst
