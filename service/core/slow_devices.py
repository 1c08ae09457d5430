"""Which of a model's devices the `prefer` policy ranks after the others as much slower, learned
from the times per sample its runners measure on real batches (warm-up feeds no estimate: its
first runs build plans). Under light load only the first device would ever run a batch, and a
much slower first device would never be found out: so an idle device not measured yet takes one
batch ahead of the others once another is measured. A demoted device stays a failover target,
and every REMEASURE_EVERY_S its old estimate is forgotten, so that it takes one such batch, and
a device that got faster (a neighbour's load gone) comes back."""

from __future__ import annotations

import logging
import math
from time import monotonic

from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics

log = logging.getLogger(__name__)
# "Much slower": devices are compared at a batch size both ran, but the other's time may be of a
# larger batch (on CPUs a batch of one costs 2-3 times a large batch's per sample), and a shared
# machine's neighbours add noise; 4x keeps those from overturning the configured order, while
# an emulator or a CPU kernel path against a native runtime (10-100x) crosses it.
SLOWER = 4.0
REMEASURE_EVERY_S = 30.0  # one slow batch this often is the price of noticing a recovery


class SlowDevices:
    def __init__(self, model: str, runners: list[DeviceRunner], metrics: Metrics) -> None:
        self._model = model
        self._runners = runners
        self._demoted: dict[DeviceRunner, float] = {}  # -> monotonic() of its next trial
        # engine too: opencl:cpu0 and onnxruntime:cpu0 are the pair this is most often about
        self._gauges = {w: metrics.device_demoted.labels(model, w.device.name, w.device.engine)
                        for w in runners}
        for gauge in self._gauges.values():
            gauge.set(0)

    def ranked(self, runners: list[DeviceRunner]) -> list[DeviceRunner]:
        """`runners` in their order, the much slower ones moved after the others; first, where
        another is measured, an idle one that is not (on trial: busy with that batch, it is
        passed over for the next ones until its time is in)."""
        self._update()
        slow = [w for w in runners if w in self._demoted and w.times.largest]
        order = [w for w in runners if w not in slow] + slow
        trial = next((w for w in order if not w.times.largest and w.idle), None)
        if trial is None or not any(w.times.largest for w in order):
            return order
        return [trial] + [w for w in order if w is not trial]

    def _update(self) -> None:
        measured = [w for w in self._runners if w.times.largest]
        now = monotonic()
        due = [w for w in measured if w in self._demoted and now >= self._demoted[w]]
        for runner in measured:
            slower, than = max(((_slower(runner, w), w) for w in measured if w is not runner),
                               key=lambda pair: pair[0], default=(1.0, runner))
            if slower > SLOWER and runner not in self._demoted:
                self._demote(runner, than, slower, now)
            elif slower <= SLOWER and runner in self._demoted:
                self._restore(runner, than, slower)
        for runner in due:  # after the comparisons, which read its times
            if runner in self._demoted:
                runner.forget_speed()
                self._demoted[runner] = now + REMEASURE_EVERY_S

    def _demote(self, runner: DeviceRunner, than: DeviceRunner, slower: float,
                now: float) -> None:
        self._demoted[runner] = now + REMEASURE_EVERY_S
        self._gauges[runner].set(1)
        log.info("model %r: %s is %.1f times slower per sample than %s: ranked after the faster "
                 "devices (still a failover target), re-measured every %g s", self._model,
                 _name(runner), slower, _name(than), REMEASURE_EVERY_S)

    def _restore(self, runner: DeviceRunner, than: DeviceRunner, slower: float) -> None:
        del self._demoted[runner]
        self._gauges[runner].set(0)
        log.info("model %r: %s is no longer much slower than %s (%.1f times per sample): back "
                 "in its configured place", self._model, _name(runner), _name(than), slower)


def _slower(runner: DeviceRunner, other: DeviceRunner) -> float:
    """How many times longer `runner` takes per sample than `other`, both measured, at the
    largest batch size both have run (each estimate is of a batch that size or larger): a device
    measured on small batches only (a probe's one sample) is not judged against another's large
    ones, whose per-sample time a batch's fixed costs weigh less on."""
    size = min(runner.times.largest, other.times.largest)
    mine, theirs = runner.times.estimate(size), other.times.estimate(size)
    assert mine is not None and theirs is not None  # both measured
    return mine / theirs if theirs else math.inf


def _name(runner: DeviceRunner) -> str:
    return f"{runner.device.engine}:{runner.device.name}"
