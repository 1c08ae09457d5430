"""Batches assembled once, where they run: each request's inputs are copied straight into a
reused buffer (a client's shared memory read into it, with no copy in between) on the thread
that runs the batch, so that the event loop goes on reading requests meanwhile. The rows a
device's buckets pad the batch with are zeros of the same buffer, so padding costs no second
copy. One buffer set per batch that may be in flight."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from service.core.types import DeferredTensor, Inputs, Tensors
from service.errors import HetserveError


class BatchBuffers:
    def __init__(self, inputs: dict[str, tuple[tuple[int, ...], np.dtype]], max_batch_size: int,
                 sets: int) -> None:
        self._specs = inputs
        self._rows = max_batch_size
        self.batched = max_batch_size > 0  # else a batch is one request, taken whole
        # Free dimensions (-1) have no size to allocate ahead: such models concatenate instead.
        self._fixed = max_batch_size > 0 and all(d >= 0 for dims, _ in inputs.values()
                                                 for d in dims)
        self._free = [self._allocate(max_batch_size) for _ in range(sets)] if self._fixed else []

    def _allocate(self, rows: int) -> Tensors:
        return {name: np.empty((rows, *dims), dtype) for name, (dims, dtype)
                in self._specs.items()}

    def batch(self, parts: list[Inputs], total: int,
              failed: Callable[[int, HetserveError], None]) -> Batch:
        """A batch of the requests' `parts` (`total` rows); `failed(i, error)` answers part i,
        whose inputs could not be read (its rows are zeros then, and the others run)."""
        return Batch(self, parts, total, failed)

    def take(self, rows: int) -> Tensors | None:
        """A buffer set of at least `rows` rows (a one-off beyond max_batch_size's: padding of
        preferred sizes); None for a model with free dimensions."""
        if not self._fixed:
            return None
        return self._free.pop() if self._free and rows <= self._rows else self._allocate(rows)

    def give_back(self, buffers: Tensors) -> None:
        if len(next(iter(buffers.values()))) == self._rows:
            self._free.append(buffers)


class Batch:
    """A batch's inputs, assembled on first use at the rows its device asks for."""

    def __init__(self, pool: BatchBuffers | None, parts: list[Inputs], total: int,
                 failed: Callable[[int, HetserveError], None]) -> None:
        self.size = total
        self._pool = pool
        self._parts = parts
        self._failed = failed
        self._buffers: Tensors | None = None
        self._inputs: Tensors | None = None
        self.assembly_s = 0.0  # the time its inputs took to assemble (copies, reads)

    @classmethod
    def of(cls, inputs: Tensors, size: int) -> Batch:
        """A batch of arrays at hand (a probe's sample), assembled without a buffer pool."""
        def unreadable(i: int, error: HetserveError) -> None:
            raise error
        return cls(None, [dict(inputs)], size, unreadable)

    def inputs(self, rows: int = 0) -> Tensors:
        """The batch's `size` rows, followed by zero rows up to `rows` where a buffer holds
        them; assembled once, and again only for a device that wants more rows."""
        rows = max(rows, self.size)
        if self._inputs is None or _rows(self._inputs) < rows:
            start = time.perf_counter()
            self._inputs = self._assemble(rows)
            self.assembly_s += time.perf_counter() - start
        return self._inputs

    def _assemble(self, rows: int) -> Tensors:
        arrays = [{n: a for n, a in part.items() if isinstance(a, np.ndarray)}
                  for part in self._parts]
        if len(self._parts) == 1 and rows == self.size and len(arrays[0]) == len(self._parts[0]):
            return arrays[0]  # one request's arrays: nothing to copy
        self.release()
        self._buffers = buffers = self._pool.take(rows) if self._pool else None
        if buffers is None:  # free dimensions: concatenated, unpadded
            return {name: np.concatenate([self._read(i, part[name]) for i, part
                                          in enumerate(self._parts)])
                    for name in self._parts[0]}
        for name, buffer in buffers.items():
            offset = 0
            for i, part in enumerate(self._parts):
                tensor = part[name]
                self._fill(i, tensor, buffer[offset:offset + tensor.shape[0]])
                offset += tensor.shape[0]
            buffer[offset:rows] = 0
        return {name: buffer[:rows] for name, buffer in buffers.items()}

    def sample(self) -> Tensors:
        """A copy of the first sample: what a failed device is probed with."""
        whole = self._pool is not None and not self._pool.batched
        return {name: (array if whole else array[:1]).copy()
                for name, array in self.inputs().items()}

    def release(self) -> None:
        """Gives the buffer back (once the batch has run)."""
        if self._buffers is not None and self._pool is not None:
            self._pool.give_back(self._buffers)
            self._buffers = None

    def _read(self, i: int, tensor: np.ndarray | DeferredTensor) -> np.ndarray:
        if isinstance(tensor, np.ndarray):
            return tensor
        out = np.empty(tensor.shape, tensor.dtype)
        self._fill(i, tensor, out)
        return out

    def _fill(self, i: int, tensor: np.ndarray | DeferredTensor, out: np.ndarray) -> None:
        if isinstance(tensor, np.ndarray):
            out[...] = tensor
            return
        try:
            tensor.read_into(out)
        except HetserveError as e:  # that request fails; the others run
            out[...] = 0
            self._failed(i, e)


def _rows(tensors: Tensors) -> int:
    return len(next(iter(tensors.values())))
