"""Per-device meters: busy time reported by the workers, energy and power sampled from the
device's source on one background thread (never on the request path), and each interval's
energy attributed to the models, and to the engines sharing the device (ONNX Runtime CUDA and
OpenCL on one GPU), by their share of the busy time in it. Energy of intervals in which nothing
ran is the device's idle energy and belongs to no model or engine."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from accelerators.engine import Device
from accelerators.power.model import ModelEstimate
from accelerators.power.select import DEFAULT_MODEL_WATTS, SourcePicker
from accelerators.power.source import PowerSource, SourceError

log = logging.getLogger(__name__)
_FORGET = 0.98  # weight each older interval keeps: the fit follows drift over a minute or so
_RIDGE = 1e-3  # utilization variance below which the fitted line stays about flat


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
        self._interval_busy: dict[tuple[str, str], float] = {}  # (model, engine) -> seconds
        self._model_energy_j: dict[str, float] = {}
        self._engine_energy_j: dict[str, float] = {}
        self._energy_j = self._power_w = 0.0
        self._up = False
        self._error = ""
        self._last: float | None = None
        self._fit = (0.0,) * 5  # decayed sums of 1, u, u², p, u·p over the sampled intervals

    def add_model(self, model: str, engine: str = "") -> None:
        with self._lock:
            self._model_energy_j.setdefault(model, 0.0)
            if engine:
                self._engine_energy_j.setdefault(engine, 0.0)

    def add_busy(self, model: str, seconds: float, engine: str = "") -> None:
        """Called by a worker after each batch: cheap, no I/O."""
        key = (model, engine)
        with self._lock:
            self._busy_s += seconds
            self._interval_busy[key] = self._interval_busy.get(key, 0.0) + seconds

    def sample(self, now: float) -> None:
        with self._lock:
            busy, self._interval_busy = self._interval_busy, {}
        total_busy = sum(busy.values())
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
            if elapsed > 0:  # power against utilization, for busy_power_w's line
                u = min(1.0, total_busy / elapsed)  # instances side by side can exceed 1
                self._fit = tuple(f * _FORGET + x for f, x in zip(
                    self._fit, (1.0, u, u * u, reading.power_w, u * reading.power_w)))
            increase = max(0.0, reading.energy_j - self._energy_j)
            self._energy_j, self._power_w, self._up = reading.energy_j, reading.power_w, True
            for (model, engine), seconds in busy.items() if total_busy > 0 else ():
                share = increase * seconds / total_busy
                self._model_energy_j[model] = self._model_energy_j.get(model, 0.0) + share
                if engine:
                    self._engine_energy_j[engine] = self._engine_energy_j.get(engine, 0.0) + share

    def busy_power_w(self) -> float | None:
        """Watts at full utilization, for routing by energy; the same meaning for every source.
        The estimate knows them; for a sensor they come from a line fitted through its interval
        powers against utilization, read at 1 (a ridge keeps the line flat until utilization
        has varied). None until an interval with batches has been sampled."""
        if isinstance(self.source, ModelEstimate):
            return self.source.busy_w
        with self._lock:
            n, su, suu, sp, sup = self._fit
        if su <= 0:
            return None
        mean_u, mean_p = su / n, sp / n
        slope = (sup / n - mean_u * mean_p) / (suu / n - mean_u * mean_u + _RIDGE)
        return max(0.0, mean_p + slope * (1.0 - mean_u))

    def read(self) -> MeterReading:
        with self._lock:
            return MeterReading(self.device, self.source.source, self._up, self._energy_j,
                                self._power_w, self._busy_s, dict(self._model_energy_j),
                                dict(self._engine_energy_j))


class PowerMonitor:
    """Owns the meters and the sampling thread; `meter()` hands a worker its device's meter."""

    def __init__(self, sources: str = "", model_watts: str = DEFAULT_MODEL_WATTS,
                 interval_s: float = 1.0) -> None:
        self._picker = SourcePicker(sources, model_watts)
        self.interval_s = interval_s
        self._meters: dict[str, DeviceMeter] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
