"""Waiting for a condition a daemon reaches in its own time, instead of sleeping for a guess."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], timeout_s: float = 20.0, what: str = "") -> None:
    """Returns once `condition()` holds; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout_s:g} s: {what}"
        time.sleep(0.1)
