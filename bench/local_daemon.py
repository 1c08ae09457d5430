"""A `hetserve serve` started for a benchmark on free loopback ports, stopped at the end."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.daemon import DaemonProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LocalDaemon:
    address: str  # the unix socket: how node-local clients reach a daemon
    tcp_address: str
    metrics_url: str
    log_path: Path


@contextlib.contextmanager
def local_daemon(models: Path, folder: Path, *extra: str) -> Iterator[LocalDaemon]:
    """A daemon serving the repository `models`; its log and socket go to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    process = DaemonProcess(["--models", str(models), "--port", str(port), "--socket",
                             str(folder / "grpc.sock"), "--metrics-port", str(metrics_port),
                             *extra], address, folder / "daemon.log")
    try:
        process.wait_ready(timeout_s=600)  # big models on slow OpenCL devices load slowly
        yield LocalDaemon(f"unix:{folder / 'grpc.sock'}", address,
                          f"http://127.0.0.1:{metrics_port}/metrics", folder / "daemon.log")
    finally:
        process.stop()
