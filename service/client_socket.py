"""A client's side of the unix socket: it talks only to the daemon of the user it expects.

Under /tmp any local user can create a client's default socket folder first and serve a fake
daemon there, which would receive every tensor and forge every answer. So before a client sends a
byte to a unix socket it checks the socket's folder by the daemon's own rule (unix_socket.
folder_problem: a real folder, owned by the expected user, writable by no one else), then the
listener's uid (SO_PEERCRED). The expected user is the client's own, or the one that
HETSERVE_DAEMON_USER names (a name or a uid) where a service account runs the node's daemon.

gRPC connects by path, later and again after each reconnect, so the peer check alone could be
raced: a socket swapped in after it would be reached unchecked. The folder check closes that: only
the expected user can create, rename or remove entries in that folder. TCP says nothing of its
listener's user: over loopback use the socket, or TLS and a token."""

from __future__ import annotations

import os
import pwd
import socket
import struct
from pathlib import Path

from accelerators import safe_files
from service.unix_socket import folder_problem

DAEMON_USER_ENV = "HETSERVE_DAEMON_USER"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CONNECT_TIMEOUT_S = 5.0


class UntrustedDaemonError(RuntimeError):
    """The socket or its folder is not the expected user's: nothing was sent."""


def expected_uid() -> int:
    """HETSERVE_DAEMON_USER (a user name or a uid), else this process's own user."""
    user = os.environ.get(DAEMON_USER_ENV, "").strip()
    if not user:
        return os.geteuid()
    if user.isdecimal():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise UntrustedDaemonError(f"{DAEMON_USER_ENV}={user!r}: no such user on this node") \
            from None


def socket_path(address: str) -> Path | None:
    """The socket of a `unix:` address; None for TCP."""
    if not address.startswith("unix:"):
        return None
    return Path(address.removeprefix("unix:").removeprefix("//"))


def _fix(folder: Path, uid: int) -> str:
    return (f"remove {folder} if another user made it, and start the daemon as "
            f"{safe_files.user_name(uid)}; or, where a service account runs this node's daemon, "
            f"set {DAEMON_USER_ENV} to that account")


def open_folder(folder: Path, create: bool = False) -> int:
    """A descriptor of the socket folder `folder` once it is the expected user's alone; with
    `create`, made private first where it is missing (a job about to start the daemon)."""
    uid = expected_uid()
    if create and uid == os.geteuid():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            raise UntrustedDaemonError(f"socket folder {str(folder)!r}: {e.strerror} (a "
                                       f"symbolic link?): {_fix(folder, uid)}") from None
        raise
    problem = folder_problem(folder, os.fstat(fd), uid)
    if problem:
        os.close(fd)
        raise UntrustedDaemonError(f"{problem}: {_fix(folder, uid)}")
    return fd


def listener_uid(path: Path) -> int | None:
    """The uid of the process listening on the socket `path` (SO_PEERCRED, read on a connection
    that sends nothing), or None where nothing listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        probe.settimeout(_CONNECT_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # gRPC's own connect fails the same way: nothing to trust yet
        credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(credentials)[1]


def check(address: str) -> None:
    """Before a client connects to `address`: UntrustedDaemonError, naming the folder or socket
    and the fix, where a unix socket or its folder is not the expected user's. TCP passes."""
    path = socket_path(address)
    if path is None:
        return
    try:
        os.close(open_folder(path.parent))
    except FileNotFoundError:
        return  # no folder, no daemon: gRPC's connect fails as UNAVAILABLE
    uid = listener_uid(path)
    if uid is not None and uid != expected_uid():
        raise UntrustedDaemonError(
            f"the daemon on {path} runs as {safe_files.user_name(uid)}, not as "
            f"{safe_files.user_name(expected_uid())}: nothing was sent to it; "
            + _fix(path.parent, expected_uid()))
