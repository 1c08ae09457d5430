"""A `hetserve serve` child process on free loopback ports and a socket in a given folder, for
`hetserve tune` and the benchmarks; stopped (SIGTERM, then SIGKILL) when its block ends, also on
errors and Ctrl-C, and sent SIGTERM by the kernel if its parent dies without stopping it. Its
readiness check, wait and stop serve every daemon a process starts (spark_jobs/daemon.py)."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient

from accelerators import safe_files
from service.grpc import client_socket
from service.workers.parent_death import end_with

_LOG_TAIL_CHARS = 4000


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
    pid: int


class DaemonStartError(RuntimeError):
    """The daemon exited or did not become ready in time; the message ends with its log."""


@contextlib.contextmanager
def local_daemon(models: Path, folder: Path, *extra: str,
                 timeout_s: float = 600.0) -> Iterator[LocalDaemon]:
    """A daemon serving the repository `models`; its log and socket go to `folder`. The default
    timeout allows for big models on slow OpenCL devices."""
    folder.mkdir(parents=True, exist_ok=True)
    port, metrics_port = free_port(), free_port()
    address, log_path = f"127.0.0.1:{port}", folder / "daemon.log"
    log_fd = safe_files.open_log(log_path, flag=None)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--models", str(models),
             "--port", str(port), "--socket", str(folder / "grpc.sock"),
             "--metrics-port", str(metrics_port), *extra],
            stdout=log_fd, stderr=subprocess.STDOUT,
            preexec_fn=functools.partial(end_with, os.getpid()))
    finally:
        os.close(log_fd)
    try:
        wait_ready(address, process, log_path, timeout_s)
        yield LocalDaemon(f"unix:{folder / 'grpc.sock'}", address,
                          f"http://127.0.0.1:{metrics_port}/metrics", log_path, process.pid)
    finally:
        stop(process)


def is_ready(address: str, timeout_s: float = 2.0, live: bool = False) -> bool:
    """Whether a daemon answers at `address` and serves (or, with `live`, merely runs);
    UntrustedDaemonError, before anything is sent, for a unix socket that is not the expected
    user's daemon's (client_socket.check)."""
    client_socket.check(address)
    client = grpcclient.InferenceServerClient(address)
    try:
        return (client.is_server_live if live else client.is_server_ready)(
            client_timeout=timeout_s)
    except Exception:  # any transport failure means "not serving here"
        return False
    finally:
        client.close()


def wait_ready(address: str, process: subprocess.Popen, log_path: Path,
               timeout_s: float) -> None:
    """Until the daemon `process` started serves at `address`; DaemonStartError (the process
    stopped) if it exits or is not ready within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not is_ready(address, timeout_s=1.0):
        if process.poll() is not None or time.monotonic() > deadline:
            state = (f"exited with status {process.returncode}" if process.poll() is not None
                     else f"was not ready after {timeout_s:g} s")
            stop(process)
            raise DaemonStartError(f"hetserve daemon on {address} {state}; its log:\n"
                                   f"{log_path.read_text(errors='replace')[-_LOG_TAIL_CHARS:]}")
        time.sleep(0.1)


def stop(process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after `timeout_s`; the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    # A second Ctrl-C while it drains must not leave it running.
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:
            process.kill()
