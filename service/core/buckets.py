"""Batch buckets: the few fixed batch sizes a model's engines see.

Accelerator runtimes re-plan when an input's shape changes (ONNX Runtime's CUDA provider by
60-120x per run), so a device that batches by buckets gets each batch padded up to the next
bucket, or split into runs of the largest bucket and a padded rest. Padding rows are cut off the
outputs before anyone sees them. The sizes are the contract's (service.contract.batch_buckets):
config.pbtxt's `dynamic_batching.preferred_batch_size`, else the powers of two below
`max_batch_size` and `max_batch_size` itself (service/core/model_settings.py reads them).

Whether a device batches by buckets is the model's `batch_buckets` parameter: `auto` (the
default: on for GPUs and FPGAs, off for CPUs, where padding only costs compute; see
docs/BENCHMARKS.md), `on` or `off` (ModelSettings.buckets_for).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.core.types import Tensors

AUTO_KINDS = ("gpu", "fpga")  # kinds that batch by buckets under `auto`

EngineRun = Callable[[Tensors, list[str]], Tensors]


@dataclass(frozen=True)
class Buckets:
    sizes: tuple[int, ...]  # ascending, at least one

    def plan(self, size: int) -> list[tuple[int, int]]:
        """(rows, bucket) per engine run for a batch of `size` rows."""
        largest = self.sizes[-1]
        runs = [(largest, largest)] * (size // largest)
        rest = size % largest
        if rest:
            runs.append((rest, next(b for b in self.sizes if b >= rest)))
        return runs

    def rows(self, size: int) -> int:
        """The rows the engine runs for a batch of `size`: its rows and their padding."""
        return sum(bucket for _, bucket in self.plan(size))

    def run(self, engine_run: EngineRun, inputs: Tensors, outputs: list[str],
            size: int) -> tuple[Tensors, int]:
        """The batch's outputs (padding removed) and the padding rows the engine computed.
        `inputs` hold the batch's `size` rows, and may hold its zero padding after them
        (service/core/batch_buffers.py), which then needs no copy."""
        parts, offset, padding = [], 0, 0
        for rows, bucket in self.plan(size):
            result = engine_run({name: array[offset:offset + bucket]
                                 if offset + bucket <= len(array)
                                 else _padded(name, array[offset:offset + rows], bucket)
                                 for name, array in inputs.items()}, outputs)
            parts.append({name: array[:rows] for name, array in result.items()})
            offset += rows
            padding += bucket - rows
        if len(parts) == 1:
            return parts[0], padding
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}, padding


class _PadBuffers(threading.local):
    """Each engine thread's padded inputs, reused: engines copy their inputs before returning."""

    def __init__(self) -> None:
        self.arrays: dict[tuple, np.ndarray] = {}


_buffers = _PadBuffers()


def _padded(name: str, rows: np.ndarray, bucket: int) -> np.ndarray:
    """`rows` followed by zero rows up to `bucket` (a copy only when padding is needed)."""
    if len(rows) == bucket:
        return rows
    key = (name, bucket, rows.shape[1:], rows.dtype)
    out = _buffers.arrays.get(key)
    if out is None:
        out = _buffers.arrays[key] = np.empty((bucket, *rows.shape[1:]), rows.dtype)
    out[:len(rows)] = rows
    out[len(rows):] = 0
    return out
