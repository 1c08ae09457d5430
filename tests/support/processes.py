"""Looking at the processes a test started: which daemons and supervisors serve a socket."""

from __future__ import annotations

import subprocess
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

