"""Images/s by batch size for each model on each device and engine of this node, run
in-process (the engine alone) and through a daemon (the same engine behind gRPC, tensors in
shared memory), with watts and where they come from, GFLOP/s per watt and joules per image.

Watts come from the device's power source as the daemon would pick it (accelerators/power:
a sensor, or the `model` estimate from idle and busy watts, which is labelled so). The
utilization that the estimate needs is measured: in-process the engine runs back to back (busy
all the time), through the daemon it is the daemon's busy-seconds counter over the run."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerators.engine import Device
from accelerators.engines import DeviceSpec, create_engine
from accelerators.power.select import DEFAULT_MODEL_WATTS, SourcePicker
from accelerators.power.source import PowerSource
from bench.local_daemon import local_daemon
from bench.models import INPUT, OUTPUT, BenchModel, write_repository
from service.top import Snapshot, fetch
from spark_jobs.client import ModelInterface, infer

BATCHES = (1, 8, 32, 64, 256)
_MAX_STAGED_BYTES = 1 << 30  # images staged per daemon point


@dataclass
class Point:
    model: str
    device: str  # e.g. cpu0
    engine: str  # onnxruntime | opencl
    path: str  # in-process | daemon
    batch: int
    flops_per_image: int
    images_per_s: float | None = None
    watts: float | None = None
    power_source: str = ""  # model | rapl | nvml | ...; `model` is an estimate
    note: str = ""  # why a point was skipped or failed

    @property
    def target(self) -> str:
        return f"{self.engine}:{self.device} {self.path}"

    @property
    def gflops(self) -> float | None:
        return self.images_per_s * self.flops_per_image / 1e9 if self.images_per_s else None

    @property
    def gflops_per_watt(self) -> float | None:
        return self.gflops / self.watts if self.gflops and self.watts else None

    @property
    def joules_per_image(self) -> float | None:
        return self.watts / self.images_per_s if self.images_per_s and self.watts else None

    def as_dict(self) -> dict:
        return {**asdict(self), "gflops": self.gflops, "gflops_per_watt": self.gflops_per_watt,
                "joules_per_image": self.joules_per_image}


@dataclass(frozen=True)
class TableSettings:
    batches: tuple[int, ...] = BATCHES
    seconds: float = 1.0  # per point, after one warm-up batch
    max_batch_s: float = 2.0  # skip a batch size expected to take longer than this per batch
    power_sources: str = ""
    power_model: str = DEFAULT_MODEL_WATTS
    daemon: bool = True


def _measure(run: Callable[[], None], seconds: float) -> tuple[int, float]:
    """Runs after a warm-up until `seconds` have passed (at least once): (runs, elapsed)."""
    run()
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or runs == 0:
        run()
        runs += 1
    return runs, elapsed


def _joules(source: PowerSource, start: float, end: float, utilization: float) -> float:
    """Energy between `start` and `end` (monotonic): the source sampled at both."""
    before = source.sample(start, 0.0).energy_j
    return source.sample(end, utilization).energy_j - before


def _too_slow(point: Point, rate: float | None, limit_s: float) -> bool:
    """Whether a batch would take over `limit_s` at the rate of the previous batch size."""
    if rate and point.batch / rate > limit_s:
        point.note = f"skipped: about {point.batch / rate:.0f} s per batch (over --max-batch-s)"
        return True
    return False


def in_process(model: BenchModel, spec: DeviceSpec, source: PowerSource,
               settings: TableSettings, progress: Callable[[], None]) -> list[Point]:
    engine = create_engine(spec, model.path)
    points, rate = [], None
    for batch in settings.batches:
        point = Point(model.name, spec.device, spec.engine, "in-process", batch,
                      model.flops_per_image, power_source=source.source)
        points.append(point)
        if not _too_slow(point, rate, settings.max_batch_s):
            x = model.images(batch)
            start = time.monotonic()
            runs, elapsed = _measure(lambda: engine.run({INPUT: x}, [OUTPUT]),
                                     settings.seconds)
            point.images_per_s = rate = runs * batch / elapsed
            point.watts = _joules(source, start, time.monotonic(), 1.0) / (
                time.monotonic() - start)
        progress()
    return points


def _busy_s(snapshot: Snapshot, device: str) -> float:
    return sum(v for labels, v in snapshot.series("hetserve_device_busy_seconds_total").items()
               if dict(labels).get("device") == device)


def through_daemon(models: list[BenchModel], spec: DeviceSpec, source: PowerSource,
                   settings: TableSettings, rates: dict[tuple[str, int], float | None],
                   progress: Callable[[], None]) -> list[Point]:
    """One daemon serving every model on `spec`; `rates` (in-process images/s by model and
    batch) size each run and skip what in-process skipped."""
    points = []
    with tempfile.TemporaryDirectory(prefix="hetserve-bench-") as tmp:
        repository = write_repository(Path(tmp) / "models", models, str(spec),
                                      max(settings.batches))
        with local_daemon(repository, Path(tmp), "--power-sources", settings.power_sources,
                          "--power-model", settings.power_model) as daemon:
            for model in models:
                served = any(rates.get((model.name, b)) for b in settings.batches)
                interface = ModelInterface.fetch(daemon.address, model.name) if served else None
                for batch in settings.batches:
                    point = Point(model.name, spec.device, spec.engine, "daemon", batch,
                                  model.flops_per_image, power_source=source.source)
                    points.append(point)
                    rate = rates.get((model.name, batch))
                    if not rate or interface is None:
                        point.note = "skipped: not measured in-process"
                    else:
                        point.images_per_s, point.watts = _daemon_point(
                            daemon.address, daemon.metrics_url, interface, model, batch, rate,
                            spec.device, source, settings.seconds)
                    progress()
    return points


def _daemon_point(address: str, metrics_url: str, interface: ModelInterface,
                  model: BenchModel, batch: int, rate: float, device: str, source: PowerSource,
                  seconds: float) -> tuple[float, float]:
    """Images/s and watts of requests of `batch` images, two in flight, over about `seconds`
    (at least two requests)."""
    count = max(2, min(math.ceil(rate * seconds / batch),
                       _MAX_STAGED_BYTES // (model.images(1).nbytes * batch)))
    x = model.images(batch * count)
    infer(address, interface, x[:2 * batch], batch, 2)  # warm-up
    before, start = fetch(metrics_url), time.monotonic()
    infer(address, interface, x, batch, 2)
    end, after = time.monotonic(), fetch(metrics_url)
    utilization = (_busy_s(after, device) - _busy_s(before, device)) / (end - start)
    return len(x) / (end - start), _joules(source, start, end, utilization) / (end - start)


def run_table(models: list[BenchModel], specs: list[DeviceSpec], settings: TableSettings,
              progress: Callable[[], None] = lambda: None) -> list[Point]:
    """Every model on every device spec, in-process then (with settings.daemon) through a
    daemon; `progress()` is called after each point."""
    picker = SourcePicker(settings.power_sources, settings.power_model)
    points: list[Point] = []
    for spec in specs:
        source = picker.pick(Device(spec.device, spec.kind, spec.engine))
        local = []
        for model in models:
            try:
                local += in_process(model, spec, source, settings, progress)
            except Exception as e:  # a model this engine cannot run is a row, not the end
                local += [Point(model.name, spec.device, spec.engine, "in-process", b,
                                model.flops_per_image, note=f"failed: {e}")
                          for b in settings.batches]
                for _ in settings.batches:
                    progress()
        points += local
        if settings.daemon:
            rates = {(p.model, p.batch): p.images_per_s for p in local}
            points += through_daemon(models, spec, source, settings, rates, progress)
    return points
