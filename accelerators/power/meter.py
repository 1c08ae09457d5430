"""Per-device meters: energy and power sampled from the device's source on one background
thread (never on the request path), and each batch charged, as it ends, its share of them: its
run time times the device's full-load watts (the estimate's busy watts, or the line fitted
through the sensor's samples against utilization), divided by how many batches ran side by side
in the last sampled interval. A request's joules are its rows' part of its batch's charge; the
models' and engines' energy is the sum of their charges, so the two agree by construction. The
device's energy beyond them is its idle energy, no model's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from accelerators.engine import Device
from accelerators.power.model import ModelEstimate
from accelerators.power.select import DEFAULT_MODEL_WATTS, SourcePicker
from accelerators.power.source import PowerSource, SourceError

log = logging.getLogger(__name__)
_FORGET = 0.98  # weight each older interval keeps: the fit follows drift over a minute or so
_RIDGE = 1e-3  # utilization variance below which the fitted line stays about flat
SAMPLE_S = 1.0  # between samples, unless told otherwise (a power budget samples faster)


@dataclass(frozen=True)
class MeterReading:
    device: Device
    source: str
    up: bool
    energy_j: float
    power_w: float
    busy_s: float
    model_energy_j: dict[str, float] = field(default_factory=dict)
    engine_energy_j: dict[str, float] = field(default_factory=dict)


class DeviceMeter:
    def __init__(self, device: Device, source: PowerSource) -> None:
        self.device, self.source = device, source
        self._lock = threading.Lock()
        self._busy_s = 0.0
        self._interval_busy_s = 0.0  # since the last sample
        self._model_energy_j: dict[str, float] = {}
        self._engine_energy_j: dict[str, float] = {}
        self._energy_j = self._power_w = 0.0
        self._up = False
        self._error = ""
        self._last: float | None = None
        # Decayed sums of 1, u, u², p, u·p over the sampled intervals.
        self._fit: tuple[float, ...] = (0.0,) * 5
        self._charge_w = self._busy_w()  # joules per second of a batch's run

    def add_model(self, model: str, engine: str = "") -> None:
        with self._lock:
            self._model_energy_j.setdefault(model, 0.0)
            if engine:
                self._engine_energy_j.setdefault(engine, 0.0)

    def charge(self, model: str, seconds: float, engine: str = "") -> float:
        """The joules of a batch that ran `seconds`, added to its model's and engine's energy.
        Called by a worker after each batch: cheap, no I/O."""
        with self._lock:
            joules = seconds * self._charge_w
            self._busy_s += seconds
            self._interval_busy_s += seconds
            self._model_energy_j[model] = self._model_energy_j.get(model, 0.0) + joules
            if engine:
                self._engine_energy_j[engine] = self._engine_energy_j.get(engine, 0.0) + joules
        return joules

    def sample(self, now: float) -> None:
        with self._lock:
            total_busy, self._interval_busy_s = self._interval_busy_s, 0.0
        elapsed = now - self._last if self._last is not None else 0.0
        self._last = now
        try:
            reading = self.source.sample(now, total_busy / elapsed if elapsed > 0 else 0.0)
        except SourceError as e:
            if str(e) != self._error:
                log.error("%s: power source failed: %s", self.device.name, e)
            self._error, self._up = str(e), False
            return
        self._error = ""
        with self._lock:
            self._energy_j, self._power_w, self._up = reading.energy_j, reading.power_w, True
            if elapsed > 0:  # power against utilization, for busy_power_w's line
                u = min(1.0, total_busy / elapsed)  # instances side by side can exceed 1
                self._fit = tuple(f * _FORGET + x for f, x in zip(
                    self._fit, (1.0, u, u * u, reading.power_w, u * reading.power_w)))
            side_by_side = max(1.0, total_busy / elapsed) if elapsed > 0 else 1.0
            self._charge_w = self._busy_w() / side_by_side

    def busy_power_w(self) -> float | None:
        """Watts at full utilization, for routing by energy; the same meaning for every source.
        The estimate knows them; for a sensor they come from a line fitted through its interval
        powers against utilization, read at 1 (a ridge keeps the line flat until utilization
        has varied). None until an interval with batches has been sampled."""
        with self._lock:
            return self._fitted_w(1.0)

    def idle_power_w(self) -> float:
        """Watts with nothing running: the estimate's, or the sensor's line read at 0 (its last
        reading before the line has data)."""
        with self._lock:
            fitted = self._fitted_w(0.0)
            return self._power_w if fitted is None else fitted

    def _busy_w(self) -> float:
        """busy_power_w, or before the line has data the sensor's last reading."""
        fitted = self._fitted_w(1.0)
        return self._power_w if fitted is None else fitted

    def _fitted_w(self, utilization: float) -> float | None:
        if isinstance(self.source, ModelEstimate):
            return self.source.power_w(utilization)
        n, su, suu, sp, sup = self._fit
        if su <= 0:
            return None
        mean_u, mean_p = su / n, sp / n
        slope = (sup / n - mean_u * mean_p) / (suu / n - mean_u * mean_u + _RIDGE)
        return max(0.0, mean_p + slope * (utilization - mean_u))

    def read(self) -> MeterReading:
        with self._lock:
            return MeterReading(self.device, self.source.source, self._up, self._energy_j,
                                self._power_w, self._busy_s, dict(self._model_energy_j),
                                dict(self._engine_energy_j))


class PowerMonitor:
    """Owns the meters and the sampling thread; `meter()` hands a worker its device's meter."""

    def __init__(self, sources: str = "", model_watts: str = DEFAULT_MODEL_WATTS,
                 interval_s: float = SAMPLE_S) -> None:
        self._picker = SourcePicker(sources, model_watts)
        self.interval_s = interval_s
        self._meters: dict[str, DeviceMeter] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[float], None]] = []

    def add_listener(self, listener: Callable[[float], None]) -> None:
        """`listener(now)` after every sampling of all meters, on the sampling thread."""
        self._listeners.append(listener)

    def meter(self, device: Device) -> DeviceMeter:
        with self._lock:
            found = self._meters.get(device.name)
            if found is None:
                found = self._meters[device.name] = DeviceMeter(device,
                                                                self._picker.pick(device))
                found.sample(time.monotonic())  # the baseline of counters and integrals
            return found

    def meters(self) -> list[DeviceMeter]:
        with self._lock:
            return list(self._meters.values())

    def sample_all(self) -> None:
        now = time.monotonic()
        for meter in self.meters():
            try:
                meter.sample(now)
            except Exception:  # a broken meter must not end the sampling of the others
                log.exception("%s: sampling failed", meter.device.name)
        for listener in self._listeners:
            try:
                listener(now)
            except Exception:
                log.exception("power listener %r failed", listener)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="power-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_all()
