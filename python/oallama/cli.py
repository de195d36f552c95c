"""The `oallama` command. Each pipeline module registers its own subcommand through a
``register(subparsers)`` function; this file only collects them and maps errors to exit codes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .errors import OallamaError

# pipeline order: fetch / synth -> devices -> inspect -> profile -> plan -> run -> bench
_COMMAND_MODULES = [
    "oallama.model.registry",
    "oallama.model.synthetic",
    "oallama.runtime.devices",
    "oallama.planner.graph",
    "oallama.planner.cost.measure",
    "oallama.planner.plancmd",
    "oallama.runtime.generate",
    "oallama.bench.harness",
    "oallama.runtime.rpc",
    "oallama.cluster.probe",
    "oallama.cluster.distribute",
    "oallama.collective.tp.decoder",
    "oallama.serve.cli",
]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="oallama", description="llama.cpp made operator-aware")
    ap.add_argument("--version", action=_VersionAction, nargs=0,
                    help="show oallama's version, the llama.cpp it was built from and its backends")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written yet
                continue
            raise
        mod.register(sub)
    return ap


def _version() -> str:
    """oallama's version, the llama.cpp commit and patches its libraries were built from, and the
    backends built in (one per line)."""
    from ._version import __version__

    lines = [f"oallama {__version__}"]
    try:
        from . import _libs

        lines += _libs.describe_build()
    except (ImportError, OSError, KeyError, ValueError) as e:  # a source tree without its build
        lines.append(f"native build: not available ({e})")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """--version: several lines (argparse's own version action would re-wrap them)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(_version())
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OallamaError as e:
        print(f"oallama {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"oallama {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
