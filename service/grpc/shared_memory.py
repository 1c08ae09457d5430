"""Triton's system shared memory extension: clients on this node register POSIX shared memory
regions (/dev/shm) and pass tensors through them, so that large inputs and outputs do not travel
inside gRPC messages.

Client memory is untrusted: a client may shrink, unlink or rewrite its object at any time. The
daemon never maps it (a shrunk mapping is SIGBUS); it keeps one descriptor per region and copies
in and out with pread/pwrite, so a short object is an INVALID_ARGUMENT naming the region. Regions
belong to the caller that registered them (caller()): another caller's region is "not registered"
to every method. Names and counts are bounded (RegionNames)."""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.errors import (
    AlreadyExistsError,
    InvalidInputError,
    LimitError,
    PermissionDeniedError,
    shown,
)
from service.grpc.unix_socket import group_id
from service.settings import Settings

SHM_ROOT = Path("/dev/shm")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")  # region names and keys alike
_MAX_BYTES = 1 << 40  # beyond any object /dev/shm can hold
_LOOPBACK = ("ipv4:127.", "ipv6:[::1]", "ipv6:%5B::1%5D")  # gRPC's peer strings


def caller(peer: str, token: bool) -> str:
    """Whom a system shared memory call is attributed to: the unix socket's users (its folder's
    mode and --socket-group decide who they are), or over loopback TCP the holders of the
    daemon's token. Without a token, TCP is open to every local user: no shared memory there."""
    if peer.startswith("unix:"):
        return "unix"
    if not token:
        raise PermissionDeniedError("system shared memory over TCP needs the daemon's token "
                                    "(--token-file); clients on this node use its unix socket")
    if not peer.startswith(_LOOPBACK):
        raise PermissionDeniedError(f"system shared memory: peer {shown(peer)} is not on this "
                                    "node; only clients over the unix socket or loopback may "
                                    "use it")
    return "token"


@dataclass(frozen=True)
class Limits:
    """How many regions the daemon keeps open, in all and per caller."""

    total: int
    per_caller: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.max_shm_regions, settings.max_shm_regions_per_client)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    caller: str
    fd: int

    def close(self) -> None:
        os.close(self.fd)


class RegionNames:
    """Who owns each region name, within the limits: the one bookkeeping of a daemon's region
    names, kept by the single process, by each front-end, and by the device owner, which reserves
    names for every front-end (service/workers/frontends.py)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._owners: dict[str, str] = {}
        self._counts: Counter[str] = Counter()

    def check(self, name: str, caller: str) -> None:
        """Raises what refuses `caller` registering `name` now."""
        if not _NAME.fullmatch(name):
            raise InvalidInputError(f"name: {shown(name)} received, expected 1 to 255 letters, "
                                    "digits, '_', '.' or '-'")
        if name in self._owners:
            # Also another caller's: names are the daemon's, but whose it is stays unsaid.
            raise AlreadyExistsError(f"name: shared memory region {name!r} is already "
                                     "registered; unregister it first, or choose another name")
        if self._counts[caller] >= self._limits.per_caller:
            raise LimitError(f"name: {self._counts[caller]} regions are registered by this "
                             "client, its limit (--max-shm-regions-per-client); unregister "
                             "some first")
        if len(self._owners) >= self._limits.total:
            raise LimitError(f"name: {len(self._owners)} regions are registered, the "
                             "daemon's limit (--max-shm-regions); retry later")

    def reserve(self, name: str, caller: str) -> None:
        self.check(name, caller)
        self.add(name, caller)

    def add(self, name: str, caller: str) -> None:
        """Records a name reserved already (by the device owner, for a front-end)."""
        self._owners[name] = caller
        self._counts[caller] += 1

    def release(self, name: str, caller: str) -> list[str]:
        """`caller`'s region `name`, or all of its regions for an empty name: the names let go.
        Unknown names, and other callers' names, are no error (as in Triton)."""
        names = [name] if name else [n for n, c in self._owners.items() if c == caller]
        released = [n for n in names if self._owners.get(n) == caller]
        for n in released:
            del self._owners[n]
            self._counts[caller] -= 1
        return released


class SharedMemoryRegions:
    """The regions this process reads and writes, each with its open descriptor."""

    def __init__(self, limits: Limits, admitted_gid: int | None = None) -> None:
        self.names = RegionNames(limits)
        self._regions: dict[str, Region] = {}
        self._admitted_gid = admitted_gid  # --socket-group: its members' objects may be opened

    @classmethod
    def from_settings(cls, settings: Settings) -> SharedMemoryRegions:
        return cls(Limits.from_settings(settings), group_id(settings.socket_group))

    def open(self, name: str, key: str, offset: int, byte_size: int, caller: str,
             checked: bool = True) -> Region:
        """Opens a region for `caller` without recording it (add() does); `checked` false for
        one the device owner reserved already."""
        if checked:
            self.names.check(name, caller)
        match = _NAME.fullmatch(key.removeprefix("/"))
        if match is None or key.removeprefix("/") in (".", ".."):
            raise InvalidInputError(f"key: {shown(key)} received, expected a POSIX shared memory "
                                    "name such as '/my_region' (letters, digits, '_', '.', '-')")
        if offset < 0 or byte_size <= 0 or offset + byte_size > _MAX_BYTES:
            raise InvalidInputError(f"offset {offset}, byte_size {byte_size}: expected offset "
                                    f">= 0 and 0 < byte_size, within {_MAX_BYTES} bytes")
        try:
            # Not through a symbolic link: another local user could point one at our files.
            fd = os.open(SHM_ROOT / match[0], os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise LimitError("key: the daemon has no descriptor left for another "
                                 "region; retry later") from None
            raise InvalidInputError(f"key: cannot open shared memory {key!r}: "
                                    f"{e.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(f"key: {key!r} is not a shared memory object")
            self._check_owner(key, info.st_uid)
            if offset + byte_size > info.st_size:
                raise InvalidInputError(f"offset + byte_size: {offset + byte_size} bytes "
                                        f"received, shared memory {key!r} holds {info.st_size}")
        except BaseException:
            os.close(fd)
            raise
        return Region(name, key, offset, byte_size, caller, fd)

    def _check_owner(self, key: str, uid: int) -> None:
        """Only objects of the daemon's user (or of --socket-group's members): a daemon with more
        rights than its callers opens nothing on their say-so that they could not."""
        if uid == os.geteuid() or (self._admitted_gid is not None and _member(
                uid, self._admitted_gid)):
            return
        raise PermissionDeniedError(f"key: shared memory {key!r} belongs to uid {uid}; the "
                                    "daemon opens only objects of its own user or, with "
                                    "--socket-group, of that group's members")

    def add(self, region: Region) -> None:
        if region.name in self._regions:
            region.close()
            raise AlreadyExistsError(f"name: shared memory region {region.name!r} is already "
                                     "registered; unregister it first, or choose another name")
        self.names.add(region.name, region.caller)
        self._regions[region.name] = region

    def register(self, name: str, key: str, offset: int, byte_size: int, caller: str) -> None:
        self.add(self.open(name, key, offset, byte_size, caller))

    def unregister(self, name: str, caller: str) -> list[str]:
        """Releases `caller`'s region `name` (all of them for an empty name); the names."""
        released = self.names.release(name, caller)
        for name in released:
            self._regions.pop(name).close()
        return released

    def drop(self, names: list[str]) -> None:
        """Closes regions released elsewhere (by the device owner, for another front-end)."""
        for name in names:
            if name in self._regions:
                self.unregister(name, self._regions[name].caller)

    def status(self, name: str, caller: str) -> list[Region]:
        if not name:
            return [r for r in self._regions.values() if r.caller == caller]
        return [self._region(name, caller, "name")]

    def _region(self, name: str, caller: str | None, field: str) -> Region:
        region = self._regions.get(name)
        if region is None or region.caller != caller:
            raise InvalidInputError(f"{field}: shared memory region {shown(name)} is not "
                                    "registered by this client")
        return region

    def _place(self, name: str, offset: int, byte_size: int, caller: str | None,
               field: str) -> tuple[Region, int]:
        region = self._region(name, caller, field)
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInputError(f"{field}: offset {offset} + byte_size {byte_size} received, "
                                    f"region {name!r} holds {region.byte_size} bytes")
        return region, region.offset + offset

    def read(self, name: str, offset: int, byte_size: int, caller: str | None,
             field: str) -> bytearray:
        """A copy of `byte_size` bytes at `offset` within `caller`'s region; `field` names the
        request field in errors."""
        region, at = self._place(name, offset, byte_size, caller, field)
        data = bytearray(byte_size)
        if byte_size and os.preadv(region.fd, [data], at) != byte_size:
            raise InvalidInputError(f"{field}: shared memory region {name!r} no longer holds "
                                    f"offset {offset} + byte_size {byte_size} (its object shrank "
                                    "after it was registered)")
        return data

    def write(self, name: str, offset: int, array: np.ndarray, caller: str | None,
              field: str) -> None:
        """Writes `array`'s bytes at `offset` within `caller`'s region."""
        region, at = self._place(name, offset, array.nbytes, caller, field)
        # pwrite past the end would grow the object, not fail: check its size first.
        if os.fstat(region.fd).st_size < at + array.nbytes:
            raise InvalidInputError(f"{field}: shared memory region {name!r} no longer holds "
                                    f"offset {offset} + {array.nbytes} bytes (its object shrank "
                                    "after it was registered)")
        os.pwrite(region.fd, np.ascontiguousarray(array).reshape(-1).view(np.uint8), at)

    def close(self) -> None:
        self.drop(list(self._regions))


def _member(uid: int, gid: int) -> bool:
    try:
        user = pwd.getpwuid(uid)
    except KeyError:  # no such user: no member of anything
        return False
    return gid in os.getgrouplist(user.pw_name, user.pw_gid)
