"""The operator parser: target ops come from llama.cpp's own graph, for any architecture."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from oallama.cli import main as cli_main
from oallama.model import gguf_file
from oallama.planner.graph import inventory

PRESETS = ["tiny", "qwq-32b", "minicpm3-4b"]  # llama, qwen2, MLA


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from oallama.model import synthetic

    d = tmp_path_factory.mktemp("inspect")
    return {p: synthetic.write_model(d / f"{p}.gguf", p, "q4_k_m", n_layer=3, shape_only=True, progress=False)
            for p in PRESETS}


def _matmul_weights(info: gguf_file.GGUFInfo) -> set[str]:
    """The weights llama.cpp multiplies, from the file alone: every matrix (2-d or more), except the
    input embedding, which is looked up (GET_ROWS), unless there is no output.weight and the head
    reuses it (tied output)."""
    names = {t.name for t in info.tensors}
    tied = "output.weight" not in names
    return {t.name for t in info.tensors if len(t.shape) >= 2 and (tied or t.name != "token_embd.weight")}


@pytest.mark.parametrize("n_tokens", [1, 48])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_weight_matmul_is_a_target_op(shapes: dict[str, Path], preset: str, n_tokens: int) -> None:
    inv = inventory(shapes[preset], (1, n_tokens), n_ctx=256)
    g = inv.graphs[n_tokens]
    ops = inv.target_ops(n_tokens)
    info = gguf_file.read(shapes[preset])
    names = {t.name for t in info.tensors}
    # classification is by the graph alone: a MUL_MAT whose first operand is a model weight, told here
    # by ggml's own tensor names against the file's tensor table
    expected = [n.index for n in g.nodes if n.op in ("MUL_MAT", "MUL_MAT_ID") and g.tensor(n.srcs[0]).name in names]
    assert [o.index for o in ops] == expected and ops
    assert [o.weight for o in ops] == [g.tensor(g.nodes[i].srcs[0]).name for i in expected]
    # each weight llama.cpp multiplies is one op, once per graph
    assert sorted(o.weight for o in ops) == sorted(_matmul_weights(info))
    last = int(info.hparam("block_count")) - 1
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    for o in ops:
        t = info.tensor(o.weight)
        node = g.nodes[o.index]
        assert o.weight_type == t.type and o.weight_bytes == t.nbytes and o.weight_shape[:2] == t.shape[:2]
        # the result, as ggml shaped it: one row per weight row, one column per token
        assert node.ne[0] == t.shape[1] and node.ne[1] * node.ne[2] * node.ne[3] == o.n_tokens
        assert o.flops == 2 * t.shape[0] * t.shape[1] * o.n_tokens  # 2 flops (mul, add) per weight per column
        assert o.layer == (int(o.weight.split(".")[1]) if o.weight.startswith("blk.") else None)
        assert o.producers and o.act_in_bytes > 0 and o.act_out_bytes > 0
    # with one output, llama.cpp keeps only the last token's row after the last layer's attention
    # (`if (il == n_layer - 1 && inp_out_ids) cur = ggml_get_rows(...)` in src/models/<arch>.cpp): that
    # layer's feed-forward and the head see 1 token; every other op sees them all
    one = {o.weight for o in ops if o.n_tokens == 1}
    if n_tokens == 1:
        assert one == {o.weight for o in ops}
    else:
        assert one == {f"blk.{last}.ffn_{k}.weight" for k in ("gate", "up", "down")} | {head}
        assert all(o.n_tokens == n_tokens for o in ops if o.weight not in one)


def test_mla_model_has_its_own_ops(shapes: dict[str, Path]) -> None:
    ops = inventory(shapes["minicpm3-4b"], (1,), n_ctx=256).target_ops(1)
    kinds = {o.weight.split(".")[-2] for o in ops if o.layer == 0}
    assert {"attn_q_a", "attn_q_b", "attn_kv_a_mqa"} <= kinds  # no per-architecture table told us this
    # and exactly layer 0's matrices in the file
    info = gguf_file.read(shapes["minicpm3-4b"])
    assert kinds == {t.name.split(".")[-2] for t in info.tensors if t.name.startswith("blk.0.") and len(t.shape) >= 2}


def test_inspect_cli_prints_a_layer_table(shapes: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    out_json = tmp_path / "ops.json"
    model = shapes["qwq-32b"]
    assert cli_main(["inspect", str(model), "--tokens", "1,32", "--ctx", "256", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    # what the table must say, from the file: the matrices llama.cpp multiplies, per layer
    info = gguf_file.read(model)
    weights = _matmul_weights(info)
    per_layer = Counter(int(w.split(".")[1]) if w.startswith("blk.") else None for w in weights)
    assert info.architecture in out and f"{len(info.tensors)} tensors" in out
    assert f"{len(weights)} target ops" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    for layer in range(int(info.hparam("block_count"))):
        assert int(rows[str(layer)][1]) == per_layer[layer], rows.get(str(layer))
    assert int(rows["-"][1]) == per_layer[None] and int(rows["total"][1]) == len(weights)
    doc = json.loads(out_json.read_text())
    assert doc["identity"] == info.identity()
    for n in ("1", "32"):
        assert sorted(o["weight"] for o in doc["target_ops"][n]) == sorted(weights)
