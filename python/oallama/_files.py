"""Reading oallama's JSON documents (plans, profiles, devices files) with errors that name them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
