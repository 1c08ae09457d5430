"""Ranks a model's device runners for a batch by policy, and keeps their health.

Policies (the model's `policy` parameter):
- prefer: the configured order; spill to the next device when the preferred one cannot finish
  the batch within the latency budget. A device measured much slower per sample than another
  (SlowDevices) is ranked after the others, unless the model's `prefer_order` is `strict`.
- latency: least expected completion time.
- efficiency: fewest joules per inference among devices that meet the latency budget; every
  model's order while the node is over its power budget (service/core/power_budget.py).
A device that fails a batch is marked unhealthy with backoff and the batch re-runs on the next
device (service/core/scheduler.py); a probe (one sample of the failed batch) brings it back.
Only when every device fails does the batch fail.
"""

from __future__ import annotations

import asyncio
import logging
import time

from service.core.batch_buffers import Batch
from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics
from service.core.power_budget import PowerBudget
from service.core.slow_devices import SlowDevices
from service.core.types import Tensors
from service.errors import DeviceError

log = logging.getLogger(__name__)
POLICIES = ("prefer", "latency", "efficiency")
PREFER_ORDERS = ("measured", "strict")  # `strict`: the configured order, however slow
_PROBE_EVERY_S = 0.25


class DeviceRanking:
    def __init__(self, model: str, runners: list[DeviceRunner], policy: str,
                 latency_budget_s: float, outputs: list[str], metrics: Metrics,
                 power_budget: PowerBudget | None = None, prefer_order: str = "measured",
                 ) -> None:
        self.model = model
        self._power_budget = power_budget
        self.runners = runners  # in configured order
        self.policy = policy
        self.latency_budget_s = latency_budget_s
        self.prefer_order = prefer_order
        self._slow = SlowDevices(model, runners, metrics) if prefer_order == "measured" else None
        self._outputs = outputs
        self._failovers = {w.device.name: metrics.failovers.labels(model, w.device.name)
                           for w in runners}
        self._probe_inputs: Tensors | None = None
        self._prober: asyncio.Task | None = None

    def candidates(self, size: int) -> list[DeviceRunner]:
        """Healthy devices in policy order, then the unhealthy ones as a last resort."""
        healthy = [w for w in self.runners if w.healthy]
        budget = self.latency_budget_s

        def fits(w: DeviceRunner) -> bool:
            return w.expected_completion_s(size) <= budget

        policy = "efficiency" if self._power_budget and self._power_budget.by_energy \
            else self.policy
        if policy == "prefer":
            if self._slow is not None:
                healthy = self._slow.ranked(healthy)
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
        return ordered + [w for w in self.runners if not w.healthy]

    def succeeded(self, runner: DeviceRunner) -> None:
        """A batch ran on `runner`: a last-resort run on an unhealthy device brings it back."""
        if not runner.healthy:
            runner.mark_healthy()

    def failed(self, runner: DeviceRunner, batch: Batch, error: DeviceError) -> None:
        """`runner` failed a batch: unhealthy until a probe succeeds."""
        runner.mark_failed()
        self._failovers[runner.device.name].inc()
        log.warning("model %r: %s; re-running the batch on the next device, probing again in "
                    "%.1f s", self.model, error, runner.retry_at - time.monotonic())
        # One sample to probe with (a model without a batch axis takes the request whole).
        self._probe_inputs = batch.sample()
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe(), name=f"probe-{self.model}")

    async def _probe(self) -> None:
        """Runs one sample on each unhealthy device once its backoff has passed."""
        while any(not w.healthy for w in self.runners):
            await asyncio.sleep(_PROBE_EVERY_S)
            for runner in self.runners:
                if runner.healthy or time.monotonic() < runner.retry_at:
                    continue
                assert self._probe_inputs is not None  # set before the prober starts
                try:
                    await runner.run(Batch.of(self._probe_inputs, 1), self._outputs, 1)
                except DeviceError as e:
                    runner.mark_failed()
                    log.warning("model %r: probe of %s failed (%s); next in %.1f s", self.model,
                                runner.device.name, e, runner.retry_at - time.monotonic())
                else:
                    runner.mark_healthy()
                    log.info("model %r: device %s is healthy again", self.model,
                             runner.device.name)

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        for runner in self.runners:
            runner.close()
