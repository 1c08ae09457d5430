"""Looking at the processes a test started: which daemons serve a socket, waiting for a state."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def serving(socket: Path) -> list[str]:
    """PIDs of the `hetserve serve` processes started for `socket`."""
    found = subprocess.run(["pgrep", "-f", f"service serve .*{socket}"], capture_output=True,
                           text=True)
    return found.stdout.split()


def supervising(socket: Path) -> list[str]:
    """PIDs of the supervisors that jobs started for `socket`."""
    found = subprocess.run(["pgrep", "-f", f"spark_jobs.daemon supervise .*{socket}"],
                           capture_output=True, text=True)
    return found.stdout.split()


def wait(condition: Callable[[], object], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
