"""Finding the node-local daemon, and starting one per host where none answers.

A job uses the daemon its address names (systemd unit, Kubernetes DaemonSet). Where none
answers and the job was given a model repository, executors on a host elect one of them to
start it: under a lock file, the first to notice starts one daemon under a small supervisor
only if no daemon holds the socket (a daemon holds its socket's lock for its whole life, from
start-up to the end of its drain: see service/unix_socket.py), waits until it is ready and
records the job as its starter; every other executor waits on the lock and then finds it ready.
A daemon that runs but does not answer in time is waited for, never replaced. At the end the job
stops the daemons it owns and no other; a supervisor also stops its daemon when the Spark
process that started it (the executor's JVM) has gone.

    python -m spark_jobs.daemon supervise WATCH_PID -- SERVE_ARGS...
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from accelerators import safe_files
from service import local_daemon
from service.contract import default_socket
from service.local_daemon import DaemonProcess, is_ready, wait_ready
from spark_jobs.credentials import NO_CREDENTIALS, Credentials

log = logging.getLogger(__name__)
ADDRESS_CONF = "spark.hetserve.daemon"
ADDRESS_ENV = "HETSERVE_DAEMON"
# The job's files in the daemon's socket folder, beside daemon.lock (the election's lock).
_LOG, _STARTER = "daemon.log", "daemon.starter"


def resolve_address(explicit: str | None = None) -> str:
    """An explicit address (a flag, or the Spark conf read on the driver), else this node's
    environment, else the unix socket."""
    return explicit or os.environ.get(ADDRESS_ENV) or f"unix:{default_socket()}"


def _node_socket(address: str) -> Path:
    """The unix socket of the daemon a job starts for `address`: the address's own, or for a
    loopback port one beside it, whose lock tells whether that daemon runs."""
    if address.startswith("unix:"):
        return Path(address.removeprefix("unix:").removeprefix("//"))
    host, _, port = address.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise ValueError(f"daemon address {address!r}: a job starts daemons only on a unix "
                         "socket or a loopback port (127.0.0.1:PORT)")
    return default_socket().parent / f"tcp-{port}" / "grpc.sock"


def _serve_args(address: str) -> list[str]:
    """`hetserve serve` flags for a daemon answering at `address`."""
    port = "0" if address.startswith("unix:") else address.rpartition(":")[2]
    return ["--socket", str(_node_socket(address)), "--port", port]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[int]:
    """The socket folder `folder`, checked as the daemon's (local_daemon.open_folder) and made
    where it is missing, with this host's election lock held in it; its descriptor, through
    which the job's files there are opened, never through a link."""
    folder_fd = local_daemon.open_folder(folder, create=True)
    try:
        lock = safe_files.open_at(folder_fd, "daemon.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on a crash
            yield folder_fd
        finally:
            os.close(lock)
    finally:
        os.close(folder_fd)


def _spark_jvm_pid() -> int:
    """The nearest ancestor that is a JVM (the executor, or the driver under spark-submit);
    this process where there is none (a driver that started its own JVM)."""
    pid = os.getppid()
    while pid > 1:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return os.getpid()


class NoDaemonError(RuntimeError):
    """No daemon answers on this node, and the job may not or could not start one."""


@dataclass(frozen=True)
class NodeDaemon:
    """Which daemon a job uses on each node; shipped to the executors.

    `address` None means each node's own setting ($HETSERVE_DAEMON, else the user's socket);
    `model_repository` None means the job never starts a daemon; `starter` names the job (its
    Spark application id) in the daemons it starts."""

    address: str | None
    model_repository: str | None
    starter: str

    def resolve(self) -> str:
        return resolve_address(self.address)

    def locate(self, credentials: Credentials = NO_CREDENTIALS) -> str:
        """This node's daemon. One reached with TLS is used as it is: the job starts daemons
        only on a unix socket or a loopback port of its own, which need no credentials."""
        address = self.resolve()
        return address if credentials.applies_to(address) else self.ensure()

    def ensure(self, timeout_s: float = 120.0) -> str:
        """The address of a ready daemon on this node, starting one if the job may."""
        address = self.resolve()
        if is_ready(address):
            return address
        if self.model_repository is None:
            raise NoDaemonError(f"no hetserve daemon answers at {address}, and this job starts "
                                "none: it has no model repository to start one with "
                                "(score.py and stream.py: --no-start-daemon, or a daemon "
                                "reached over TLS)")
        socket = _node_socket(address)
        deadline = time.monotonic() + timeout_s
        with _locked(socket.parent) as folder_fd:
            while not is_ready(address):  # a peer may have started one meanwhile
                # One that holds the socket is starting, loading, busy or draining: wait.
                if not local_daemon.is_held(socket):
                    self._start(address, socket, folder_fd, timeout_s)
                    break
                if time.monotonic() > deadline:
                    raise NoDaemonError(f"the hetserve daemon at {address} (pid "
                                       f"{local_daemon.holder(socket)}) runs but has not been "
                                       f"ready for {timeout_s:.0f} s")
                time.sleep(0.2)
        return address

    def _start(self, address: str, socket: Path, folder_fd: int, timeout_s: float) -> None:
        """Starts this node's daemon; the caller holds the election lock in its folder."""
        assert self.model_repository is not None  # ensure() starts none without one
        serve = ["--models", self.model_repository, "--metrics-port", "0", *_serve_args(address)]
        log_fd = safe_files.open_at(folder_fd, _LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "spark_jobs.daemon", "supervise", str(_spark_jvm_pid()),
                 "--", *serve],
                stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.close(log_fd)
        wait_ready(address, supervisor, socket.parent / _LOG, timeout_s)
        # Readers see the old record or the new one, never half.
        safe_files.write_at(folder_fd, _STARTER, json.dumps(
            {"starter": self.starter, "supervisor": supervisor.pid,
             "daemon": int(local_daemon.holder(socket))}), 0o600)
        log.info("no daemon answered at %s; started one there for %s (supervisor pid %d)",
                 address, self.starter, supervisor.pid)

    def stop_started(self, timeout_s: float = 30.0) -> bool:
        """Stops this node's daemon if this job started it; True if it did."""
        address = self.resolve()
        try:
            socket = _node_socket(address)
        except ValueError:
            return False
        with _locked(socket.parent) as folder_fd:
            record = _read_starter(folder_fd)
            if record is None or record["starter"] != self.starter:
                return False
            os.kill(record["supervisor"], signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            # The lock frees as the daemon's serving ends; the job ends once the process has.
            while ((local_daemon.is_held(socket) or _running(record["daemon"]))
                   and time.monotonic() < deadline):
                time.sleep(0.1)
            os.unlink(_STARTER, dir_fd=folder_fd)
        log.info("stopped the daemon %s started at %s", self.starter, address)
        return True


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def read_starter(starter_file: Path) -> dict | None:
    """{"starter", "supervisor", "daemon"} of a daemon a job started, while its supervisor
    runs (a record whose supervisor has gone is stale); `starter_file` is daemon.starter in the
    daemon's socket folder."""
    try:
        folder_fd = local_daemon.open_folder(starter_file.parent)
    except FileNotFoundError:
        return None
    try:
        return _read_starter(folder_fd)
    finally:
        os.close(folder_fd)


def _read_starter(folder_fd: int) -> dict | None:
    try:
        record = json.loads(safe_files.read_at(folder_fd, _STARTER))
        os.kill(record["supervisor"], 0)
        return record
    except (OSError, ValueError, KeyError):
        return None


def supervise(watch_pid: int, serve_args: list[str]) -> int:
    """Runs one daemon until it exits, SIGTERM arrives, or `watch_pid` has gone."""
    daemon = DaemonProcess(serve_args, "", None, end_with_parent=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    while daemon.poll() is None and not stopping:
        try:
            os.kill(watch_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    return daemon.stop(30)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "supervise" or sys.argv[3] != "--":
        sys.exit(__doc__)
    sys.exit(supervise(int(sys.argv[2]), sys.argv[4:]))
