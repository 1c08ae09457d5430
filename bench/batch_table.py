"""Images/s by batch size for each model on each device and engine of this node, run
in-process (the engine alone) and through a daemon (the same engine behind gRPC, tensors in
shared memory), with watts and where they come from, GFLOP/s per watt and joules per image.
The two paths alternate in slices at each batch size, so that the drift of a shared machine
hits both alike and their ratio holds.

Watts come from the device's power source as the daemon would pick it (accelerators/power:
a sensor, or the `model` estimate from idle and busy watts, which is labelled so). The
utilization that the estimate needs is measured: in-process the engine runs back to back (busy
all the time), through the daemon it is the daemon's busy-seconds counter over the run."""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from accelerators.engine import Device
from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.power.select import DEFAULT_MODEL_WATTS, SourcePicker
from accelerators.power.source import PowerSource
from bench.models import INPUT, OUTPUT, BenchModel, write_repository
from service.clients.top import Snapshot, fetch
from service.local_daemon import LocalDaemon, local_daemon
from spark_jobs.client import infer
from spark_jobs.interface import ModelInterface

BATCHES = (1, 8, 32, 64, 256)
_MAX_STAGED_BYTES = 1 << 30  # images staged per daemon slice
SLICES = 4  # per path and point, alternating


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
    seconds: float = 1.0  # per point and path, after one warm-up batch
    max_batch_s: float = 2.0  # skip a batch size expected to take longer than this per batch
    power_sources: str = ""
    power_model: str = DEFAULT_MODEL_WATTS
    daemon: bool = True


@dataclass
class _Total:
    images: int = 0
    seconds: float = 0.0
    joules: float = 0.0

    def add(self, images: int, start: float, end: float, joules: float) -> None:
        self.images += images
        self.seconds += end - start
        self.joules += joules

    def fill(self, point: Point) -> float:
        point.images_per_s, point.watts = (self.images / self.seconds,
                                           self.joules / self.seconds)
        return point.images_per_s


def _joules(source: PowerSource, start: float, end: float, utilization: float) -> float:
    """Energy between `start` and `end` (monotonic): the source sampled at both."""
    before = source.sample(start, 0.0).energy_j
    return source.sample(end, utilization).energy_j - before


def _busy_s(snapshot: Snapshot, device: str) -> float:
    return sum(v for labels, v in snapshot.series("hetserve_device_busy_seconds_total").items()
               if dict(labels).get("device") == device)


def _local_slice(run: Callable[[], None], batch: int, seconds: float, source: PowerSource,
                 total: _Total) -> None:
    """Back-to-back batches for `seconds` (at least one): the engine is busy throughout."""
    runs, start = 0, time.monotonic()
    while (end := time.monotonic()) - start < seconds or runs == 0:
        run()
        runs += 1
    total.add(runs * batch, start, end, _joules(source, start, end, 1.0))


def _daemon_slice(daemon: LocalDaemon, interface: ModelInterface, x: np.ndarray, batch: int,
                  device: str, source: PowerSource, total: _Total) -> None:
    """`x` in requests of `batch` images, two in flight; utilization from the daemon's
    busy-seconds counter."""
    before, start = fetch(daemon.metrics_url), time.monotonic()
    infer(daemon.address, interface, x, batch, 2)
    end, after = time.monotonic(), fetch(daemon.metrics_url)
    utilization = (_busy_s(after, device) - _busy_s(before, device)) / (end - start)
    total.add(len(x), start, end, _joules(source, start, end, utilization))


def _model_rows(model: BenchModel, spec: DeviceSpec, source: PowerSource,
                daemon: LocalDaemon | None, settings: TableSettings,
                progress: Callable[[], None]) -> list[Point]:
    paths = ("in-process", "daemon") if daemon else ("in-process",)
    rows = {(path, b): Point(model.name, spec.device, spec.engine, path, b,
                             model.flops_per_image, power_source=source.source)
            for path in paths for b in settings.batches}
    try:
        engine = create_engine(spec, model.path)
        interface = ModelInterface.fetch(daemon.address, model.name) if daemon else None
    except Exception as e:  # a model this engine cannot run is a row, not the end
        for point in rows.values():
            point.note = f"failed: {e}"
            progress()
        return list(rows.values())
    rate = 0.0  # the best images/s so far: what a larger batch is expected to reach
    for batch in settings.batches:
        local, remote = rows["in-process", batch], rows.get(("daemon", batch))
        if rate and batch / rate > settings.max_batch_s:
            for point in filter(None, (local, remote)):
                point.note = (f"skipped: about {batch / rate:.0f} s per batch "
                              "(over --max-batch-s)")
        else:
            x = model.images(batch)
            run = functools.partial(engine.run, {INPUT: x}, [OUTPUT])
            run()  # warm-up
            totals = (_Total(), _Total())
            for _ in range(SLICES):
                _local_slice(run, batch, settings.seconds / SLICES, source, totals[0])
                if remote is not None and not remote.note:
                    count = max(1, min(
                        math.ceil(totals[0].images / totals[0].seconds
                                  * settings.seconds / SLICES / batch),
                        _MAX_STAGED_BYTES // (x.nbytes or 1)))
                    try:
                        if not totals[1].images:  # warm-up
                            infer(daemon.address, interface, x, batch, 1)
                        _daemon_slice(daemon, interface, np.tile(x, (count,) + (1,) * (
                            x.ndim - 1)), batch, spec.device, source, totals[1])
                    except Exception as e:  # e.g. the daemon could not load the model
                        remote.note = f"failed: {e}"
            rate = max(rate, totals[0].fill(local))
            if remote is not None and not remote.note:
                totals[1].fill(remote)
        for _ in paths:
            progress()
    return list(rows.values())


@contextlib.contextmanager
def _daemon_for(spec: DeviceSpec, models: list[BenchModel],
                settings: TableSettings) -> Iterator[LocalDaemon | None]:
    """A daemon serving every model on `spec` alone, one instance, no dynamic batching (a
    request of N images is a batch of N); None without settings.daemon."""
    if not settings.daemon:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="hetserve-bench-") as tmp:
        repository = write_repository(Path(tmp) / "models", models, str(spec),
                                      max(settings.batches))
        with local_daemon(repository, Path(tmp), "--power-sources", settings.power_sources,
                          "--power-model", settings.power_model) as daemon:
            yield daemon


def run_table(models: list[BenchModel], specs: list[DeviceSpec], settings: TableSettings,
              progress: Callable[[], None] = lambda: None) -> list[Point]:
    """Every model on every device spec, in-process and (with settings.daemon) through a
    daemon; `progress()` is called after each point."""
    picker = SourcePicker(settings.power_sources, settings.power_model)
    points: list[Point] = []
    for spec in specs:
        source = picker.pick(Device(spec.device, spec.kind, spec.engine))
        with _daemon_for(spec, models, settings) as daemon:
            for model in models:
                points += _model_rows(model, spec, source, daemon, settings, progress)
    return points
