"""Reading and writing oallama's JSON documents (plans, profiles, devices files, bench results)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_base() -> Path:
    """oallama's cache directory: $OALLAMA_CACHE, else $XDG_CACHE_HOME/oallama (~/.cache/oallama);
    profiles, confirmations and fetched models live in folders of their own under it."""
    return Path(os.environ.get("OALLAMA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "oallama"))


def read_json(path: str | Path, what: str, error: type[Exception], hint: str = "") -> Any:
    """The JSON in `path`; `error` naming the file and `what` it should be when it is missing or
    not JSON (hint: how to make one)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise error(f"{p}: no such {what}{f' ({hint})' if hint else ''}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{p}: not a JSON {what} ({e})") from None


def write_json(path: str | Path, doc: Any) -> None:
    """Write `doc` to `path` atomically: a killed process never leaves a half-written document
    (the bench's resume logic trusts that a result file present is a finished result)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(p)
