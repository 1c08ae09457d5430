"""Triton's system shared memory extension: clients on this node register POSIX shared memory
regions (/dev/shm) and pass tensors through them, so that large inputs and outputs do not travel
inside gRPC messages. Only clients on this node may register (a unix socket or loopback peer),
and a key names an object directly under /dev/shm, nothing elsewhere."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from service.errors import AlreadyExistsError, InvalidInputError, PermissionDeniedError

SHM_ROOT = Path("/dev/shm")
_KEY = re.compile(r"/?([A-Za-z0-9_.-]{1,255})")
# gRPC peer strings of clients on this node.
_LOCAL_PEERS = ("unix:", "ipv4:127.", "ipv6:[::1]", "ipv6:%5B::1%5D")


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap


def check_local(peer: str) -> None:
    if not peer.startswith(_LOCAL_PEERS):
        raise PermissionDeniedError(f"system shared memory: peer {peer!r} is not on this node; "
                                    "only clients over the unix socket or loopback may use it")


class SharedMemoryRegions:
    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInputError("name: an empty region name received, a name expected")
        if name in self._regions:
            raise AlreadyExistsError(f"name: shared memory region {name!r} is already "
                                     "registered; unregister it first")
        match = _KEY.fullmatch(key)
        if match is None or match[1] in (".", ".."):
            raise InvalidInputError(f"key: {key!r} received, expected a POSIX shared memory "
                                    "name such as '/my_region' (letters, digits, '_', '.', '-')")
        if offset < 0 or byte_size <= 0:
            raise InvalidInputError(f"offset {offset}, byte_size {byte_size}: expected offset "
                                    ">= 0 and byte_size > 0")
        try:
            # Not through a symbolic link: another local user could point one at our files.
            fd = os.open(SHM_ROOT / match[1], os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise InvalidInputError(f"key: cannot open shared memory {key!r}: "
                                    f"{e.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(f"key: {key!r} is not a shared memory object")
            size = info.st_size
            if offset + byte_size > size:
                raise InvalidInputError(f"offset + byte_size: {offset + byte_size} bytes "
                                        f"received, shared memory {key!r} holds {size}")
            memory = mmap.mmap(fd, offset + byte_size)  # mapped from 0: offsets need no paging
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, memory)

    def unregister(self, name: str) -> None:
        """One region, or every region for an empty name; unknown names are no error."""
        for region in [self._regions.pop(n) for n in ([name] if name else list(self._regions))
                       if n in self._regions]:
            # Arrays of requests still in flight may hold the mapping: it closes with them.
            with contextlib.suppress(BufferError):
                region.memory.close()

    def status(self, name: str) -> list[Region]:
        if not name:
            return list(self._regions.values())
        if name not in self._regions:
            raise InvalidInputError(f"name: shared memory region {name!r} is not registered")
        return [self._regions[name]]

    def view(self, name: str, offset: int, byte_size: int, field: str) -> memoryview:
        """`byte_size` bytes at `offset` within the region; `field` names the request field in
        errors."""
        region = self._regions.get(name)
        if region is None:
            raise InvalidInputError(f"{field}: shared memory region {name!r} is not registered; "
                                    f"registered are {sorted(self._regions)}")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInputError(f"{field}: offset {offset} + byte_size {byte_size} received, "
                                    f"region {name!r} holds {region.byte_size} bytes")
        start = region.offset + offset
        return memoryview(region.memory)[start:start + byte_size]

    def close(self) -> None:
        self.unregister("")
