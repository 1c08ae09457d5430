"""Batch buckets: the few fixed batch sizes a model's engines see.

Accelerator runtimes re-plan when an input's shape changes (ONNX Runtime's CUDA provider by
60-120x per run), so a device that batches by buckets gets each batch padded up to the next
bucket, or split into runs of the largest bucket and a padded rest. Padding rows are cut off the
outputs before anyone sees them. The sizes are the contract's (service.contract.batch_buckets):
config.pbtxt's `dynamic_batching.preferred_batch_size`, else the powers of two below
`max_batch_size` and `max_batch_size` itself.

Whether a device batches by buckets is the model's `batch_buckets` parameter: `auto` (the
default: on for GPUs and FPGAs, off for CPUs, where padding only costs compute; see
docs/BENCHMARKS.md), `on` or `off`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2

from service import contract
from service.core.types import Tensors
from service.errors import ConfigError

MODES = ("auto", "on", "off")
AUTO_KINDS = ("gpu", "fpga")  # kinds that batch by buckets under `auto`

EngineRun = Callable[[Tensors, list[str]], Tensors]


@dataclass(frozen=True)
class Buckets:
    sizes: tuple[int, ...]  # ascending, at least one

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> Buckets | None:
        """The model's buckets; None for a model without a batch axis (max_batch_size 0)."""
        limit = config.max_batch_size
        if limit <= 0:
            return None
        preferred = sorted(set(config.dynamic_batching.preferred_batch_size))
        bad = [p for p in preferred if not 1 <= p <= limit]
        if bad:
            raise ConfigError(
                f"model {config.name!r}: dynamic_batching.preferred_batch_size {bad[0]} is "
                f"outside what max_batch_size {limit} allows; accepted values are 1 to {limit}")
        return cls(contract.batch_buckets(limit, preferred))

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


def enabled(mode: str, kind: str) -> bool:
    """Whether a device of `kind` batches by buckets under the model's `batch_buckets` mode."""
    return mode == "on" or (mode == "auto" and kind in AUTO_KINDS)


def check_mode(model: str, mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"model {model!r}: parameters.batch_buckets: {mode!r} is unknown; "
                          f"expected one of {list(MODES)}")
    return mode


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
