"""Routes a model's batches to its device runners by policy, and fails over.

Policies (the model's `policy` parameter):
- prefer: the configured order; spill to the next device when the preferred one cannot finish
  the batch within the latency budget.
- latency: least expected completion time.
- efficiency: fewest joules per inference among devices that meet the latency budget; every
  model's order while the node is over its power budget (service/core/power_budget.py).
A device that fails a batch is marked unhealthy with backoff and the batch re-runs on the next
device; a probe (one sample of the failed batch) brings it back. Only when every device fails
does the batch fail.
"""

from __future__ import annotations

import asyncio
import logging
import time

from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics
from service.core.power_budget import PowerBudget
from service.core.types import Answer, Tensors
from service.errors import DeviceError

log = logging.getLogger(__name__)
POLICIES = ("prefer", "latency", "efficiency")
_PROBE_EVERY_S = 0.25


class Router:
    def __init__(self, model: str, workers: list[DeviceRunner], policy: str,
                 latency_budget_s: float, outputs: list[str], metrics: Metrics,
                 power_budget: PowerBudget | None = None) -> None:
        self.model = model
        self._power_budget = power_budget
        self.workers = workers  # in configured order
        self.policy = policy
        self.latency_budget_s = latency_budget_s
        self._outputs = outputs
        self._failovers = {w.device.name: metrics.failovers.labels(model, w.device.name)
                           for w in workers}
        self._probe_inputs: Tensors | None = None
        self._prober: asyncio.Task | None = None

    async def run(self, inputs: Tensors, size: int) -> Answer:
        errors = []
        for worker in self.candidates(size):
            try:
                answer = await worker.run(inputs, self._outputs, size)
            except DeviceError as e:
                errors.append(str(e))
                self._failed(worker, inputs, size, e)
                continue
            if not worker.healthy:  # a last-resort run on an unhealthy device worked
                worker.mark_healthy()
            return answer
        raise DeviceError(f"model {self.model!r}: every device failed the batch: "
                          + "; ".join(errors))

    def run_now(self, inputs: Tensors, size: int, lone: bool = False) -> Answer | None:
        """The batch's answer, computed now on this thread, when the device that `run` would
        try first takes it so (DeviceRunner.run_now: idle and quick); None when it would not,
        or when it failed the batch (marked failed: `run` re-runs the batch on the next
        device)."""
        worker = self.candidates(size)[0]
        try:
            return worker.run_now(inputs, self._outputs, size, lone)
        except DeviceError as e:
            self._failed(worker, inputs, size, e)
            return None

    def candidates(self, size: int) -> list[DeviceRunner]:
        """Healthy devices in policy order, then the unhealthy ones as a last resort."""
        healthy = [w for w in self.workers if w.healthy]
        budget = self.latency_budget_s

        def fits(w: DeviceRunner) -> bool:
            return w.expected_completion_s(size) <= budget

        policy = "efficiency" if self._power_budget and self._power_budget.by_energy \
            else self.policy
        if policy == "prefer":
            first = next((w for w in healthy if fits(w)), None)
            if first is None and healthy:
                first = min(healthy, key=lambda w: w.expected_completion_s(size))
            ordered = ([first] if first else []) + [w for w in healthy if w is not first]
        elif policy == "latency":
            ordered = sorted(healthy, key=lambda w: w.expected_completion_s(size))
        else:  # efficiency; an unmeasured device ranks first, so that it gets measured, and
            # one whose watts are not its own (an emulator's) last
            ordered = sorted([w for w in healthy if fits(w) and w.priced],
                             key=lambda w: w.joules_per_inference() or 0.0)
            ordered += sorted([w for w in healthy if w not in ordered],
                              key=lambda w: (not w.priced, w.expected_completion_s(size)))
        return ordered + [w for w in self.workers if not w.healthy]

    def _failed(self, worker: DeviceRunner, inputs: Tensors, size: int,
                error: Exception) -> None:
        worker.mark_failed()
        self._failovers[worker.device.name].inc()
        log.warning("model %r: %s; re-running the batch on the next device, probing again in "
                    "%.1f s", self.model, error, worker.retry_at - time.monotonic())
        # One sample to probe with (a model without a batch axis takes the request whole).
        self._probe_inputs = {name: (array if size == 1 else array[:1]).copy()
                              for name, array in inputs.items()}
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe(), name=f"probe-{self.model}")

    async def _probe(self) -> None:
        """Runs one sample on each unhealthy device once its backoff has passed."""
        while any(not w.healthy for w in self.workers):
            await asyncio.sleep(_PROBE_EVERY_S)
            for worker in self.workers:
                if worker.healthy or time.monotonic() < worker.retry_at:
                    continue
                assert self._probe_inputs is not None  # set before the prober starts
                try:
                    await worker.run(self._probe_inputs, self._outputs, 1)
                except DeviceError as e:
                    worker.mark_failed()
                    log.warning("model %r: probe of %s failed (%s); next in %.1f s", self.model,
                                worker.device.name, e, worker.retry_at - time.monotonic())
                else:
                    worker.mark_healthy()
                    log.info("model %r: device %s is healthy again", self.model,
                             worker.device.name)

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        for worker in self.workers:
            worker.close()
