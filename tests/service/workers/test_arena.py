"""A front-end's shared-memory arena: first-fit blocks that are reused once freed and merge with
their free neighbours, so that a full arena refuses and an emptied one holds its whole size."""

from __future__ import annotations

import os

from service.edge.shared_memory import SHM_ROOT
from service.workers import arena


def _arena(size: int) -> arena.Arena:
    key, fd = arena.create(size)
    try:
        return arena.Arena(fd, size)
    finally:
        os.close(fd)
        (SHM_ROOT / key).unlink()


def test_blocks_are_aligned_reused_and_merged() -> None:
    a = _arena(1024)
    first, second, third = a.alloc(1), a.alloc(100), a.alloc(64)
    assert first == (0, 64) and second == (64, 128) and third == (192, 64)
    a.view(second)[:3] = b"abc"
    assert bytes(a.view(second)[:3]) == b"abc"
    assert a.alloc(1024) is None  # more than is free
    a.free(first)
    a.free(third)
    a.free(second)  # between two free blocks: all three merge with the rest
    assert a.alloc(1024) == (0, 1024)


def test_a_full_arena_refuses_until_a_block_is_freed() -> None:
    a = _arena(256)
    blocks = [a.alloc(64) for _ in range(4)]
    assert a.alloc(1) is None
    a.free(blocks[2])
    assert a.alloc(64) == blocks[2]


def test_the_size_is_bounded_by_shared_memory_and_aligned() -> None:
    info = os.statvfs(SHM_ROOT)
    room = info.f_bavail * info.f_frsize
    size = arena.size_for(64 << 20, 4)
    assert size % 64 == 0 and size <= min(128 << 20, room // 8)
