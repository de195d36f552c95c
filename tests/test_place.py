"""Placement -> llama.cpp override patterns: exact, compact, escaped (checked with Python's re,
whose syntax agrees with std::regex's ECMAScript grammar on the constructs used)."""

from __future__ import annotations

import random
import re

import pytest

from oallama.runtime.place import MAX_OVERRIDES, LoadSpec, compile_patterns

SUFFIXES = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias", "attn_output.weight",
            "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "attn_norm.weight"]
NAMES = [f"blk.{i}.{s}" for i in range(64) for s in SUFFIXES] + ["token_embd.weight", "output.weight",
                                                                   "output_norm.weight"]


def _matches(patterns: list[tuple[str, str]], name: str) -> list[str]:
    return [dev for pat, dev in patterns if re.search(pat, name)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_devices", [1, 3])
def test_patterns_match_exactly_the_assignment(seed: int, n_devices: int) -> None:
    rng = random.Random(seed)
    devs = ["CPU", "CUDA0", "RPC[127.0.0.1:50052]"][:n_devices]
    assignment = {n: rng.choice(devs) for n in NAMES if rng.random() < 0.6}
    patterns = compile_patterns(assignment)
    for name in NAMES:
        got = _matches(patterns, name)
        assert got == ([assignment[name]] if name in assignment else []), name
    # compact: at most one pattern per (device, layer-set group) — bounded by tensor kinds
    assert len(patterns) <= n_devices * (len(SUFFIXES) + 1)


def test_layer_prefix_is_not_a_prefix_match() -> None:
    patterns = compile_patterns({"blk.1.ffn_up.weight": "CUDA0"})
    assert _matches(patterns, "blk.1.ffn_up.weight") == ["CUDA0"]
    assert _matches(patterns, "blk.10.ffn_up.weight") == []
    assert _matches(patterns, "blk.1.ffn_up.weight_extra") == []
    assert _matches(patterns, "xblk.1.ffn_up.weight") == []


def test_special_characters_are_escaped() -> None:
    name = "odd+name(v2)[0].weight"
    patterns = compile_patterns({name: "CPU"})
    assert _matches(patterns, name) == ["CPU"]
    assert _matches(patterns, "oddname(v2)[0].weight") == []
    assert _matches(patterns, "odd+name(v2)[0]Xweight") == []


def test_whole_model_on_one_device_is_one_pattern_per_kind_group() -> None:
    patterns = compile_patterns({n: "CUDA0" for n in NAMES})
    assert len(patterns) == 2  # all layered kinds share layers 0..63; plus the plain names
    assert all(_matches(patterns, n) == ["CUDA0"] for n in NAMES)


def test_override_limit_is_llama_cpps() -> None:
    import llama_cpp  # after oallama (imported above), so that it loads oallama's libllama

    assert llama_cpp.llama_max_tensor_buft_overrides() == MAX_OVERRIDES


def test_32b_sized_random_placement_stays_far_below_the_limit() -> None:
    rng = random.Random(0)
    assignment = {f"blk.{i}.{s}": rng.choice(["CPU", "CUDA0"]) for i in range(64) for s in SUFFIXES}
    assert len(compile_patterns(assignment)) < MAX_OVERRIDES // 100


def test_ot_arguments_use_buffer_type_names() -> None:
    spec = LoadSpec({"output.weight": "RPC[127.0.0.1:5]"}, ["RPC[127.0.0.1:5]"],
                    compile_patterns({"output.weight": "RPC[127.0.0.1:5]"}),
                    {"RPC[127.0.0.1:5]": "RPC0[127.0.0.1:5]"})
    assert spec.ot_arguments() == ["-ot", r"^output\.weight$=RPC0[127.0.0.1:5]"]


@pytest.mark.parametrize("n_layer", [48, 64, 130])
def test_layer_sets_compile_to_digit_ranges(n_layer: int) -> None:
    """A 48-layer MoE plan's per-layer expert sets compile to short patterns that still match
    exactly their layers (digit ranges, not one alternative per layer)."""
    rng = random.Random(n_layer)
    for _ in range(200):
        layers = set(rng.sample(range(n_layer), rng.randint(1, n_layer)))
        assign = {f"blk.{i}.ffn_up_exps.weight": ("CPU" if i in layers else "CPU_X") for i in range(n_layer)}
        pats = compile_patterns(assign)
        for i in range(n_layer + 12):
            name = f"blk.{i}.ffn_up_exps.weight"
            hits = [dev for pat, dev in pats if re.search(pat, name)]
            assert hits == ([assign[name]] if name in assign else []), (name, pats)
    first_half = compile_patterns({f"blk.{i}.ffn_up_exps.weight": "CPU" for i in range(n_layer // 2)})
    assert len(first_half) == 1 and len(first_half[0][0]) < 60
