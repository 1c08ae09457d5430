"""A child that ends with its parent: the kernel sends it SIGTERM (a graceful drain) when the
parent dies, even by SIGKILL, which leaves the parent no chance to stop it."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # prctl option, from <linux/prctl.h>


def end_with(parent: int) -> None:
    """Called in the child (before exec, or first thing after): `parent` is the PID the child
    was started by; the child exits at once if that parent has already gone."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
