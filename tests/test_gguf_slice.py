"""A model's first layers as a GGUF of their own (model.gguf_slice): what the calibration times a whole
model's attention spans on. Checked against the model it is cut from: its keys, its tensors byte for
byte, and the attention layers llama.cpp itself builds from it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import raises_cleanly
from oallama import ModelFileError
from oallama.model import gguf_file, gguf_slice
from oallama.planner.cost import calibrate
from oallama.planner.graph import attention_layers


@pytest.mark.parametrize("keep", [1, 3])
def test_a_slice_is_the_model_s_first_layers_byte_for_byte(tmp_path: Path, tiny_q8: Path, keep: int) -> None:
    out = gguf_slice.write(tiny_q8, tmp_path / f"tiny-{keep}l.gguf", keep)
    src, got = gguf.GGUFReader(tiny_q8), gguf.GGUFReader(out)
    assert int(got.fields["llama.block_count"].contents()) == keep
    assert int(src.fields["llama.block_count"].contents()) == 4
    same = {k for k in src.fields if k != "llama.block_count"}
    assert same == {k for k in got.fields if k != "llama.block_count"}
    for k in same - {"GGUF.tensor_count", "GGUF.kv_count"}:
        assert got.fields[k].contents() == src.fields[k].contents(), k
    want = [t for t in src.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < keep]
    assert [t.name for t in got.tensors] == [t.name for t in want]
    for a, b in zip(got.tensors, want, strict=True):
        assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data), a.name
    # llama.cpp loads it, with a KV cache for each of its layers
    assert attention_layers(out).order == tuple(range(keep))
    assert gguf_file.check_model(out).hparam("block_count") == keep


def test_a_sliding_window_model_s_slice_holds_a_window_layer_and_a_full_one(tmp_path: Path,
                                                                           gemma3_270m: Path) -> None:
    """Gemma 3's pattern (five window layers, then a full one) is llama.cpp's: the calibration's slice keeps
    the fewest first layers holding both, and in them llama.cpp builds the model's own pattern."""
    whole = attention_layers(gemma3_270m)
    keep, n_layer = calibrate.slice_layers(gemma3_270m)
    assert (keep, n_layer) == (6, 18)
    got = attention_layers(gguf_slice.write(gemma3_270m, tmp_path / "gemma-6l.gguf", keep))
    assert got.order == tuple(range(keep))
    assert got.window == {il: w for il, w in whole.window.items() if il < keep} and 5 not in got.window


@pytest.mark.parametrize("keep", [0, 4, 9])
def test_a_slice_of_no_layer_or_of_every_layer_is_refused(tmp_path: Path, tiny_q8: Path, keep: int) -> None:
    dst = tmp_path / "cut.gguf"
    msg = raises_cleanly(ModelFileError, "block_count", lambda: gguf_slice.write(tiny_q8, dst, keep))
    assert str(tiny_q8) in msg and not dst.exists() and not list(tmp_path.iterdir())
