"""Loaded models: each version's settings (service/core/model_settings.py), a device runner on
every device of its `devices` parameter that can run it, ranked by its policy, and a scheduler.
A model that fails to load is kept as a reason, reported by readiness and the index, and never
takes others down.

Models load, reload and unload while the daemon serves (service/core/model_control.py says when).
A reload loads and warms the versions that are new or whose files changed while the others
serve; then they take traffic at once, and the versions they replace drain their queued
requests before their engines close. A load that fails leaves what served serving. Loads of one
model run one at a time."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from accelerators.devices import gpu_count, gpu_memory_used
from accelerators.engine import Engine, PlansPerShape
from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.engine_options import OptionError
from accelerators.flops import FlopCounter
from accelerators.input_minimums import minimum_sizes
from service import contract
from service.core.batch_buffers import BatchBuffers
from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics
from service.core.model import ModelSpec
from service.core.model_settings import ModelSettings
from service.core.model_table import UNLOADED, ModelTable
from service.core.power_budget import PowerBudget
from service.core.ranking import DeviceRanking
from service.core.repository import ModelRepository, RepositoryEntry, check_model_name
from service.core.scheduler import Scheduler
from service.core.statistics import ModelStatistics
from service.core.warmup import WarmupBatch
from service.errors import ConfigError, ModelNotFoundError
from service.settings import Settings

log = logging.getLogger(__name__)
# Batches in flight per device. One: while a device runs a batch the next one grows, so a busy
# device gets the largest batches (with two, a small batch would follow every large one).
BATCHES_PER_DEVICE = 1


@dataclass
class LoadedModel:
    spec: ModelSpec
    config: model_config_pb2.ModelConfig  # the effective configuration, defaults filled in
    ranking: DeviceRanking  # its devices (the scheduler consults it, and closes it)
    scheduler: Scheduler
    stats: ModelStatistics
    stamp: tuple  # what it was loaded from (RepositoryEntry.stamps): unchanged, it stays
    generation: int  # which load this is, so that front-ends can say what they validated against


class ModelRegistry(ModelTable[LoadedModel]):
    def __init__(self, settings: Settings, metrics: Metrics,
                 power_budget: PowerBudget | None = None) -> None:
        super().__init__()
        self._settings = settings
        self._metrics = metrics
        self._power_budget = power_budget
        self.repository = ModelRepository(settings.model_repository)
        self._locks: dict[str, asyncio.Lock] = {}
        self._generations = itertools.count(1)
        self.listeners: list[Callable[[], None]] = []  # told at once when what serves changed

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Loads every model of the repository, or those named; a failure is each model's own."""
        for name in self.repository.names() if names is None else names:
            try:
                await self.load(name)
            except Exception:  # logged and recorded by load
                pass

    async def load(self, name: str) -> None:
        """Loads model `name` as its folder is now, or reloads it (see the module's doc); raises
        why it failed, which is also logged and recorded for the index."""
        if not (self.repository.root / check_model_name(name)).is_dir():
            raise ModelNotFoundError(f"model_name {name!r}: no such folder in the model "
                                     f"repository; it holds {self.repository.names()}")
        async with self._locks.setdefault(name, asyncio.Lock()):
            current = self._models.get(name, {})
            try:
                entry = self.repository.load(name)
                kept = {v: m for v, m in current.items() if entry.stamps.get(v) == m.stamp}
                added = await self._load_versions(entry, kept)
            except Exception as e:
                self._failed(name, e, current)
                raise
            self._models[name] = dict(sorted({**kept, **added}.items()))
            self.failures.pop(name, None)
            await self._retire([m for v, m in current.items() if kept.get(v) is not m])

    async def unload(self, name: str) -> None:
        """Stops serving model `name`: its versions drain their queued requests and close."""
        check_model_name(name)
        async with self._locks.setdefault(name, asyncio.Lock()):
            versions = self._models.pop(name, None)
            if versions is None and name not in self.failures:
                return  # never loaded: nothing to do (as Triton answers)
            self.failures[name] = UNLOADED
            await self._retire(list((versions or {}).values()))

    async def _load_versions(self, entry: RepositoryEntry,
                             kept: dict[int, LoadedModel]) -> dict[int, LoadedModel]:
        added: dict[int, LoadedModel] = {}
        try:
            for version, path in entry.versions.items():
                if version not in kept:
                    added[version] = await self._load_version(entry, version, path)
        except BaseException:  # nothing of a load half done keeps running
            for model in added.values():
                await model.scheduler.close()
            raise
        return added

    def _failed(self, name: str, error: Exception, serving: dict[int, LoadedModel]) -> None:
        reason = str(error) if isinstance(error, ConfigError) else \
            f"{type(error).__name__}: {error}"
        if serving:
            reason += f" (versions {sorted(serving)} still serve)"
        self.failures[name] = reason
        self._tell()  # front-ends' indexes and strict readiness see it
        if isinstance(error, ConfigError):
            log.error("model %r not loaded: %s", name, reason)
        else:  # any failure of one model (a sensor, a graph) is its own
            log.exception("model %r not loaded", name)

    def _tell(self) -> None:
        for listener in self.listeners:
            listener()

    async def _retire(self, models: list[LoadedModel]) -> None:
        """Tells the listeners what serves now, then lets the versions that no longer serve
        finish what they hold (within the shutdown grace), and closes them."""
        self._tell()

        async def retire(model: LoadedModel) -> None:
            if not await model.scheduler.drain(self._settings.shutdown_grace_s):
                log.warning("model %r version %d: requests still queued after %.1f s are "
                            "refused", model.spec.name, model.spec.version,
                            self._settings.shutdown_grace_s)
            await model.scheduler.close()
            log.info("model %r version %d unloaded", model.spec.name, model.spec.version)
        # Shielded: a caller that goes meanwhile (a client's deadline) leaves no engine open.
        await asyncio.shield(asyncio.gather(*(retire(m) for m in models)))

    async def _load_version(self, entry: RepositoryEntry, version: int,
                            path: Path) -> LoadedModel:
        # Off the event loop: the warm-up data files are read, the GPUs counted.
        settings = await asyncio.to_thread(lambda: ModelSettings.parse(
            entry.config, version, path.parent.parent, labels=entry.labels,
            max_queue_size=self._settings.max_queue_size, node_gpus=gpu_count()))
        spec, name = settings.spec, entry.name
        gpu_memory = await asyncio.to_thread(gpu_memory_used)
        engines = await asyncio.to_thread(self._engines, settings, path)
        batched = spec.max_batch_size > 0  # else a request, whatever its first dim, is a sample
        served = {t.name: t.dims for t in spec.inputs}
        flops = await asyncio.to_thread(FlopCounter, path, served, batched)
        # One spec from here on: the settings' own, with the inputs' minimum sizes.
        settings = replace(settings, spec=replace(spec, minimums=await asyncio.to_thread(
            minimum_sizes, path, served, batched)))
        spec = settings.spec
        # Off the event loop too: a runner's power meter may probe sensors (fpgainfo, sysfs).
        runners = await asyncio.to_thread(
            lambda: [self._runner(settings, instances, flops) for instances in engines])
        outputs = [o.name for o in spec.outputs]
        runners, warmup_s = await self._warm_up(spec, runners, list(settings.warmup), outputs)
        _log_gpu_memory(spec, runners, gpu_memory)
        place = settings.placement
        ranking = DeviceRanking(name, runners, place.policy, place.latency_budget_s, outputs,
                                self._metrics, self._power_budget, place.prefer_order)
        slots = BATCHES_PER_DEVICE * sum(r.instances for r in runners)
        buffers = BatchBuffers({t.name: (t.dims, contract.served_dtype(t.datatype))
                                for t in spec.inputs}, spec.max_batch_size, slots)
        stats = ModelStatistics()
        scheduler = Scheduler(
            name, settings.batching, ranking, outputs, slots, buffers, stats,
            self._metrics.queue_duration.labels(model=name, version=str(version)).observe,
            self._metrics.expired.labels(model=name, version=str(version)).inc,
            self._power_budget)
        devices = [f"{r.device.engine}:{r.device.name}" for r in runners]
        log.info("model %r version %d ready on %s (policy %s, instances %s, batch sizes %s, "
                 "warm-up %.2f s)", name, version, ", ".join(devices), place.policy,
                 [r.instances for r in runners],
                 [list(r.buckets.sizes) if r.buckets else "any" for r in runners], warmup_s)
        return LoadedModel(spec, settings.effective_config(devices), ranking, scheduler, stats,
                           entry.stamps[version], next(self._generations))

    def _runner(self, settings: ModelSettings, instances: list[Engine],
                flops: FlopCounter) -> DeviceRunner:
        """The device runner of one device's engine instances, their plans fixed to its buckets
        where it batches by buckets."""
        name = settings.spec.name
        bucketed = settings.buckets_for(instances[0].device.kind)
        for engine in instances if bucketed else ():
            if isinstance(engine, PlansPerShape):
                assert bucketed is not None  # no engines to fix otherwise
                try:
                    engine.fix_batch_sizes(bucketed.sizes)
                except OptionError as e:
                    raise ConfigError(f"model {name!r}: {e}") from e
        return DeviceRunner(name, instances, self._metrics, flops, bucketed,
                            str(settings.spec.version))

    async def _warm_up(self, spec: ModelSpec, runners: list[DeviceRunner],
                       batches: list[WarmupBatch], outputs: list[str],
                       ) -> tuple[list[DeviceRunner], float]:
        """Runs the warm-up on every device runner's instances at once. A device that fails it is
        dropped, with one log line naming it and the cause, and the others serve; only when
        every device fails does the model fail. The devices that passed, and the seconds (also
        exported)."""
        started = time.perf_counter()
        results = await asyncio.gather(*(asyncio.to_thread(w.warm_up, batches, outputs)
                                         for w in runners), return_exceptions=True)
        failed = {w: r for w, r in zip(runners, results) if isinstance(r, Exception)}
        for runner, error in failed.items():
            runner.close()
            log.warning("model %r version %d: %s:%s failed its warm-up and is dropped: %s: %s",
                        spec.name, spec.version, runner.device.engine, runner.device.name,
                        type(error).__name__, error)
        if len(failed) == len(runners):
            raise ConfigError(f"model {spec.name!r} version {spec.version}: warm-up failed on "
                              "every device: " + "; ".join(
                                  f"{w.device.name}: {type(e).__name__}: {e}"
                                  for w, e in failed.items()))
        seconds = time.perf_counter() - started
        self._metrics.warmup_duration.labels(model=spec.name,
                                             version=str(spec.version)).set(seconds)
        return [w for w in runners if w not in failed], seconds

    def _engines(self, settings: ModelSettings, path: Path) -> list[list[Engine]]:
        """The engine instances of every device of the model's `devices` parameter that can run
        it; each device that cannot is logged with its reason."""
        spec = settings.spec
        engines, reasons = [], []
        for device in settings.placement.devices:
            try:
                engines.append(self._instances(settings, device, path))
                continue
            except OptionError as e:  # the config asks for what this node cannot give
                raise ConfigError(f"model {spec.name!r}: {e}") from e
            except ConfigError as e:
                reasons.append(str(e))
            except Exception as e:  # engines raise their own types for models they cannot run
                reasons.append(f"{device}: {e}")
            log.warning("model %r version %d cannot run on %s: %s", spec.name, spec.version,
                        device, reasons[-1])
        if not engines:
            raise ConfigError(f"model {spec.name!r} version {spec.version}: no device can run "
                              f"{path}: " + "; ".join(reasons))
        return engines

    def _instances(self, settings: ModelSettings, device: DeviceSpec,
                   path: Path) -> list[Engine]:
        """instance_group's count of engines on one device. Unless --intra-op-threads says
        otherwise, several instances split the cores between them rather than each taking all."""
        def threads(count: int) -> int:
            return self._settings.intra_op_threads or (
                max(1, len(os.sched_getaffinity(0)) // count) if count > 1 else 0)

        spec, options, shapes = settings.spec, settings.engine, settings.opencl_shapes
        guess = threads(settings.placement.instances.count(device.kind))
        served = spec.served_dims()
        first = create_engine(device, path, guess, options, served, shapes)
        _check_signature(spec, first)
        count = settings.placement.instances.count(first.device.kind)
        # A device named without its kind ("onnxruntime") reveals the kind only now.
        engines = [first] if threads(count) == guess else []
        return engines + [create_engine(device, path, threads(count), options, served, shapes)
                          for _ in range(count - len(engines))]

    async def close(self) -> None:
        for lock in list(self._locks.values()):  # a load under way ends first; none after
            await lock.acquire()
        for model in self.loaded():
            await model.scheduler.close()
        self._models.clear()


def _log_gpu_memory(spec: ModelSpec, runners: list[DeviceRunner],
                    before: dict[str, int]) -> None:
    """The growth of each used GPU's memory over the model's load (engines and warm-up)."""
    after = gpu_memory_used()
    used = sorted({w.device.name for w in runners if w.device.kind == "gpu"} & set(before))
    grown = {gpu: (after.get(gpu, before[gpu]) - before[gpu]) / 2**20 for gpu in used}
    if grown:
        log.info("model %r version %d holds GPU memory (growth over its load): %s", spec.name,
                 spec.version, ", ".join(f"{gpu} {mib:.0f} MiB" for gpu, mib in grown.items()))


def _check_signature(spec: ModelSpec, engine: Engine) -> None:
    """config.pbtxt must describe the ONNX graph it serves: same names, datatypes, shapes."""
    for side, declared, actual in (("input", spec.inputs, engine.inputs),
                                   ("output", spec.outputs, engine.outputs)):
        graph = {t.name: t for t in actual}
        for t in declared:
            g = graph.get(t.name)
            if g is None:
                raise ConfigError(f"model {spec.name!r}: config {side} {t.name!r} is not in the "
                                  f"ONNX graph, whose {side}s are {sorted(graph)}")
            want = spec.shape_with_batch(t)
            if g.datatype != t.datatype or len(g.shape) != len(want) or any(
                    a != -1 and b != -1 and a != b for a, b in zip(g.shape, want)):
                raise ConfigError(
                    f"model {spec.name!r}: config {side} {t.name!r} is {t.datatype} {want}, "
                    f"the ONNX graph has {g.datatype} {list(g.shape)}")
