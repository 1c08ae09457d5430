"""What every power source gives: cumulative joules and current watts, and where they came from.

A source is sampled from one background thread, never on the request path. Sensors that count
energy report it directly (power is the counter's slope); sensors that only report power are
integrated over time (trapezoids between samples).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A source cannot be read: absent, unreadable, or not giving a number."""


@dataclass(frozen=True)
class Sample:
    energy_j: float  # since the source was created
    power_w: float


class PowerSource(abc.ABC):
    source: str  # the metrics' `source` label: nvml | rapl | hwmon | xrt | opae | model
    priced = True  # False: the watts are not the device's own (an emulator's: its host's)

    @abc.abstractmethod
    def sample(self, now: float, utilization: float) -> Sample:
        """Reads the sensor at monotonic time `now`; `utilization` (0..1, the device's busy
        fraction since the last sample) matters only to the model estimate."""

    def describe(self) -> str:
        return self.source


class EnergyCounterSource(PowerSource):
    """A sensor with an energy counter: power is the increase over the time between samples."""

    def __init__(self) -> None:
        self._energy_j = 0.0
        self._power_w = 0.0
        self._last: float | None = None

    @abc.abstractmethod
    def read_increase_j(self) -> float:
        """Joules counted since the previous call (0 on the first), wraparound handled."""

    def sample(self, now: float, utilization: float) -> Sample:
        increase = self.read_increase_j()
        if self._last is not None and now > self._last:
            self._power_w = increase / (now - self._last)
        self._energy_j += increase
        self._last = now
        return Sample(self._energy_j, self._power_w)


class Integral:
    """Energy from power readings alone: the trapezoids between successive samples."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self._last: tuple[float, float] | None = None  # (time, watts)

    def add(self, now: float, power_w: float) -> float:
        """The energy so far, with the reading `power_w` at monotonic time `now`."""
        if self._last is not None:
            then, before = self._last
            self.energy_j += (before + power_w) / 2 * max(0.0, now - then)
        self._last = (now, power_w)
        return self.energy_j


class PowerGaugeSource(PowerSource):
    """A sensor that only reports watts: energy is integrated between samples."""

    def __init__(self) -> None:
        self._integral = Integral()

    @abc.abstractmethod
    def read_power_w(self) -> float: ...

    def sample(self, now: float, utilization: float) -> Sample:
        power = self.read_power_w()
        return Sample(self._integral.add(now, power), power)


def read_int(path: Path) -> int:
    """An integer sysfs attribute, with errors that say which file and why."""
    try:
        text = path.read_text().strip()
    except PermissionError:
        raise SourceError(f"{path}: permission denied (run the daemon as a user that may read "
                          f"it, e.g. through a udev rule or group)") from None
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return int(text)
    except ValueError:
        raise SourceError(f"{path}: {text!r} is not an integer") from None
