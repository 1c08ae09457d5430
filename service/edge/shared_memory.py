"""Triton's system shared memory extension: clients on this node register POSIX shared memory
regions (/dev/shm) and pass tensors through them, so that large inputs and outputs do not travel
inside gRPC messages.

Client memory is untrusted: a client may shrink, unlink or rewrite its object at any time. The
daemon never maps it (a shrunk mapping is SIGBUS); it keeps one descriptor per region and copies
in and out with pread/pwrite, so a short object is an INVALID_ARGUMENT naming the region. Regions
belong to the caller that registered them (caller()): another caller's region is "not registered"
to every method. Names and counts are bounded (RegionNames).

A caller may register only an object it could open itself: the kernel names a unix-socket
caller's uid and groups (service/edge/door.py), and the object's owner and mode decide, never the
daemon's own rights (it may be root). Reading needs read permission; an output written there,
write permission."""

from __future__ import annotations

import errno
import math
import os
import pwd
import re
import stat
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.edge.door import Peer
from service.edge.socket_owner import is_loopback
from service.errors import (
    AlreadyExistsError,
    InvalidInputError,
    LimitError,
    PermissionDeniedError,
    shown,
)
from service.settings import Settings

SHM_ROOT = Path("/dev/shm")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")  # region names and keys alike
_MAX_BYTES = 1 << 40  # beyond any object /dev/shm can hold


@dataclass(frozen=True)
class Caller:
    """Whose shared memory a call may use: `name` owns regions, and an object is judged by the
    rights of `uid` and `gids`."""

    name: str
    uid: int
    gids: tuple[int, ...]


def caller(peer: Peer | None, token: bool, token_uid: int) -> Caller:
    """Whom a system shared memory call is attributed to: on the unix socket, the calling
    process's uid; over loopback TCP, the holders of the daemon's token, with the rights of
    --shm-uid-for-token where the operator gives one. Without a token, TCP is open to every
    local user: no shared memory there."""
    if peer is None:  # its connection closed while the call was on its way
        raise PermissionDeniedError("system shared memory: the caller's connection has closed")
    if peer.listener == "unix":
        assert peer.uid is not None
        return Caller(peer.address, peer.uid, peer.gids)
    if not token:
        raise PermissionDeniedError("system shared memory over TCP needs the daemon's token "
                                    "(--token-file); clients on this node use its unix socket")
    if not is_loopback(peer.address):
        raise PermissionDeniedError(f"system shared memory: peer {shown(peer.address)} is not "
                                    "on this node; only clients over the unix socket or "
                                    "loopback may use it")
    if token_uid < 0:
        raise PermissionDeniedError("system shared memory over TCP is off: TCP callers have no "
                                    "uid to judge objects by; use the unix socket, or have the "
                                    "operator give token holders a uid's rights "
                                    "(--shm-uid-for-token)")
    return Caller("token", token_uid, _groups(token_uid))


@dataclass(frozen=True)
class Limits:
    """How many regions the daemon keeps open, in all and per caller."""

    total: int
    per_caller: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.max_shm_regions, settings.max_shm_regions_per_client)


class _Descriptor:
    """An open shared memory object, closed once nothing refers to it: a region unregistered
    while requests that name it still wait keeps its object open until they have been read (a
    number reused by another file meanwhile would read that file)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    caller: Caller
    descriptor: _Descriptor
    writable: bool  # by the caller, as the object's mode says, and by the daemon


@dataclass(frozen=True)
class RegionTensor:
    """An input in a client's region, read only where its batch is assembled, straight into
    the batch buffer (service/core/types.DeferredTensor)."""

    region: Region
    at: int  # in the object
    shape: tuple[int, ...]
    dtype: np.dtype
    field: str  # the request's, for errors

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def read_into(self, out: np.ndarray) -> None:
        nbytes = self.nbytes
        # numpy declares the buffer protocol from Python 3.12 on
        into = memoryview(out).cast("B")  # type: ignore[arg-type]
        if nbytes and os.preadv(self.region.descriptor.fd, [into], self.at) != nbytes:
            raise InvalidInputError(
                f"{self.field}: shared memory region {self.region.name!r} no longer holds "
                f"{nbytes} bytes at offset {self.at - self.region.offset} (its object shrank "
                "after it was registered)")


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

    def __init__(self, limits: Limits) -> None:
        self.names = RegionNames(limits)
        self._regions: dict[str, Region] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> SharedMemoryRegions:
        return cls(Limits.from_settings(settings))

    def open(self, name: str, key: str, offset: int, byte_size: int, caller: Caller,
             checked: bool = True) -> Region:
        """Opens a region for `caller` without recording it (add() does); `checked` false for
        one the device owner reserved already."""
        if checked:
            self.names.check(name, caller.name)
        match = _NAME.fullmatch(key.removeprefix("/"))
        if match is None or key.removeprefix("/") in (".", ".."):
            raise InvalidInputError(f"key: {shown(key)} received, expected a POSIX shared memory "
                                    "name such as '/my_region' (letters, digits, '_', '.', '-')")
        if offset < 0 or byte_size <= 0 or offset + byte_size > _MAX_BYTES:
            raise InvalidInputError(f"offset {offset}, byte_size {byte_size}: expected offset "
                                    f">= 0 and 0 < byte_size, within {_MAX_BYTES} bytes")
        fd, daemon_writes = _open(key, SHM_ROOT / match[0])
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(f"key: {key!r} is not a shared memory object")
            if not _may(fd, info, caller, _READ):
                raise PermissionDeniedError(
                    f"key: shared memory {key!r} (uid {info.st_uid}, gid {info.st_gid}, mode "
                    f"{stat.S_IMODE(info.st_mode):04o}) cannot be read by uid {caller.uid}; the "
                    "daemon opens only objects its caller could open itself")
            if offset + byte_size > info.st_size:
                raise InvalidInputError(f"offset + byte_size: {offset + byte_size} bytes "
                                        f"received, shared memory {key!r} holds {info.st_size}")
        except BaseException:
            os.close(fd)
            raise
        return Region(name, key, offset, byte_size, caller, _Descriptor(fd),
                      daemon_writes and _may(fd, info, caller, _WRITE))

    def add(self, region: Region) -> None:
        if region.name in self._regions:
            raise AlreadyExistsError(f"name: shared memory region {region.name!r} is already "
                                     "registered; unregister it first, or choose another name")
        self.names.add(region.name, region.caller.name)
        self._regions[region.name] = region

    def register(self, name: str, key: str, offset: int, byte_size: int, caller: Caller) -> None:
        self.add(self.open(name, key, offset, byte_size, caller))

    def unregister(self, name: str, caller: Caller) -> list[str]:
        """Releases `caller`'s region `name` (all of them for an empty name); the names."""
        released = self.names.release(name, caller.name)
        for name in released:
            del self._regions[name]
        return released

    def drop(self, names: list[str]) -> None:
        """Closes regions released elsewhere (by the device owner, for another front-end)."""
        for name in names:
            if name in self._regions:
                self.unregister(name, self._regions[name].caller)

    def status(self, name: str, caller: Caller) -> list[Region]:
        if not name:
            return [r for r in self._regions.values() if r.caller.name == caller.name]
        return [self._region(name, caller, "name")]

    def _region(self, name: str, caller: Caller | None, field: str) -> Region:
        region = self._regions.get(name)
        if region is None or caller is None or region.caller.name != caller.name:
            raise InvalidInputError(f"{field}: shared memory region {shown(name)} is not "
                                    "registered by this client")
        return region

    def _place(self, name: str, offset: int, byte_size: int, caller: Caller | None,
               field: str) -> tuple[Region, int]:
        region = self._region(name, caller, field)
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInputError(f"{field}: offset {offset} + byte_size {byte_size} received, "
                                    f"region {name!r} holds {region.byte_size} bytes")
        return region, region.offset + offset

    def tensor(self, name: str, offset: int, byte_size: int, caller: Caller | None, field: str,
               dtype: np.dtype, shape: tuple[int, ...]) -> RegionTensor:
        """The tensor of `byte_size` bytes at `offset` within `caller`'s region, to be read where
        its batch is assembled; `field` names the request field in errors."""
        region, at = self._place(name, offset, byte_size, caller, field)
        if os.fstat(region.descriptor.fd).st_size < at + byte_size:
            raise InvalidInputError(f"{field}: shared memory region {name!r} no longer holds "
                                    f"offset {offset} + byte_size {byte_size} (its object shrank "
                                    "after it was registered)")
        return RegionTensor(region, at, shape, dtype, field)

    def write(self, name: str, offset: int, array: np.ndarray, caller: Caller | None,
              field: str) -> None:
        """Writes `array`'s bytes at `offset` within `caller`'s region."""
        region, at = self._place(name, offset, array.nbytes, caller, field)
        if not region.writable:
            raise PermissionDeniedError(f"{field}: shared memory {region.key!r} cannot be "
                                        f"written by uid {region.caller.uid}; register an "
                                        "object it may write for outputs")
        # pwrite past the end would grow the object, not fail: check its size first.
        if os.fstat(region.descriptor.fd).st_size < at + array.nbytes:
            raise InvalidInputError(f"{field}: shared memory region {name!r} no longer holds "
                                    f"offset {offset} + {array.nbytes} bytes (its object shrank "
                                    "after it was registered)")
        # numpy declares the buffer protocol from Python 3.12 on
        os.pwrite(region.descriptor.fd, np.ascontiguousarray(  # type: ignore[arg-type]
            array).reshape(-1).view(np.uint8), at)

    def close(self) -> None:
        self.drop(list(self._regions))


_READ, _WRITE = 4, 2  # permission bits of the class that applies (owner, group, others)
# POSIX ACL entry tags (linux/posix_acl.h), as the system.posix_acl_access attribute stores them
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_ACL_ENTRY = struct.Struct("<HHI")  # tag, permissions, uid or gid


def _may(fd: int, info: os.stat_result, caller: Caller, access: int) -> bool:
    """Whether `caller` may open the object (`fd`, `info`) for `access`, as the kernel judges
    it: by its access ACL where it has one (a named user's or group's entry, within the
    mask, may deny what the mode bits seem to allow), else by its mode; root may always."""
    if caller.uid == 0:
        return True
    entries = _acl(fd)
    if entries is None:
        shift = 6 if caller.uid == info.st_uid else 3 if info.st_gid in caller.gids else 0
        return (info.st_mode >> shift) & access == access

    def allows(perm: int) -> bool:
        return perm & access == access
    by_tag: dict[int, int] = {tag: perm for tag, perm, _ in entries}
    if caller.uid == info.st_uid:
        return allows(by_tag.get(_USER_OBJ, 0))
    mask = by_tag.get(_MASK, 7)
    for tag, perm, who in entries:
        if tag == _USER and who == caller.uid:
            return allows(perm & mask)
    groups = [perm for tag, perm, who in entries
              if (tag == _GROUP_OBJ and info.st_gid in caller.gids)
              or (tag == _GROUP and who in caller.gids)]
    if groups:  # a group entry matches: the others' entry no longer applies
        return any(allows(perm & mask) for perm in groups)
    return allows(by_tag.get(_OTHER, 0))


def _acl(fd: int) -> list[tuple[int, int, int]] | None:
    """The object's access ACL entries, None where it has none beyond its mode."""
    try:
        raw = os.getxattr(fd, "system.posix_acl_access")
    except OSError:  # ENODATA: none; ENOTSUP: a file system without ACLs
        return None
    return [_ACL_ENTRY.unpack_from(raw, at) for at in range(4, len(raw), _ACL_ENTRY.size)]


def _open(key: str, path: Path) -> tuple[int, bool]:
    """A descriptor of the object, and whether the daemon may write through it."""
    # Not through a symbolic link: another local user could point one at our files.
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, os.O_RDWR | flags), True
        except PermissionError:  # readable only, by a daemon that is not root
            return os.open(path, os.O_RDONLY | flags), False
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise LimitError("key: the daemon has no descriptor left for another region; "
                             "retry later") from None
        raise InvalidInputError(f"key: cannot open shared memory {key!r}: {e.strerror}") from None


def _groups(uid: int) -> tuple[int, ...]:
    try:
        user = pwd.getpwuid(uid)
    except KeyError:  # no such user: no groups
        return ()
    return tuple(os.getgrouplist(user.pw_name, user.pw_gid))
