"""A second local user (nobody, via setpriv) and what the daemon refuses it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from tritonclient.utils import InferenceServerException

from tests.support.daemon import Daemon

NOBODY = 65534


def needs_nobody() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a second local user (nobody) with setpriv")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")


def nobody_command(code: str) -> list[str]:
    """The command that runs `code` with this Python as another local user (nobody)."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            sys.executable, "-c", code]


def _skip_if_private(run: subprocess.CompletedProcess) -> None:
    if "Permission denied" in run.stderr and "python" in run.stderr.lower():
        pytest.skip("nobody cannot run this checkout's Python (its folder is private)")


def as_nobody(code: str) -> subprocess.CompletedProcess:
    """`code` run with this Python by another local user (nobody), via setpriv; skipped where
    this is not root, setpriv is missing or nobody cannot run this checkout's Python."""
    needs_nobody()
    run = subprocess.run(nobody_command(code), cwd="/", capture_output=True, text=True,
                         timeout=60)
    _skip_if_private(run)
    return run


def calls_as_nobody(daemon: Daemon, calls: str) -> list[str]:
    """What each call (one per line, using client `c`) gives as nobody over the unix socket:
    OK or its status."""
    code = f"""
import numpy as np
import tritonclient.grpc as g
from tritonclient.utils import InferenceServerException
c = g.InferenceServerClient({daemon.socket_url!r})
def image(region, nbytes):
    t = g.InferInput("image", [1, 1, 28, 28], "FP32")
    t.set_shared_memory(region, nbytes)
    return t
def logits(region):
    o = g.InferRequestedOutput("logits")
    o.set_shared_memory(region, 40)
    return o
pixels = g.InferInput("image", [1, 1, 28, 28], "FP32")
pixels.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
for call in [{", ".join(f"lambda: {line.strip()}" for line in calls.strip().splitlines())}]:
    try:
        call()
        print("OK")
    except InferenceServerException as e:
        print(e.status(), e.message())
"""
    run = subprocess.run(nobody_command(code), cwd="/", capture_output=True, text=True,
                         timeout=60)
    _skip_if_private(run)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


IMAGE_BYTES = 28 * 28 * 4


def refused(call, status: str, *fragments: str) -> str:
    with pytest.raises(InferenceServerException) as refused:
        call()
    assert refused.value.status() == f"StatusCode.{status}", refused.value
    message = refused.value.message()
    for fragment in fragments:
        assert fragment in message
    return message
