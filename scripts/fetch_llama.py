#!/usr/bin/env python3
"""Fetch oallama's pinned upstream llama.cpp and apply our patches.

The upstream is the llama.cpp tree vendored in the llama-cpp-python sdist named in
third_party/llama.cpp/PIN. This script

  1. downloads that sdist into third_party/llama.cpp/.cache/ (pip download, no deps; where pip is
     not importable, as in `pip install .`'s isolated build environment, from PyPI's address
     for it, or OALLAMA_SDIST_URL),
  2. checks its sha256 against the PIN (a mismatch is an error, nothing is extracted),
  3. extracts vendor/llama.cpp into third_party/llama.cpp/src/,
  4. applies third_party/llama.cpp/patches/*.patch in name order,
  5. writes a stamp so that running it again is a no-op until the PIN or a patch changes.

Usage: python scripts/fetch_llama.py [--force] [--print-sdist]
Only the standard library is used; pip (with scikit-build-core installed, for the sdist's
metadata step) does the download.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "third_party" / "llama.cpp"
PIN_FILE = UPSTREAM / "PIN"
PATCH_DIR = UPSTREAM / "patches"
SRC_DIR = UPSTREAM / "src"
CACHE_DIR = Path(os.environ.get("OALLAMA_FETCH_CACHE", UPSTREAM / ".cache"))
STAMP = SRC_DIR / ".oallama-stamp"


class FetchError(RuntimeError):
    pass


def read_pin(path: Path = PIN_FILE) -> dict[str, str]:
    pin: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise FetchError(f"{path}:{n}: expected key=value, got {line!r}")
        key, value = line.split("=", 1)
        pin[key.strip()] = value.strip()
    for key in ("package", "version", "sdist", "sha256", "llama_cpp_commit"):
        if key not in pin:
            raise FetchError(f"{path}: missing '{key}='")
    return pin


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def patches() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch"))


def wanted_stamp(pin: dict[str, str]) -> dict[str, object]:
    return {
        "sdist_sha256": pin["sha256"],
        "llama_cpp_commit": pin["llama_cpp_commit"],
        "patches": [[p.name, sha256_of(p)] for p in patches()],
    }


def download_sdist(pin: dict[str, str]) -> Path:
    """Return the verified sdist, downloading it when the cache lacks a good copy."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    sdist = CACHE_DIR / pin["sdist"]
    if sdist.exists() and sha256_of(sdist) == pin["sha256"]:
        return sdist
    if sdist.exists():
        sdist.unlink()  # a partial or foreign file: fetch again
    spec = f"{pin['package']}=={pin['version']}"
    print(f"fetch_llama: downloading {spec} sdist into {CACHE_DIR}", flush=True)
    why = ""
    if importlib.util.find_spec("pip") is not None:
        # through pip, so that its index settings (mirrors, proxies) apply; --no-build-isolation:
        # pip prepares the sdist's metadata with the scikit-build-core already installed instead
        # of building build-deps (cmake!) from source
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               "--no-build-isolation", "--disable-pip-version-check", "-d", str(CACHE_DIR), spec]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0 or not sdist.exists():
            why = f"{' '.join(cmd)}\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
    else:
        why = "pip is not importable here (pip's isolated build environment)"
    if not sdist.exists():
        # the package index's simple page (PEP 503; PIP_INDEX_URL or PyPI) names the sdist's
        # address: what `pip install .` in a clean clone reaches (its isolated build
        # environment has no pip)
        print(f"fetch_llama: {why.splitlines()[0] if why else 'pip failed'}; asking the package index", flush=True)
        part = sdist.with_suffix(".part")
        url = os.environ.get("OALLAMA_SDIST_URL", "")
        try:
            if not url:
                index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
                page = f"{index}/{re.sub(r'[-_.]+', '-', pin['package']).lower()}/"
                with urllib.request.urlopen(page, timeout=60) as r:
                    html = r.read().decode("utf-8", "replace")
                m = re.search(r'href="([^"#]*' + re.escape(pin["sdist"]) + r')(?:#[^"]*)?"', html)
                if m is None:
                    raise FetchError(f"could not download {spec}: {page} lists no {pin['sdist']}\n{why}")
                url = urllib.parse.urljoin(page, m[1])
            print(f"fetch_llama: fetching {url}", flush=True)
            with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as f:
                shutil.copyfileobj(r, f)
            part.replace(sdist)
        except OSError as e:
            part.unlink(missing_ok=True)
            raise FetchError(f"could not download {spec}: {why}\n{url or 'the package index'}: {e}") from None
    got = sha256_of(sdist)
    if got != pin["sha256"]:
        bad = sdist.with_suffix(".sha256-mismatch")
        sdist.replace(bad)
        raise FetchError(f"{sdist.name}: sha256 {got} does not match PIN {pin['sha256']} (kept as {bad})")
    return sdist


def extract_vendor(sdist: Path, pin: dict[str, str], dest: Path) -> None:
    top = sdist.name.removesuffix(".tar.gz")
    prefix = f"{top}/vendor/llama.cpp/"
    head_member = f"{top}/.git/modules/vendor/llama.cpp/HEAD"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        commit = None
        for m in tar.getmembers():
            if m.name == head_member:
                f = tar.extractfile(m)
                commit = f.read().decode().strip() if f else None
            if not m.name.startswith(prefix) or m.name == prefix + ".git":
                continue  # the submodule's .git pointer would dangle outside the sdist
            m.name = m.name[len(prefix):]
            if m.name:
                members.append(m)
        if commit and commit != pin["llama_cpp_commit"]:
            raise FetchError(f"{sdist.name} vendors llama.cpp {commit}, PIN says {pin['llama_cpp_commit']}")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kwargs)


def apply_patches(tree: Path) -> None:
    # The tree sits inside oallama's own git work tree; inside a repository `git apply` silently
    # skips paths outside the current subdirectory. Stop git's repository discovery at the tree.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    for p in patches():
        for args, what in ((["--check"], "does not apply"), ([], "failed to apply"),
                           (["--reverse", "--check"], "is not in the tree after applying")):
            res = subprocess.run(["git", "apply", "--whitespace=nowarn", *args, str(p)], cwd=tree,
                                 capture_output=True, text=True, env=env)
            if res.returncode != 0:
                raise FetchError(f"patch {p.name} {what} to the pinned tree:\n{res.stderr}")
        print(f"fetch_llama: applied {p.name}", flush=True)


def sync_tree(src: Path, dst: Path) -> None:
    """Make dst a copy of src, rewriting only the files whose bytes differ."""
    dst.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        target = dst / rel
        target.mkdir(exist_ok=True)
        for name in files:
            a, b = Path(root) / name, target / name
            if b.is_symlink() or not b.is_file() or b.stat().st_size != a.stat().st_size or b.read_bytes() != a.read_bytes():
                if b.is_symlink() or b.exists():
                    b.unlink()
                shutil.copy2(a, b)
        for name in set(os.listdir(target)) - set(files) - set(dirs):
            stale = target / name
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            elif rel != Path(".") or name != STAMP.name:
                stale.unlink()


def fetch(force: bool = False) -> Path:
    pin = read_pin()
    want = wanted_stamp(pin)
    if not force and STAMP.exists():
        try:
            if json.loads(STAMP.read_text()) == want:
                print(f"fetch_llama: {SRC_DIR.relative_to(ROOT)} is up to date", flush=True)
                return SRC_DIR
        except json.JSONDecodeError:
            pass
    sdist = download_sdist(pin)
    # Build the patched tree beside the target, then sync it in: unchanged files keep their
    # timestamps (so the build directory stays valid), and an interrupted run never leaves a
    # half-patched src/ that a later build would trust (the stamp is written last).
    tmp = Path(tempfile.mkdtemp(prefix=".src-", dir=UPSTREAM))
    try:
        extract_vendor(sdist, pin, tmp)
        apply_patches(tmp)
        if STAMP.exists():
            STAMP.unlink()
        sync_tree(tmp, SRC_DIR)
        STAMP.write_text(json.dumps(want, indent=1) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"fetch_llama: llama.cpp {pin['llama_cpp_commit'][:9]} + {len(want['patches'])} patch(es) "
          f"in {SRC_DIR.relative_to(ROOT)}", flush=True)
    return SRC_DIR


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="re-extract and re-patch even if up to date")
    ap.add_argument("--print-sdist", action="store_true",
                    help="only print the path of the verified sdist (downloading it if needed)")
    args = ap.parse_args()
    try:
        if args.print_sdist:
            print(download_sdist(read_pin()))
        else:
            fetch(force=args.force)
    except FetchError as e:
        print(f"fetch_llama: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
