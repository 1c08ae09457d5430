"""Dynamic batching: concurrent requests of one model share a model run.

The wait window opens when the first request of a batch arrives; a batch leaves when it is full
(max_batch_size, or the largest preferred size) or when the window closes. Requests that carry
several samples are packed whole and their outputs split back in order. Cancelled requests are
dropped before their batch runs; a full queue refuses at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2

from service.errors import ModelUnavailableError, QueueFullError

Tensors = dict[str, np.ndarray]
RunBatch = Callable[[Tensors, int], Awaitable[Tensors]]


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # 0: the model has no batch axis, so every request runs alone
    max_queue_delay_s: float
    max_queue_size: int  # samples waiting, across requests
    preferred_batch_sizes: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig,
                    default_max_queue_size: int) -> BatchPolicy:
        dyn = config.dynamic_batching
        batching = config.HasField("dynamic_batching") and config.max_batch_size > 0
        return cls(
            max_batch_size=config.max_batch_size,
            max_queue_delay_s=dyn.max_queue_delay_microseconds / 1e6 if batching else 0.0,
            max_queue_size=(dyn.default_queue_policy.max_queue_size
                            or default_max_queue_size),
            preferred_batch_sizes=tuple(dyn.preferred_batch_size) if batching else ())

    @property
    def dispatch_size(self) -> int:
        """Samples at which a batch leaves without waiting for the window to close."""
        return max(self.preferred_batch_sizes, default=self.max_batch_size) or 1


@dataclass(eq=False)
class _Pending:
    inputs: Tensors
    size: int
    future: asyncio.Future
    enqueued: float


class DynamicBatcher:
    def __init__(self, model: str, policy: BatchPolicy, run_batch: RunBatch,
                 observe_queue_s: Callable[[float], None]) -> None:
        self.model = model
        self.policy = policy
        self._run_batch = run_batch
        self._observe_queue_s = observe_queue_s
        self._queue: deque[_Pending] = deque()
        self._queued = 0  # samples in _queue
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{model}")

    async def submit(self, inputs: Tensors, size: int) -> Tensors:
        if self._queued + size > self.policy.max_queue_size:
            raise QueueFullError(
                f"model {self.model!r}: queue holds {self._queued} samples and "
                f"max_queue_size is {self.policy.max_queue_size}; retry later")
        pending = _Pending(inputs, size, asyncio.get_running_loop().create_future(),
                           time.monotonic())
        self._queue.append(pending)
        self._queued += size
        self._arrived.set()
        return await pending.future

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        while self._queue:
            self._settle(self._queue.popleft(), error=ModelUnavailableError(
                f"model {self.model!r} is unloading"))

    async def _loop(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch:
                await self._run(batch)

    async def _next_batch(self) -> list[_Pending]:
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        close_at = self._queue[0].enqueued + self.policy.max_queue_delay_s
        while self._queued < self.policy.dispatch_size:
            remaining = close_at - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        return self._take()

    def _take(self) -> list[_Pending]:
        limit = max(self.policy.max_batch_size, 1)
        batch: list[_Pending] = []
        total = 0
        while self._queue and (not batch or total + self._queue[0].size <= limit):
            if self.policy.max_batch_size == 0 and batch:
                break
            pending = self._queue.popleft()
            self._queued -= pending.size
            if pending.future.done():  # cancelled by its client while waiting
                continue
            batch.append(pending)
            total += pending.size
        return batch

    async def _run(self, batch: list[_Pending]) -> None:
        started = time.monotonic()
        for pending in batch:
            self._observe_queue_s(started - pending.enqueued)
        inputs = batch[0].inputs if len(batch) == 1 else {
            name: np.concatenate([p.inputs[name] for p in batch]) for name in batch[0].inputs}
        try:
            outputs = await self._run_batch(inputs, sum(p.size for p in batch))
        except Exception as e:
            for pending in batch:
                self._settle(pending, error=e)
            return
        if len(batch) == 1:  # nothing to split (and unbatched models have no batch axis)
            self._settle(batch[0], result=outputs)
            return
        offset = 0
        for pending in batch:
            self._settle(pending, result={name: array[offset:offset + pending.size]
                                          for name, array in outputs.items()})
            offset += pending.size

    @staticmethod
    def _settle(pending: _Pending, result: Tensors | None = None,
                error: Exception | None = None) -> None:
        if pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)
