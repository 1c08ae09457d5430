"""Which of a model's devices the `prefer` policy ranks after the others as much slower, learned
from the times per sample its runners measure on real batches (warm-up feeds no estimate: its
first runs build plans), each device judged by its best recent batches: a cold start, a busy
neighbour or an emulator sharing the CPU only ever slow a batch, and one such batch must not
decide: a device is demoted once it has run TRIAL_BATCHES batches. Under light load only the
first device would ever run a batch, and a much slower first device would never be found out:
so once another device is measured, an idle device that has run fewer than TRIAL_BATCHES
batches takes one batch ahead of the others (the least tried first). A demoted device stays a
failover target, and once its latest batch is REMEASURE_EVERY_S old it takes one such batch,
so that a device that got faster (a neighbour's load gone) comes back."""

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
# Batches a device runs (in turns with the others under light load) before it may be demoted:
# on 2 vCPUs an ONNX Runtime batch of 16 that ran beside the FPGA emulator took 0.8 s against
# 5-10 ms, and, as the one batch measured, kept the emulator first for a whole Spark job.
TRIAL_BATCHES = 3
REMEASURE_EVERY_S = 30.0  # one slow batch this often is the price of noticing a recovery


class SlowDevices:
    def __init__(self, model: str, runners: list[DeviceRunner], metrics: Metrics) -> None:
        self._model = model
        self._runners = runners
        self._demoted: set[DeviceRunner] = set()
        # engine too: opencl:cpu0 and onnxruntime:cpu0 are the pair this is most often about
        self._gauges = {w: metrics.device_demoted.labels(model, w.device.name, w.device.engine)
                        for w in runners}
        for gauge in self._gauges.values():
            gauge.set(0)

    def ranked(self, runners: list[DeviceRunner]) -> list[DeviceRunner]:
        """`runners` in their order, the much slower ones moved after the others; first, where
        another is measured, an idle one on trial (busy with that batch, it is passed over for
        the next ones until its time is in)."""
        self._update()
        order = [w for w in runners if w not in self._demoted] + \
            [w for w in runners if w in self._demoted]
        now = monotonic()
        tried = [w for w in order if w.idle and self._on_trial(w, now)]
        trial = min(tried, key=lambda w: w.times.batches, default=None)
        if trial is None or not any(w.times.largest for w in order if w is not trial):
            return order
        return [trial] + [w for w in order if w is not trial]

    def _on_trial(self, runner: DeviceRunner, now: float) -> bool:
        if runner in self._demoted:
            return now - runner.times.observed_at >= REMEASURE_EVERY_S
        return not _tried(runner)

    def _update(self) -> None:
        """Demotes a device only on its own trial's evidence: a slow batch says little of the
        device alone, while a slow batch of the device it is compared with only delays the
        verdict (the trial goes on)."""
        measured = [w for w in self._runners if w.times.largest]
        for runner in measured:
            slower, than = max(((_slower(runner, w), w) for w in measured if w is not runner),
                               key=lambda pair: pair[0], default=(1.0, runner))
            if slower > SLOWER and _tried(runner) and runner not in self._demoted:
                self._demote(runner, than, slower)
            elif slower <= SLOWER and runner in self._demoted:
                self._restore(runner, than, slower)

    def _demote(self, runner: DeviceRunner, than: DeviceRunner, slower: float) -> None:
        self._demoted.add(runner)
        self._gauges[runner].set(1)
        log.info("model %r: %s is %.1f times slower per sample than %s: ranked after the faster "
                 "devices (still a failover target), re-measured every %g s", self._model,
                 _name(runner), slower, _name(than), REMEASURE_EVERY_S)

    def _restore(self, runner: DeviceRunner, than: DeviceRunner, slower: float) -> None:
        self._demoted.discard(runner)
        self._gauges[runner].set(0)
        log.info("model %r: %s is no longer much slower than %s (%.1f times per sample): back "
                 "in its configured place", self._model, _name(runner), _name(than), slower)


def _tried(runner: DeviceRunner) -> bool:
    return runner.times.batches >= TRIAL_BATCHES


def _slower(runner: DeviceRunner, other: DeviceRunner) -> float:
    """How many times longer `runner` takes per sample than `other`, both measured, by their
    best recent batches at the largest batch size both have run (each estimate is of a batch
    that size or larger): a device measured on small batches only (a probe's one sample) is not
    judged against another's large ones, whose per-sample time a batch's fixed costs weigh
    less on."""
    size = min(runner.times.largest, other.times.largest)
    mine = runner.times.estimate(size, best=True)
    theirs = other.times.estimate(size, best=True)
    assert mine is not None and theirs is not None  # both measured
    return mine / theirs if theirs else math.inf


def _name(runner: DeviceRunner) -> str:
    return f"{runner.device.engine}:{runner.device.name}"
