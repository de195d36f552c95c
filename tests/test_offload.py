"""The placer's per-tensor op offload (patches 0001-0003): a host weight's op moves to the
accelerator from the batch size the plan gives, seen in the scheduler's graph splits, and the
outputs do not change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oallama import Llama, PlanError, _core
from oallama.planner.graph import GraphSession
from oallama.runtime import rpc

W = "blk.0.ffn_up.weight"


@pytest.fixture(scope="session")
def tiny_f16(synth_model) -> Path:
    # f16 weights stay in plain host memory (no CPU repacking), so their ops can be streamed
    return synth_model("tiny", "f16", n_layer=2)


def _backend_of(graph, weight: str) -> str:
    return next(n.backend for n in graph.nodes if n.weight == weight and n.op == "MUL_MAT")


@pytest.mark.parametrize(("min_batch", "n_tokens", "streamed"), [
    (16, 32, True), (16, 8, False), (32, 32, True), (33, 32, False), (1, 1, True), (None, 32, False)])
def test_threshold_decides_where_the_op_runs(tiny_f16: Path, rpc_server: rpc.RpcServer, min_batch: int | None,
                                             n_tokens: int, streamed: bool) -> None:
    acc = rpc_server.device_name
    policy = {W: min_batch} if min_batch is not None else None  # None: the RPC backend's default (never)
    with GraphSession(tiny_f16, devices=[acc], n_ctx=256, n_ubatch=64, offload_policy=policy) as s:
        g = s.graph(n_tokens)
    assert _backend_of(g, W) == (acc if streamed else "CPU")
    assert _backend_of(g, "blk.0.ffn_gate.weight") == "CPU"  # others keep the default
    if streamed:
        assert g.n_splits >= 3  # CPU -> rpc -> CPU around the streamed op


def test_live_context_keeps_the_policy_and_outputs_match(tiny_f16: Path, rpc_server: rpc.RpcServer,
                                                         tmp_path: Path) -> None:
    acc = rpc_server.device_name
    plan = {"schema": "oallama.plan/1", "devices": ["CPU", acc], "load": "overrides", "n_gpu_layers": 0,
            "placement": {}, "offload_min_batch": {W: 16, "blk.0.attn_q.weight": 16}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    kw = {"n_ctx": 256, "n_ubatch": 64, "n_threads": 1, "verbose": False, "logits_all": True}
    llm = Llama(str(tiny_f16), placement=str(path), **kw)
    assert llm.offload_policy() == {W: 16, "blk.0.attn_q.weight": 16}
    ctx = llm.native_context
    assert _backend_of(_core_graph(ctx, 32), W) == acc and _backend_of(_core_graph(ctx, 8), W) == "CPU"
    prompt = llm.tokenize(b"The policy streams this weight to the rpc-server at prefill." * 2)
    assert len(prompt) >= 16
    llm.eval(prompt)
    got = np.array(llm.scores[: len(prompt)])
    assert llm.offload_policy() == {W: 16, "blk.0.attn_q.weight": 16}  # survives the context's reserves
    llm.close()
    ref_llm = Llama(str(tiny_f16), **kw)
    ref_llm.eval(prompt)
    ref = np.array(ref_llm.scores[: len(prompt)])
    ref_llm.close()
    assert float(((got - ref) ** 2).sum() / (ref**2).sum()) < 1e-4


def _core_graph(ctx: _core.Context, n: int):
    from oallama.planner.graph import Graph

    return Graph(n, _core.graph(ctx, n, 1))


def test_policy_for_a_weight_the_model_lacks(tiny_f16: Path, rpc_server: rpc.RpcServer) -> None:
    with pytest.raises(PlanError, match=r"'blk\.9\.ffn_up\.weight' that the model does not have"), GraphSession(
            tiny_f16, devices=[rpc_server.device_name], offload_policy={"blk.9.ffn_up.weight": 1}):
        pass
