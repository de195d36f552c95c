"""Command-line options from dataclasses: one default per option, the dataclass field's.

A command's options are a dataclass whose fields carry their flag spelling and help text in
``field(metadata=...)`` (written with `option`); `add_arguments` generates the argparse flags from
them and `from_args` builds the dataclass back from the parsed arguments. argparse itself holds no
default (an option not given is absent from the namespace, so the dataclass's default applies), and
the help text shows the field's default. ::

    @dataclass
    class Options:
        models: list[Path] = option(positional=True, metavar="model", help="GGUF model file(s)")
        budgets: list[str] = option(["50%"], flag="--gpu-budget", help="accelerator budgets")
        reps: int = option(5, help="timed repetitions")                 # --reps N
        mmap: bool = option(True, help="load with mmap")                # --mmap / --no-mmap
        progress: bool = option(True, off="--quiet", help="progress")   # --progress / --quiet
        workload: Workload = group(Workload)                            # Workload's flags, flattened

Types come from the annotations: int, float, str and Path flags take one value; ``X | None``
takes an X (None: not given); ``list[X]`` and ``tuple[X, ...]`` (or ``tuple[X, X]``, a fixed
count) take comma-separated values (``--prompt 32,64,128``), a positional list takes several
arguments; bool is a pair of flags, ``--x`` and ``--no-x`` (or `off`'s spelling). A field written
without `option` or `group` is no command-line option. This module is the command-line plumbing of
every ``oallama`` command; it imports nothing from oallama's subpackages.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_KEY = "oallama.option"  # metadata key of an option's spelling and help
_GROUP = "oallama.options.group"  # metadata key of a nested options dataclass


@dataclasses.dataclass(frozen=True)
class _Spec:
    help: str
    flag: str | None  # "--gpu-budget"; None: "--" + the field's name with dashes
    short: str | None  # "-o"
    off: str | None  # a bool's "off" flag; None: "--no-" + the flag's name
    choices: tuple[Any, ...] | Callable[[], Sequence[Any]] | None  # a callable: asked when the flags are made
    metavar: str | None
    positional: bool
    default_help: str | None  # shown instead of the default (a computed or None default)
    exclusive: str | None  # options sharing this key are mutually exclusive
    minimum: int | float | None = None  # a number (or each of a list's numbers) below it is refused


def option(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None, short: str | None = None,
           off: str | None = None, choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None,
           metavar: str | None = None, positional: bool = False, default_help: str | None = None,
           default_factory: Callable[[], Any] | None = None, exclusive: str | None = None,
           minimum: int | float | None = None) -> Any:
    """A dataclass field that is a command-line option. `default`: the option's one default (a
    list is copied for every instance); none: the option is required. `help` is plain text (no
    argparse %-escapes); the default is appended to it. Options with the same `exclusive` key
    cannot be given together. `minimum`: the command line refuses a smaller number."""
    spec = _Spec(help, flag, short, off, tuple(choices) if isinstance(choices, Sequence) else choices, metavar,
                 positional, default_help, exclusive, minimum)
    meta = {_KEY: spec}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type[Any]) -> Any:
    """A dataclass field holding another options dataclass whose flags are flattened into the
    command's (default: that dataclass with its own defaults)."""
    return dataclasses.field(default_factory=cls, metadata={_GROUP: cls})


# --- values ----------------------------------------------------------------------------------


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
        raise TypeError(f"option type {tp}: only X | None unions are supported")
    return tp, False


def _scalar(tp: Any) -> Callable[[str], Any]:
    if tp in (int, float, str, Path):
        return tp  # type: ignore[no-any-return]
    raise TypeError(f"option type {tp}: expected int, float, str, Path, bool, a list or tuple of those")


def _at_least(conv: Callable[[str], Any], minimum: int | float | None, flag: str) -> Callable[[str], Any]:
    """`conv`, refusing a number below `minimum` (None: any) with a message naming the flag."""
    if minimum is None:
        return conv

    def parse(text: str) -> Any:
        value = conv(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"'{text}': {flag} must be at least {format_default(minimum)}")
        return value

    parse.__name__ = getattr(conv, "__name__", f"{flag} value")  # argparse's "invalid <name> value"
    return parse


def _sequence(item_type: Any, kind: str, count: int | None, flag: str,
              minimum: int | float | None = None) -> Callable[[str], Any]:
    """Parser of a comma-separated value: a list or a tuple (kind), of `count` items (None: any)."""
    conv = _at_least(_scalar(item_type), minimum, flag)
    what = {int: "integers", float: "numbers"}.get(item_type, "values")
    example = {int: "32,64,128", float: "0.5,1.5"}.get(item_type, "a,b")

    def parse(text: str) -> Any:
        parts = [x.strip() for x in text.split(",") if x.strip()]
        try:
            vals = [conv(x) for x in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}': expected comma-separated {what}, e.g. {example}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"'{text}': expected comma-separated {what}, e.g. {example}")
        if count is not None and len(vals) != count:
            raise argparse.ArgumentTypeError(f"'{text}': expected {count} comma-separated {what}")
        return tuple(vals) if kind == "tuple" else vals

    parse.__name__ = f"{flag} value"  # what argparse names in "invalid <name>" messages
    return parse


def _shape(tp: Any) -> tuple[str, Any, int | None]:
    """(kind, item type, count): kind is 'bool', 'scalar', 'list' or 'tuple'; count: a fixed
    tuple's length (None: any)."""
    if tp is bool:
        return "bool", bool, None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return "list", args[0], None
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return "tuple", args[0], None
        if len(set(args)) != 1:
            raise TypeError(f"option type {tp}: a tuple's items must share one type")
        return "tuple", args[0], len(args)
    return "scalar", tp, None


def format_default(value: Any) -> str:
    """A default as the command line writes it: lists comma-separated, 10.0 as 10."""
    if isinstance(value, (list, tuple)):
        return ",".join(format_default(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --- argparse ------------------------------------------------------------------------------


class _BoolAction(argparse.Action):
    """A bool option as two flags: the first sets True, the second False."""

    def __init__(self, option_strings: Sequence[str], dest: str, off: str = "", **kw: Any) -> None:
        self.off = off
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string != self.off)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


def _flag_of(f: dataclasses.Field[Any], spec: _Spec) -> str:
    return spec.flag or "--" + f.name.replace("_", "-")


def option_fields(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], _Spec, Any]]:
    """(field, spec, resolved type) of every option of `cls`, nested groups flattened."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[dataclasses.Field[Any], _Spec, Any]] = []
    for f in dataclasses.fields(cls):
        if _GROUP in f.metadata:
            out += option_fields(f.metadata[_GROUP])
        elif _KEY in f.metadata:
            out.append((f, f.metadata[_KEY], hints[f.name]))
    return out


def field_default(f: dataclasses.Field[Any]) -> Any:
    """The field's default value (MISSING for a required one)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def add_arguments(parser: argparse.ArgumentParser | Any, cls: type[Any]) -> None:
    """Add a flag (or positional argument) for every option of the dataclass `cls`."""
    seen: set[str] = set()
    exclusive: dict[str, Any] = {}
    for f, spec, tp in option_fields(cls):
        if f.name in seen:
            raise TypeError(f"{cls.__name__}: option '{f.name}' is declared twice (nested groups)")
        seen.add(f.name)
        base, optional = _unwrap_optional(tp)
        kind, item, count = _shape(base)
        default = field_default(f)
        required = default is dataclasses.MISSING
        shown = spec.default_help if spec.default_help is not None else (
            None if required or default is None else format_default(default))
        flag = _flag_of(f, spec)
        if kind == "bool":
            off = spec.off or "--no-" + flag.removeprefix("--")
            shown = spec.default_help or (None if required else flag if default else off)
        help_text = spec.help + (f" (default: {shown})" if shown else "")
        kw: dict[str, Any] = {"help": help_text.replace("%", "%%"), "default": argparse.SUPPRESS}
        if spec.metavar or (kind != "bool" and not spec.positional and spec.choices is None):
            kw["metavar"] = spec.metavar or flag.lstrip("-").replace("-", "_").upper()
        if spec.choices is not None:
            kw["choices"] = tuple(spec.choices() if callable(spec.choices) else spec.choices)
        if spec.positional:
            if kind == "list":
                kw.update(nargs="+", type=_scalar(item))
            elif kind == "scalar":
                kw["type"] = _scalar(item)
                if optional or not required:
                    kw["nargs"] = "?"
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: a positional option is a value or a list")
            if required:
                del kw["default"]
            parser.add_argument(f.name, **kw)
            continue
        names = [n for n in (spec.short, flag) if n]
        target = parser
        if spec.exclusive:
            if spec.exclusive not in exclusive:
                exclusive[spec.exclusive] = parser.add_mutually_exclusive_group()
            target = exclusive[spec.exclusive]
        if kind == "bool":
            target.add_argument(*names, off, dest=f.name, action=_BoolAction, off=off, required=required, **kw)
            continue
        kw["type"] = (_at_least(_scalar(item), spec.minimum, flag) if kind == "scalar"
                      else _sequence(item, kind, count, flag, spec.minimum))
        target.add_argument(*names, dest=f.name, required=required, **kw)


def from_args(cls: type[T], namespace: argparse.Namespace) -> T:
    """The dataclass `cls` from parsed arguments: the options given, the dataclass's defaults for
    the rest (nested groups built the same way)."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if _GROUP in f.metadata:
            kw[f.name] = from_args(f.metadata[_GROUP], namespace)
        elif _KEY in f.metadata and hasattr(namespace, f.name):
            kw[f.name] = getattr(namespace, f.name)
    return cls(**kw)


__all__ = ["add_arguments", "field_default", "format_default", "from_args", "group", "option", "option_fields"]
