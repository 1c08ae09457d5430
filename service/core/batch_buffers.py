"""Preallocated batch inputs: requests are copied once, straight into a buffer that is reused,
instead of a new array per batch. One buffer set per batch that may be in flight."""

from __future__ import annotations

import numpy as np

from service.core.types import Tensors


class BatchBuffers:
    def __init__(self, inputs: dict[str, tuple[tuple[int, ...], np.dtype]], max_batch_size: int,
                 sets: int) -> None:
        # Free dimensions (-1) have no size to allocate ahead: such models concatenate instead.
        fixed = max_batch_size > 0 and all(d >= 0 for dims, _ in inputs.values() for d in dims)
        self._free: list[Tensors] = [
            {name: np.empty((max_batch_size, *dims), dtype) for name, (dims, dtype)
             in inputs.items()} for _ in range(sets)] if fixed else []

    def assemble(self, parts: list[Tensors], total: int) -> tuple[Tensors, Tensors | None]:
        """The batch's inputs, and the buffer set to give back once the batch has run."""
        if len(parts) == 1:
            return parts[0], None
        if not self._free:
            return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}, None
        buffers = self._free.pop()
        for name, buffer in buffers.items():
            offset = 0
            for part in parts:
                rows = part[name]
                buffer[offset:offset + len(rows)] = rows
                offset += len(rows)
        return {name: buffer[:total] for name, buffer in buffers.items()}, buffers

    def release(self, buffers: Tensors | None) -> None:
        if buffers is not None:
            self._free.append(buffers)
