"""The client's side of a node's daemon: the one way to start `hetserve serve` (DaemonProcess,
and local_daemon on free ports for `hetserve tune` and the benchmarks), to tell whether one
serves (is_ready, wait_ready), to stop one (SIGTERM, then SIGKILL), and the checks a client
makes before it trusts a unix socket (service.client_socket) or a socket's lock
(service.unix_socket). spark_jobs imports from service only this module, contract and errors.

A local_daemon is stopped when its block ends, also on errors and Ctrl-C, and sent SIGTERM by the
kernel if its parent dies without stopping it."""

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
from service import client_socket
from service.client_socket import UntrustedDaemonError, check, open_folder
from service.parent_death import end_with
from service.unix_socket import holder, is_held

__all__ = ["DaemonProcess", "DaemonStartError", "LocalDaemon", "UntrustedDaemonError", "check",
           "free_port", "holder", "is_held", "is_ready", "local_daemon", "log_tail", "open_folder",
           "serve_command", "stop", "wait_ready"]

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
    process = DaemonProcess(["--models", str(models), "--port", str(port), "--socket",
                             str(folder / "grpc.sock"), "--metrics-port", str(metrics_port),
                             *extra], address, log_path, end_with_parent=True)
    try:
        process.wait_ready(timeout_s)
        yield LocalDaemon(f"unix:{folder / 'grpc.sock'}", address,
                          f"http://127.0.0.1:{metrics_port}/metrics", log_path, process.pid)
    finally:
        process.stop()


def serve_command(*args: str) -> list[str]:
    """The command line of a `hetserve serve` child of this Python, with `args` as its flags."""
    return [sys.executable, "-m", "service", "serve", *args]


class DaemonProcess:
    """A `hetserve serve` child process with `args` as its flags, answering at `address`; its
    output goes to `log_path` (None: this process's own). With `end_with_parent` the kernel sends
    it SIGTERM when this process dies. `stop()` ends it with SIGTERM and waits."""

    def __init__(self, args: list[str], address: str, log_path: Path | None,
                 end_with_parent: bool = False) -> None:
        self.address = address
        self.log_path = log_path
        preexec = functools.partial(end_with, os.getpid()) if end_with_parent else None
        if log_path is None:
            self._process = subprocess.Popen(serve_command(*args), preexec_fn=preexec)
            return
        log_fd = safe_files.open_log(log_path, flag=None)
        try:
            self._process = subprocess.Popen(serve_command(*args), stdout=log_fd,
                                             stderr=subprocess.STDOUT, preexec_fn=preexec)
        finally:
            os.close(log_fd)

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until it serves; the process must have been given a log (DaemonStartError ends with
        it)."""
        assert self.log_path is not None
        wait_ready(self.address, self._process, self.log_path, timeout_s)

    def poll(self) -> int | None:
        return self._process.poll()

    def stop(self, timeout_s: float = 30.0) -> int:
        return stop(self._process, timeout_s)


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
                                   f"{log_tail(log_path)}")
        time.sleep(0.1)


def log_tail(log_path: Path) -> str:
    """The end of a daemon's log, for a message that says why it failed."""
    if not log_path.exists():
        return f"(no log at {log_path})"
    return log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]


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
