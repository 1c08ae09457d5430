"""Files hetserve writes on a user's behalf (a tuned config and its backup, reports, FPGA builds,
daemon logs, locks and records), written so that no link in their folder redirects them.

A folder is checked once and then used through its descriptor, so that swapping it afterwards
changes nothing: it must not itself be a symbolic link, and a process running as root refuses a
folder another user owns unless forced (that user could plant a link or a hard link under any name
in it, and would own what root leaves there). A file is written to a fresh temporary name (O_EXCL:
never an existing file or link), synced and renamed over its target, so a link planted under the
target's name is replaced, never followed, and readers see the old file or the new one, never
half. Logs and locks, which are appended to or held rather than replaced, open with O_NOFOLLOW.

It lives in accelerators, the package that imports no other, because its writers sit in every
package: `hetserve fpga build` here, `hetserve tune`, the Spark job's daemon files and the
benchmarks above."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFolderError(PermissionError):
    """A folder files may not be written in; the message names it, its owner and the fix."""


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def open_folder(folder: Path, force: bool = False, flag: str | None = "--force") -> int:
    """A descriptor of `folder` once it is a real folder that this process may write in:
    UnsafeFolderError for a symbolic link, or, running as root, for another user's folder
    unless `force` (`flag` is how the user says so; None where the command has no such flag)."""
    try:
        fd = os.open(folder, os.O_RDONLY | _NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the folder's own name is a symbolic link
            raise UnsafeFolderError(f"{folder} is a symbolic link: name the folder it points "
                                    "to, if that is where files should go") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = f"{folder} is not a folder"
    elif os.geteuid() == 0 and info.st_uid != 0 and not force:
        problem = (f"{folder} belongs to {user_name(info.st_uid)} and this runs as root, which "
                   "would write there on that user's say-so: run it as that user"
                   + (f", or pass {flag} to write there anyway" if flag else ""))
    if problem:
        os.close(fd)
        raise UnsafeFolderError(problem)
    return fd


def make_folder(path: Path, force: bool = False, flag: str | None = "--force") -> Path:
    """`path`, made where it is missing once its nearest existing folder passes open_folder()
    (root makes no folder in another user's either)."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    os.close(open_folder(existing, force, flag))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def folder(path: Path, force: bool = False, flag: str | None = "--force") -> Iterator[int]:
    """open_folder() for the length of a block."""
    fd = open_folder(path, force, flag)
    try:
        yield fd
    finally:
        os.close(fd)


def write_at(folder_fd: int, name: str, data: bytes | str, mode: int = 0o666) -> None:
    """`data` as the file `name` in the folder `folder_fd`, replacing what is there (a link
    included) at once; `mode` less the umask."""
    payload = data.encode() if isinstance(data, str) else data
    temporary = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode,
                 dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.rename(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder_fd)
        raise
    os.fsync(folder_fd)  # the rename itself survives a crash


def write_file(path: Path, data: bytes | str, force: bool = False, flag: str | None = "--force",
               mode: int = 0o666) -> Path:
    """write_at() in `path`'s folder, checked by open_folder()."""
    with folder(path.parent, force, flag) as fd:
        write_at(fd, path.name, data, mode)
    return path


def open_at(folder_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """os.open of `name` in the folder `folder_fd`, not inherited by child processes and never
    through a link: UnsafeFolderError names one found there."""
    try:
        return os.open(name, flags | _NOFOLLOW, mode, dir_fd=folder_fd)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        where = Path(os.readlink(f"/proc/self/fd/{folder_fd}")) / name
        raise UnsafeFolderError(f"{where} is a symbolic link, which hetserve does not follow: "
                                "remove it") from None


def open_log(path: Path, force: bool = False, flag: str | None = "--force") -> int:
    """A descriptor appending to the log `path` (created 0600), for a child's output."""
    with folder(path.parent, force, flag) as fd:
        return open_at(fd, path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def read_at(folder_fd: int, name: str) -> bytes:
    """The file `name` in the folder `folder_fd`, never read through a link."""
    with os.fdopen(open_at(folder_fd, name, os.O_RDONLY), "rb") as handle:
        return handle.read()


def check_trusted(folder: Path, what: str) -> None:
    """Raises UnsafeFolderError unless `folder` and every folder above it belong to this
    process's user or root and no other user may write in them (a sticky folder, as /tmp, lets
    none of them rename another's entries): `what` is loaded from there (kernel binaries), and a
    file planted in it would run as this process."""
    real = Path(os.path.realpath(folder))
    for place in (real, *real.parents):
        try:
            info = os.stat(place)
        except FileNotFoundError:
            continue  # made later by this process
        writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (
            place != real and info.st_mode & stat.S_ISVTX)
        if info.st_uid not in (0, os.geteuid()) or writable_by_others:
            owner = user_name(info.st_uid)
            raise UnsafeFolderError(
                f"{what} {folder}: {place} belongs to {owner} with mode "
                f"{stat.S_IMODE(info.st_mode):04o}; another user could plant what this process "
                f"loads: use a folder of {user_name(os.geteuid())} or root that only they may "
                "write in")


def is_file_at(folder_fd: int, name: str) -> bool:
    """Whether `name` in the folder is a regular file itself (a link is not)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False
