"""Which of a model's devices the `prefer` policy ranks after the others as much slower, learned
from the seconds per sample its runners measure on real batches (warm-up feeds no estimate: its
first runs build plans). A demoted device stays a failover target, and gets one batch now and
then at its configured place, its old estimate forgotten, so that a device that got faster (a
neighbour's load gone) comes back."""

from __future__ import annotations

import logging
import math
from time import monotonic

from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics

log = logging.getLogger(__name__)
# "Much slower": per-sample time averages over whatever batch sizes a device ran, and on CPUs a
# batch of one costs 2-3 times a large batch's per sample; 4x keeps that mix (and a shared
# machine's noise) from overturning the configured order, while an emulator or a CPU kernel
# path against a native runtime (10-100x) crosses it.
SLOWER = 4.0
REMEASURE_EVERY_S = 30.0  # one slow batch this often is the price of noticing a recovery


class SlowDevices:
    def __init__(self, model: str, runners: list[DeviceRunner], metrics: Metrics) -> None:
        self._model = model
        self._runners = runners
        self._demoted: dict[DeviceRunner, float] = {}  # -> monotonic() of its next trial
        self._gauges = {w: metrics.device_demoted.labels(model, w.device.name) for w in runners}
        for gauge in self._gauges.values():
            gauge.set(0)

    def ranked(self, runners: list[DeviceRunner]) -> list[DeviceRunner]:
        """`runners` in their order, the much slower ones moved after the others (not one on
        trial: unmeasured again, it takes its next batch in its place)."""
        self._update()
        slow = [w for w in runners if w in self._demoted and w.seconds_per_sample is not None]
        return [w for w in runners if w not in slow] + slow

    def _update(self) -> None:
        speeds = {w: w.seconds_per_sample for w in self._runners
                  if w.seconds_per_sample is not None}
        if not speeds:
            return
        fastest = min(speeds, key=lambda w: speeds[w])
        now = monotonic()
        for runner, seconds in speeds.items():
            slower = seconds / speeds[fastest] if speeds[fastest] else math.inf
            if slower > SLOWER and runner not in self._demoted:
                self._demote(runner, fastest, slower, now)
            elif slower <= SLOWER and runner in self._demoted:
                self._restore(runner, fastest, slower)
            elif runner in self._demoted and now >= self._demoted[runner]:
                runner.forget_speed()
                self._demoted[runner] = now + REMEASURE_EVERY_S

    def _demote(self, runner: DeviceRunner, fastest: DeviceRunner, slower: float,
                now: float) -> None:
        self._demoted[runner] = now + REMEASURE_EVERY_S
        self._gauges[runner].set(1)
        log.info("model %r: %s is %.1f times slower per sample than %s: ranked after the faster "
                 "devices (still a failover target), re-measured every %g s", self._model,
                 _name(runner), slower, _name(fastest), REMEASURE_EVERY_S)

    def _restore(self, runner: DeviceRunner, fastest: DeviceRunner, slower: float) -> None:
        del self._demoted[runner]
        self._gauges[runner].set(0)
        log.info("model %r: %s is no longer much slower than %s (%.1f times per sample): back "
                 "in its configured place", self._model, _name(runner), _name(fastest), slower)


def _name(runner: DeviceRunner) -> str:
    return f"{runner.device.engine}:{runner.device.name}"
