"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import gc
import socket
import sys
from collections.abc import Callable
from typing import Any

import pytest


def raises_cleanly(exc: type[Exception] | tuple[type[Exception], ...], match: str,
                   build: Callable[[], object]) -> str:
    """pytest.raises(exc, match=match) around build(); returns the message.

    A half-built object is collected inside, so that a failing __del__ (a refused model must
    leave nothing behind to free) fails this test and not a later one."""
    seen: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with pytest.raises(exc, match=match) as info:
            build()
        message = str(info.value)
        del info
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert not seen, [f"{u.exc_type.__name__}: {u.exc_value} ({u.object!r})" for u in seen]
    return message


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
