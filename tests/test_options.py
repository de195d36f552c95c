"""Command-line options generated from dataclasses (oallama.options): every command's flags come
from its options dataclass, an option not given takes the dataclass field's default (argparse
holds none), the help shows that default, and a default changed in the dataclass reaches the
parser and the help of the real `oallama` command."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from oallama import cli, options

# command -> (module, its options dataclass, the arguments the command requires)
COMMANDS: dict[str, tuple[str, str, list[str]]] = {
    "plan": ("oallama.planner.plancmd", "PlanOptions", ["m.gguf"]),
    "bench": ("oallama.bench.harness", "BenchOptions", ["m.gguf"]),
    "distribute": ("oallama.cluster.distribute", "DistributeOptions", ["m.gguf", "--devices", "d.json"]),
    "profile": ("oallama.planner.cost.measure", "ProfileOptions", ["m.gguf"]),
    "inspect": ("oallama.planner.graph", "InspectOptions", ["m.gguf"]),
    "run": ("oallama.runtime.generate", "RunOptions", ["m.gguf"]),
    "synth": ("oallama.model.synthetic", "SynthOptions", ["-o", "m.gguf"]),
    "probe": ("oallama.cluster.probe", "ProbeCommand", ["127.0.0.1:50052"]),
    "tp": ("oallama.collective.tp.decoder", "TpCommand", ["-m", "m.gguf"]),
}

# flags that scripts/, the README and users' command lines pass today: they must keep parsing
KNOWN_FLAGS: dict[str, list[str]] = {
    "plan": ["--gpu-budget", "50%", "--host-budget", "150%", "--device", "RPC[127.0.0.1:1]", "--rpc-local", "--rpc-threads", "2", "--strategy", "affinity",
             "--prompt", "64", "--gen", "8", "--objective", "ttft", "--ubatch", "64", "--threads", "1", "--profile",
             "p.json", "--time-limit", "2", "--emit-ot", "-o", "plan.json", "--quiet"],
    "bench": ["--gpu-budget", "25%,50%", "--strategies", "layers,optimal", "--prompt", "32,64", "--gen", "4",
              "--grid", "sweep", "--anchor", "32,4", "--reps", "1", "--warmup", "0", "--threads", "1", "--ubatch",
              "64", "--flash-attn", "--no-mmap", "--op-offload", "both", "--device", "CUDA0", "--rpc-local",
              "--rpc-threads", "2", "--max-minutes", "5", "--config-timeout", "60", "--no-plots", "--quiet", "-o", "d"],
    "distribute": ["-o", "p.json", "--strategy", "memory", "--beta", "0.8", "--no-contiguous", "--objective",
                   "decode", "--n-prompt", "16", "--n-gen", "4", "--ctx", "256", "--w-c", "2", "--w-q1", "1",
                   "--w-q2", "1", "--w-q3", "1", "--ep", "0.3", "--tcp-iw", "0", "--method", "milp", "--formulation",
                   "assignment", "--time-limit", "5", "--emit", "--emit-binary", "llama-cli", "--run", "-p", "hi",
                   "--threads", "1", "--verbose"],
    "profile": ["--device", "CUDA0", "--rpc-local", "--rpc-threads", "2", "--threads", "1", "--tokens", "1,64",
                "--repeats", "2", "--no-cache", "-o", "prof.json"],
    "inspect": ["--tokens", "1,32", "--ctx", "256", "--json", "ops.json"],
    "run": ["--devices", "CPU,CUDA0", "--placement", "plan.json", "--split", "ffn", "--gpu-budget", "50%",
            "--strategy", "layers", "--plan-prompt", "32", "--ubatch", "64", "--rpc-local", "--rpc-threads", "2",
            "-p", "hi", "-n", "4", "--ctx", "256", "--threads", "1", "--temperature", "0.5", "--seed", "7",
            "--verbose"],
    "synth": ["--preset", "qwq-32b", "--type", "q4_k_m", "--seed", "3", "--layers", "2", "--quiet", "--shape-only"],
    "probe": ["-o", "devices.json", "--payload-mib", "0.5", "--samples", "3", "--rtt-samples", "5", "--matmul-size",
              "256", "--tokens", "1,16", "--client-threads", "1", "--no-client", "--timeout", "5"],
    "tp": ["--tokens", "1,2,3", "-n", "4", "--hosts", "1", "--ranks-per-host", "2", "-a", "ring", "--stream",
           "--norm", "reduce_bcast", "--n-ctx", "256", "--timeout", "60", "--out", "reports"],
}


def _cls(command: str) -> type[Any]:
    module, name, _ = COMMANDS[command]
    return typing.cast(type[Any], getattr(importlib.import_module(module), name))


def _parse(command: str, *extra: str) -> argparse.Namespace:
    return cli.build_parser().parse_args([command, *COMMANDS[command][2], *extra])


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, "--help"])
    return re.sub(r"\s+", " ", out.getvalue())  # argparse wraps lines at the terminal's width


def _spelling(f: dataclasses.Field[Any], spec: Any) -> list[str]:
    if spec.positional:
        return [spec.metavar or f.name]
    flag = spec.flag or "--" + f.name.replace("_", "-")
    return [flag, *([spec.short] if spec.short else [])]


def _shown(f: dataclasses.Field[Any], spec: Any, tp: Any, default: Any) -> str | None:
    """What the help shows as the default of an option (None: nothing)."""
    if spec.default_help is not None:
        return str(spec.default_help)
    if default is None or default is dataclasses.MISSING:
        return None
    if tp is bool:
        flag = _spelling(f, spec)[0]
        return flag if default else spec.off or "--no-" + flag.removeprefix("--")
    return options.format_default(default)


@pytest.mark.parametrize("command", COMMANDS)
def test_options_not_given_take_the_dataclass_defaults(command: str) -> None:
    cls = _cls(command)
    ns = _parse(command)
    built = options.from_args(cls, ns)
    given = set(vars(ns))
    for f, _, _ in options.option_fields(cls):
        default = options.field_default(f)
        if default is dataclasses.MISSING:
            assert f.name in given, f.name  # required: the parser took it
            continue
        assert f.name not in given, f"{f.name}: the parser holds a default of its own"
        assert _values(built)[f.name] == default, f.name


def _values(obj: Any) -> dict[str, Any]:
    """Field name -> value of an options dataclass, nested groups flattened."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out.update(_values(value) if dataclasses.is_dataclass(value) else {f.name: value})
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_flag_with_its_default(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "10000")
    text = _help(command)
    for f, spec, tp in options.option_fields(_cls(command)):
        for name in _spelling(f, spec):
            assert re.search(rf"(^|[\s\[,|]){re.escape(name)}([\s\],|]|$)", text), (name, text)
        base = typing.get_args(tp)[0] if type(None) in typing.get_args(tp) else tp
        shown = _shown(f, spec, base, options.field_default(f))
        if shown is not None:
            assert f"(default: {shown})" in text, (f.name, shown)


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_users_know_still_parse(command: str) -> None:
    built = options.from_args(_cls(command), _parse(command, *KNOWN_FLAGS[command]))
    assert built != options.from_args(_cls(command), _parse(command))  # every one of them took effect


def _changed(value: Any, spec: Any) -> Any:
    """Another valid value for an option (None: leave it)."""
    if value is None or value is dataclasses.MISSING:
        return None
    if spec.choices is not None:
        choices = list(spec.choices() if callable(spec.choices) else spec.choices)
        return choices[(choices.index(value) + 1) % len(choices)]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value / 2 if value else 1.0
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, Path):
        return value / "changed"
    if isinstance(value, list) and value:
        return [*value, value[-1] * 2 if isinstance(value[-1], int) else value[-1] + "-changed"]
    return None


def _with_defaults(cls: type[Any], nested: dict[str, type[Any]] | None = None) -> tuple[type[Any], dict[str, Any]]:
    """A subclass of the options dataclass `cls` whose option defaults all differ (groups named in
    `nested` replaced by the given classes): (subclass, {field: new default})."""
    hints = typing.get_type_hints(cls)
    specs = {id(f): spec for f, spec, _ in options.option_fields(cls)}
    fields: list[tuple[str, Any, Any]] = []
    new: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if nested and f.name in nested:
            fields.append((f.name, nested[f.name], options.group(nested[f.name])))
            continue
        spec = specs.get(id(f))
        if spec is None or spec.positional:
            continue
        value = _changed(options.field_default(f), spec)
        if value is None:
            continue
        new[f.name] = value
        made = dataclasses.field(default_factory=lambda v=value: list(v), metadata=f.metadata) \
            if isinstance(value, list) else dataclasses.field(default=value, metadata=f.metadata)
        fields.append((f.name, hints[f.name], made))
    params = typing.cast(Any, cls).__dataclass_params__
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), frozen=params.frozen), new


@pytest.mark.parametrize("command", COMMANDS)
def test_a_default_changed_in_the_dataclass_reaches_the_command(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, name, _ = COMMANDS[command]
    sub, new = _with_defaults(_cls(command))
    assert new
    monkeypatch.setattr(importlib.import_module(module), name, sub)
    monkeypatch.setenv("COLUMNS", "10000")
    built = options.from_args(sub, _parse(command))
    text = _help(command)
    for field_name, value in new.items():
        assert getattr(built, field_name) == value, field_name
    for f, spec, tp in options.option_fields(sub):
        if f.name in new:
            shown = _shown(f, spec, tp, new[f.name])
            assert shown is None or f"(default: {shown})" in text, (f.name, shown)


@pytest.mark.parametrize(("command", "group"), [("plan", "workload"), ("distribute", "options"), ("tp", "options")])
def test_a_default_changed_in_a_nested_group_reaches_the_command(command: str, group: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module, name, _ = COMMANDS[command]
    outer = _cls(command)
    inner_sub, new = _with_defaults(typing.get_type_hints(outer)[group])
    sub, _ = _with_defaults(outer, {group: inner_sub})
    monkeypatch.setattr(importlib.import_module(module), name, sub)
    built = getattr(options.from_args(sub, _parse(command)), group)
    assert isinstance(built, inner_sub) and new
    for field_name, value in new.items():
        assert getattr(built, field_name) == value, field_name


@pytest.mark.parametrize(("command", "flag", "value", "message"), [
    ("bench", "--prompt", "32,lots", "expected comma-separated integers"),
    ("bench", "--anchor", "1,2,3", "expected 2 comma-separated integers"),
    ("inspect", "--tokens", "", "expected comma-separated integers"),
    ("probe", "--timeout", "soon", "invalid"),
])
def test_a_bad_value_is_refused_naming_its_flag(command: str, flag: str, value: str, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(command, flag, value)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"oallama {command}: error: argument {flag}" in err and message in err
