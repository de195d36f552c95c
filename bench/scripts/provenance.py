"""What a benchmark script records about the tree it ran from (imported by the scripts beside it)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(short: bool = False) -> str:
    """The commit of this checkout ("unknown" outside a git work tree or without git)."""
    args = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        return subprocess.run(args, capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
