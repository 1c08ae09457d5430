"""The sweep: the shipped config first, then stages that each vary one choice around the best
candidate so far (devices, then instances, queue delay, preferred batch sizes), within a time
budget; then the winner and the shipped config measured once more at their best concurrency, one
after the other, so that the comparison is not the winner's lucky first run.

A candidate is measured only when the time it is expected to take (a daemon's start and stop as
they took so far, plus its load points) still fits the budget with the confirmation's time kept
back; the others are listed as skipped."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from tritonclient.grpc import model_config_pb2

from accelerators.engine_factory import DeviceSpec
from service.clients.tune import rank, space
from service.clients.tune.measure import LoadSettings, Measurement, Workspace, measure
from service.clients.tune.space import Candidate

_POINT_OVERHEAD_S = 0.3  # per load point beyond its seconds: the client's start, the merge


class ShippedConfigError(RuntimeError):
    """The model does not load with its own config: nothing can be compared against it."""


@dataclass(frozen=True)
class SweepSettings:
    objective: str
    budget_s: float
    devices: list[DeviceSpec]  # candidate devices, in preference order


@dataclass
class SweepResult:
    """Filled as the sweep goes, so that an interrupted or failed sweep still shows its points."""
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[tuple[str, Candidate]] = field(default_factory=list)
    confirmation: tuple[Measurement, Measurement] | None = None  # (winner, shipped) again
    note: str = ""  # why there was no confirmation

    @property
    def shipped(self) -> Measurement:
        return self.measurements[0]


class _Clock:
    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


def _expected_s(measurements: list[Measurement], load: LoadSettings, points: int) -> float:
    """A candidate's expected time with `points` load points: the mean start-and-stop time of
    the daemons so far, plus the points."""
    per_point = load.seconds + _POINT_OVERHEAD_S
    overhead = sum(max(0.0, m.seconds - len(m.points) * per_point)
                   for m in measurements) / len(measurements)
    return overhead + points * per_point


def sweep(model: str, config: model_config_pb2.ModelConfig, shipped_text: str,
          workspace: Workspace, inputs: dict[str, np.ndarray], load: LoadSettings,
          settings: SweepSettings, result: SweepResult,
          progress: Callable[[str, float], None]) -> None:
    """Measures into `result`; `progress(next step, seconds used)` after each candidate."""
    clock = _Clock(settings.budget_s)

    def run(candidate: Candidate, stage: str, text: str, run_load: LoadSettings) -> Measurement:
        progress(f"{stage}: {candidate.label()}", 0.0)
        # a daemon gets what is left of the budget to start (the first start compiles programs)
        measurement = measure(workspace, model, text, candidate, stage, run_load,
                              max(30.0, clock.left()), inputs)
        progress("", measurement.seconds)
        return measurement

    shipped = run(space.shipped_candidate(config, space.devices_of(config)), "shipped",
                  shipped_text, load)
    result.measurements.append(shipped)
    if shipped.error or not shipped.points:
        raise ShippedConfigError(shipped.error or "no load point answered")
    shipped.candidate = space.shipped_candidate(config, shipped.served_devices
                                                or space.devices_of(config))
    best = shipped
    stages: list[tuple[str, Callable[[Candidate], list[Candidate]]]] = [
        ("devices", lambda b: space.device_stage(b, settings.devices)),
        ("instances", space.instance_stage),
        ("delay", lambda b: space.delay_stage(b, load.p99_ms)),
        ("preferred", lambda b: space.preferred_stage(b, config.max_batch_size)),
    ]
    for stage, make in stages:
        for candidate in make(best.candidate):
            if any(m.candidate == candidate for m in result.measurements):
                continue
            expected = (_expected_s(result.measurements, load, len(load.concurrencies))
                        + 2 * _expected_s(result.measurements, load, 1))
            if clock.left() < expected:
                result.skipped.append((stage, candidate))
                continue
            measurement = run(candidate, stage, space.render(config, candidate), load)
            result.measurements.append(measurement)
            if _beats(measurement, best, settings.objective, load.p99_ms):
                best = measurement
    _confirm(best, result, clock, settings.objective, load, run,
             (space.render(config, best.candidate), shipped_text))


def _beats(a: Measurement, b: Measurement, objective: str, p99_ms: float | None) -> bool:
    pa, pb = rank.best_point(a, objective, p99_ms), rank.best_point(b, objective, p99_ms)
    if pa is None:
        return False
    return pb is None or rank.better(rank.best_figure(pa, objective),
                                     rank.best_figure(pb, objective), objective)


def _confirm(best: Measurement, result: SweepResult, clock: _Clock, objective: str,
             load: LoadSettings, run: Callable[..., Measurement],
             texts: tuple[str, str]) -> None:
    """The winner and the shipped config again, each at its best concurrency."""
    shipped = result.shipped
    if best is shipped:
        result.note = "the shipped config won: nothing to confirm"
        return
    if clock.left() < 2 * _expected_s(result.measurements, load, 1):
        result.note = "no budget left to measure the winner and the shipped config again"
        return
    again = []
    for measurement, text in zip((best, shipped), texts):
        point = rank.best_point(measurement, objective, load.p99_ms)
        concurrency = point.concurrency if point else load.concurrencies[-1]
        again.append(run(measurement.candidate, "confirm", text,
                         replace(load, concurrencies=(concurrency,))))
    result.confirmation = (again[0], again[1])


def winner(result: SweepResult, objective: str, p99_ms: float | None) -> Measurement | None:
    """The sweep's best candidate, unless the confirmation found it worse than the shipped
    config (then the shipped config, where it qualifies); None when no candidate qualifies."""
    ranking = rank.ranked(result.measurements, objective, p99_ms)
    if not ranking or ranking[0][1] is None:
        return None
    best = ranking[0][0]
    if result.confirmation:
        again_best, again_shipped = (rank.best_point(m, objective, p99_ms)
                                     for m in result.confirmation)
        if again_best is None or (again_shipped is not None and rank.better(
                rank.best_figure(again_shipped, objective),
                rank.best_figure(again_best, objective), objective)):
            # The shipped config, unless it has no qualifying point to compare and report.
            shipped_qualifies = rank.best_point(result.shipped, objective, p99_ms) is not None
            return result.shipped if shipped_qualifies else None
    return best
