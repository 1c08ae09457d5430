"""A front-end's shared-memory arena: where a front-end process puts the input tensors of the
requests it hands to the device owner, so that they cross between the processes without a copy
through the channel (service/workers/owner_channel.py carries only their places).

The owner creates each arena as a POSIX shared memory object, maps it as a region of its own
(service/edge/shared_memory.py) and passes the descriptor to the front-end it starts; the name is
unlinked once both hold it, so that no process death leaves it behind. The front-end allocates
first fit; a block is freed only when the owner has answered the request that used it."""

from __future__ import annotations

import bisect
import mmap
import os
import secrets

from service.edge.shared_memory import SHM_ROOT

_ALIGN = 64  # cache-line aligned blocks: engines read them as arrays


def create(size: int) -> tuple[str, int]:
    """A new private shared memory object of `size` bytes: its key and a descriptor."""
    key = f"hetserve-arena-{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(SHM_ROOT / key, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.ftruncate(fd, size)
    return key, fd


def size_for(max_message_bytes: int, workers: int) -> int:
    """Twice the largest message, within half of what /dev/shm can hold split between the
    front-ends: a small /dev/shm (a container's 64 MiB) must not SIGBUS a front-end."""
    info = os.statvfs(SHM_ROOT)
    room = info.f_bavail * info.f_frsize // (2 * workers)
    return max(_ALIGN, min(2 * max_message_bytes, room) // _ALIGN * _ALIGN)


class Arena:
    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.memory = mmap.mmap(fd, size)
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, bytes), by offset

    def alloc(self, nbytes: int) -> tuple[int, int] | None:
        """A block (offset, bytes) of at least `nbytes`; None while the arena is too full."""
        want = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        for i, (offset, free) in enumerate(self._free):
            if free >= want:
                if free == want:
                    del self._free[i]
                else:
                    self._free[i] = (offset + want, free - want)
                return offset, want
        return None

    def free(self, block: tuple[int, int]) -> None:
        """Returns a block, merged with free neighbours."""
        offset, nbytes = block
        i = bisect.bisect(self._free, block)
        if i < len(self._free) and self._free[i][0] == offset + nbytes:
            nbytes += self._free.pop(i)[1]
        if i and sum(self._free[i - 1]) == offset:
            offset, before = self._free.pop(i - 1)
            nbytes += before
            i -= 1
        self._free.insert(i, (offset, nbytes))

    def view(self, block: tuple[int, int]) -> memoryview:
        return memoryview(self.memory)[block[0]:block[0] + block[1]]
