"""One daemon per unix socket: a daemon holds an exclusive lock beside its socket for its whole
life. A second daemon then refuses to start instead of taking the socket over, and a socket
file left by a killed daemon is known to be stale without connecting to it (a daemon between
binding and listening refuses connections, so a connect probe would call it stale). A daemon
with several front-end processes (--workers) serves one socket per front-end beside its own."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lock_path(socket: Path) -> Path:
    return socket.with_name(socket.name + ".lock")


def _lock(socket: Path) -> int | None:
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_path(socket), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def hold(socket: Path) -> int | None:
    """The descriptor of the socket's lock, now held by this process until it closes it or
    exits (even by SIGKILL); None when another process holds it."""
    fd = _lock(socket)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it: see holder()
    return fd


def is_held(socket: Path) -> bool:
    """Whether a daemon, serving, starting or draining, holds the socket."""
    fd = _lock(socket)
    if fd is None:
        return True
    os.close(fd)
    return False


def holder(socket: Path) -> str:
    """The PID of the process that holds (or last held) the socket's lock."""
    try:
        return lock_path(socket).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def worker_socket(socket: Path, index: int) -> Path:
    """The socket of front-end `index` of a daemon with several: the first serves the daemon's
    own socket (whose lock the daemon holds), the others serve `<socket>.1`, `<socket>.2`..."""
    return socket if index == 0 else socket.with_name(f"{socket.name}.{index}")


def worker_sockets(socket: Path) -> list[Path]:
    """The sockets a daemon serves now: its own, and those of its other front-ends."""
    found = [socket]
    while (next_one := worker_socket(socket, len(found))).exists():
        found.append(next_one)
    return found
