"""A device worker: runs one model's batches on one engine, off the event loop, and meters them."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from accelerators.engine import Engine
from service.errors import DeviceError
from service.metrics import Metrics


class DeviceWorker:
    def __init__(self, model: str, engine: Engine, metrics: Metrics,
                 flops_per_sample: int = 0) -> None:
        self.model = model
        self.engine = engine
        # One thread per worker: engines are not re-entrant, and ONNX Runtime releases the GIL.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"{model}-{engine.device.name}")
        labels = dict(model=model, device=engine.device.name, kind=engine.device.kind,
                      engine=engine.device.engine)
        self._compute = metrics.compute_duration.labels(**labels)
        self._batch_size = metrics.batch_size.labels(**labels)
        self._inferences = metrics.inferences.labels(**labels)
        self._flops = metrics.flops.labels(**labels)
        self._flops_per_sample = flops_per_sample
        metrics.failovers.labels(model=model, device=engine.device.name)  # exported from zero
        self._meter = metrics.power.meter(engine.device)
        self._meter.add_model(model)

    async def run(self, inputs: dict[str, np.ndarray], outputs: list[str],
                  size: int) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self._thread, self.engine.run, inputs, outputs)
        except Exception as e:
            raise DeviceError(f"device {self.engine.device.name} failed to run a batch of "
                              f"{size}: {e}") from e
        elapsed = time.perf_counter() - start
        self._compute.observe(elapsed)
        self._batch_size.observe(size)
        self._inferences.inc(size)
        self._flops.inc(size * self._flops_per_sample)
        self._meter.add_busy(self.model, elapsed)
        return result

    def close(self) -> None:
        self._thread.shutdown(wait=True)
