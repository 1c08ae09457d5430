"""Finding the node-local daemon, and starting one where none answers (the embedded default)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import tritonclient.grpc as grpcclient

from service.settings import default_socket

log = logging.getLogger(__name__)
ADDRESS_CONF = "spark.hetserve.daemon"
ADDRESS_ENV = "HETSERVE_DAEMON"


def resolve_address(explicit: str | None = None, conf: str | None = None) -> str:
    """An explicit address, else the Spark conf, else the environment, else the unix socket."""
    return explicit or conf or os.environ.get(ADDRESS_ENV) or f"unix:{default_socket()}"


def is_ready(address: str, timeout_s: float = 2.0) -> bool:
    client = grpcclient.InferenceServerClient(address)
    try:
        return client.is_server_ready(client_timeout=timeout_s)
    except Exception:  # any transport failure means "not serving here"
        return False
    finally:
        client.close()


class DaemonProcess:
    """A `hetserve serve` child process; `stop()` ends it with SIGTERM and waits."""

    def __init__(self, args: list[str], address: str, log_path: Path) -> None:
        self.address = address
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self._process = subprocess.Popen([sys.executable, "-m", "service", "serve", *args],
                                             stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not is_ready(self.address, timeout_s=1.0):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"hetserve daemon did not become ready on {self.address}; "
                                   f"its log:\n{self.log_path.read_text()[-4000:]}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
        return self._process.wait()


@contextlib.contextmanager
def ensure_daemon(address: str, model_repository: Path) -> Iterator[str]:
    """Uses the daemon at `address` if it answers; otherwise starts one on a private socket
    for the duration of the block and stops it afterwards."""
    if is_ready(address):
        yield address
        return
    folder = Path(tempfile.mkdtemp(prefix="hetserve-job-"))
    socket = folder / "grpc.sock"
    daemon = DaemonProcess(["--models", str(model_repository), "--socket", str(socket),
                            "--port", "0", "--metrics-port", "0"],
                           f"unix:{socket}", folder / "daemon.log")
    try:
        daemon.wait_ready()
        log.info("no daemon answers at %s; started one at %s", address, daemon.address)
        yield daemon.address
    finally:
        daemon.stop()
