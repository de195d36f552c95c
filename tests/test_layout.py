"""The architecture holds: every module imports on its own, and imports into the root package
name native modules only (the import contracts in pyproject.toml ignore those edges)."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import oallama

PKG = Path(oallama.__file__).parent
# native extension modules: not visible to the import graph, so `from .. import _core` reads as an
# import of the root package (tool.importlinter's ignore_imports)
NATIVE = {"_core", "_weaver", "_collective", "_weaver_cuda", "_collective_cuda"}


def _modules() -> list[str]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def _root_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, name) of every `from <root package> import name` in a file below the root."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if target == "oallama":
                found += [(node.lineno, a.name) for a in node.names]
    return found


def test_every_module_imports_on_its_own() -> None:
    # a fresh interpreter per module: no module may rely on another having been imported first
    # (torch-only and CUDA-only modules import torch or their native module lazily)
    def one(mod: str) -> tuple[str, str]:
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True, timeout=120)
        return mod, r.stderr.strip().splitlines()[-1] if r.returncode else ""

    mods = [m for m in _modules() if m.rsplit(".", 1)[-1] != "__main__"]
    assert len(mods) > 30
    with ThreadPoolExecutor(4) as ex:
        failed = {m: err for m, err in ex.map(one, mods) if err}
    assert not failed, failed


@pytest.mark.parametrize("module", [m for m in _modules() if m != "oallama"])
def test_imports_into_the_root_name_native_modules_only(module: str) -> None:
    path = PKG.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    bad = [(line, name) for line, name in _root_imports(path, module)
           if name not in NATIVE and not (PKG / f"{name}.py").exists() and not (PKG / name).is_dir()]
    assert not bad, f"{module} imports {bad} from the root package: import the defining module instead"


def test_runtime_reads_plans_without_the_planner() -> None:
    # the runtime's plan-file registry knows both schemas on its own; the planner stays unimported
    code = ("import sys, oallama.runtime.llama, oallama.runtime.planfile as pf; "
            "print(sorted(s for s in pf._READERS if s)); "
            "print(sorted(m for m in sys.modules if m.startswith(('oallama.planner', 'oallama.cluster'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "['oallama.distplan/1', 'oallama.plan/1']"
    assert out[1] == "[]"
