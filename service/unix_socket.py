"""The daemon's unix socket: a folder that is the daemon's alone, and one daemon per socket.

The folder decides who can swap the socket or its lock, so the daemon refuses one that is not its
own (a symbolic link, another user's, writable by group or others: another local user could have
made it first in a shared place such as /tmp). The socket's mode decides who may connect: the
daemon's user, or also --socket-group's members.

A daemon holds an exclusive lock beside its socket for its whole life. A second daemon then
refuses to start instead of taking the socket over, and a socket file left by a killed daemon is
known to be stale without connecting to it (a daemon between binding and listening refuses
connections, so a connect probe would call it stale). A daemon with several front-end processes
(--workers) serves one socket per front-end beside its own."""

from __future__ import annotations

import fcntl
import grp
import os
import stat
from pathlib import Path


class FolderError(Exception):
    """The socket's folder is not the daemon's alone."""


def group_id(group: str) -> int | None:
    """--socket-group as a group id (a name or a number); None when unset."""
    if not group:
        return None
    try:
        return int(group) if group.isdecimal() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"--socket-group: no group {group!r} on this node") from None


def prepare_folder(socket: Path, gid: int | None) -> None:
    """Creates the socket's folder (private, or group-readable for `gid`) where it is missing,
    and refuses one that is not the daemon's alone."""
    folder = socket.parent
    try:
        folder.mkdir(mode=0o700, parents=True)
        if gid is not None:
            os.chown(folder, -1, gid)
            os.chmod(folder, 0o750)
    except FileExistsError:
        pass
    fix = (f"remove it, or create it owned by uid {os.geteuid()} with mode 0700 (0750 with "
           "--socket-group)")
    problem = folder_problem(folder, folder.lstat(), os.geteuid())
    if problem:
        raise FolderError(f"{problem}: {fix}")


def folder_problem(folder: Path, info: os.stat_result, uid: int) -> str | None:
    """Why the socket folder `folder` (its lstat or fstat `info`) is not `uid`'s alone, or None:
    the rule the daemon applies to its own folder and clients to their daemon's."""
    if not stat.S_ISDIR(info.st_mode):
        return f"socket folder {str(folder)!r} is not a directory (a symbolic link?)"
    if info.st_uid != uid:
        return f"socket folder {str(folder)!r} belongs to uid {info.st_uid}, not to uid {uid}"
    if info.st_mode & 0o022:
        return (f"socket folder {str(folder)!r} has mode {stat.S_IMODE(info.st_mode):04o}: "
                "group or others may write there")
    return None


def restrict(socket: Path, gid: int | None) -> None:
    """Who may connect: the daemon's user only, or also the members of group `gid`."""
    if gid is None:
        os.chmod(socket, 0o600)
    else:
        os.chown(socket, -1, gid)
        os.chmod(socket, 0o660)


def lock_path(socket: Path) -> Path:
    return socket.with_name(socket.name + ".lock")


def _lock(socket: Path) -> int | None:
    socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_path(socket), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
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
        fd = os.open(lock_path(socket), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return "unknown"
    try:
        text = os.read(fd, 32).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return text if text.isdecimal() else "unknown"
