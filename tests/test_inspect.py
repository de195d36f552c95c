"""The operator parser: target ops come from llama.cpp's own graph, for any architecture."""

from __future__ import annotations

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


@pytest.mark.parametrize("n_tokens", [1, 48])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_weight_matmul_is_a_target_op(shapes: dict[str, Path], preset: str, n_tokens: int) -> None:
    inv = inventory(shapes[preset], (1, n_tokens), n_ctx=256)
    g = inv.graphs[n_tokens]
    ops = inv.target_ops(n_tokens)
    # classification is by the graph alone: a MUL_MAT whose first operand is a model weight
    expected = [n.index for n in g.nodes if n.op in ("MUL_MAT", "MUL_MAT_ID") and n.weight
                and g.tensor(n.srcs[0]).weight == n.weight]
    assert [o.index for o in ops] == expected and ops
    info = gguf_file.read(shapes[preset])
    matrices = {t.name for t in info.tensors if len(t.shape) == 2 and not t.name.startswith("token_embd")}
    assert matrices <= {o.weight for o in ops}  # every 2-d weight but the input embedding is a matmul
    for o in ops:
        t = info.tensor(o.weight)
        assert o.weight_type == t.type and o.weight_bytes == t.nbytes and o.weight_shape[:2] == t.shape[:2]
        assert o.flops == 2 * t.shape[0] * t.shape[1] * o.n_tokens
        assert o.layer == (int(o.weight.split(".")[1]) if o.weight.startswith("blk.") else None)
        assert o.producers and o.act_in_bytes > 0 and o.act_out_bytes > 0
        assert o.n_tokens in (1, n_tokens)  # the last layer after out_ids, and the head, see 1 token
    if n_tokens == 1:
        assert all(o.n_tokens == 1 for o in ops)
    else:
        assert sum(o.n_tokens == n_tokens for o in ops) > len(ops) // 2


def test_mla_model_has_its_own_ops(shapes: dict[str, Path]) -> None:
    ops = inventory(shapes["minicpm3-4b"], (1,), n_ctx=256).target_ops(1)
    kinds = {o.weight.split(".")[-2] for o in ops if o.layer == 0}
    assert {"attn_q_a", "attn_q_b", "attn_kv_a_mqa"} <= kinds  # no per-architecture table told us this


def test_inspect_cli_prints_a_layer_table(shapes: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    out_json = tmp_path / "ops.json"
    assert cli_main(["inspect", str(shapes["qwq-32b"]), "--tokens", "1,32", "--ctx", "256", "--json",
                     str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "qwen2" in out and "target ops" in out
    lines = out.splitlines()
    assert any(line.split()[:1] == ["0"] for line in lines) and any(line.startswith("total") or
                                                                     " total " in line for line in lines)
    assert out_json.exists() and '"target_ops"' in out_json.read_text()
