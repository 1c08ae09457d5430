"""Loaded models: each version with a device runner on every device of its `devices` parameter
that can run it, ranked by its policy, and a scheduler. A model that fails to load is kept as a
reason, reported by readiness and the index, and never takes others down.

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
from accelerators.engine_factory import DEFAULT_DEVICES, DeviceSpec, create_engine, parse_devices
from accelerators.engine_options import EngineOptions, OptionError
from accelerators.flops import FlopCounter
from accelerators.input_minimums import minimum_sizes
from service import contract
from service.core import buckets as batch_buckets
from service.core.batch_buffers import BatchBuffers
from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics
from service.core.model import ModelSpec
from service.core.model_table import UNLOADED, ModelTable
from service.core.power_budget import PowerBudget
from service.core.queue_policy import BatchPolicy
from service.core.ranking import POLICIES, PREFER_ORDERS, DeviceRanking
from service.core.repository import ModelRepository, RepositoryEntry, check_model_name
from service.core.scheduler import Scheduler
from service.core.statistics import ModelStatistics
from service.core.warmup import WarmupBatch, warmup_batches
from service.errors import ConfigError, ModelNotFoundError
from service.settings import Settings

log = logging.getLogger(__name__)
# Batches in flight per device. One: while a device runs a batch the next one grows, so a busy
# device gets the largest batches (with two, a small batch would follow every large one).
BATCHES_PER_DEVICE = 1
DEFAULT_LATENCY_BUDGET_MS = 100


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
        name = entry.name
        spec = ModelSpec.from_config(entry.config, version, entry.labels)
        routing = _parameter(spec, "policy", "prefer")
        if routing not in POLICIES:
            raise ConfigError(f"model {name!r}: parameters.policy: {routing!r} is unknown; "
                              f"expected one of {list(POLICIES)}")
        prefer_order = _parameter(spec, "prefer_order", "measured")
        if prefer_order not in PREFER_ORDERS:
            raise ConfigError(f"model {name!r}: parameters.prefer_order: {prefer_order!r} is "
                              f"unknown; expected one of {list(PREFER_ORDERS)}")
        budget_s = _budget_s(spec)
        buckets = batch_buckets.Buckets.from_config(spec.config)
        bucket_mode = batch_buckets.check_mode(name, _parameter(spec, "batch_buckets", "auto"))
        warmup = warmup_batches(spec, buckets, path.parent.parent)
        try:
            ort_options = EngineOptions.from_config(spec.config)
        except OptionError as e:
            raise ConfigError(f"model {name!r}: {e}") from e
        devices = _parameter(spec, "devices", DEFAULT_DEVICES)
        gpu_memory = await asyncio.to_thread(gpu_memory_used)
        shapes = _opencl_shapes(spec)
        engines = await asyncio.to_thread(self._engines, spec, path, devices, ort_options, shapes)
        batched = spec.max_batch_size > 0  # else a request, whatever its first dim, is a sample
        flops = await asyncio.to_thread(
            FlopCounter, path, {t.name: t.dims for t in spec.inputs}, batched)
        spec = replace(spec, minimums=await asyncio.to_thread(
            minimum_sizes, path, {t.name: t.dims for t in spec.inputs}, batched))

        def worker(instances: list[Engine]) -> DeviceRunner:
            bucketed = buckets if buckets and batch_buckets.enabled(
                bucket_mode, instances[0].device.kind) else None
            if ort_options.cuda_graphs and not bucketed and instances[0].device.kind == "gpu":
                raise ConfigError(f"model {name!r}: optimization.cuda.graphs needs fixed batch "
                                  "shapes: batch_buckets 'auto' or 'on' and max_batch_size > 0")
            for engine in instances if bucketed else ():
                if isinstance(engine, PlansPerShape):
                    assert bucketed is not None  # no engines to fix otherwise
                    try:
                        engine.fix_batch_sizes(bucketed.sizes)
                    except OptionError as e:
                        raise ConfigError(f"model {name!r}: {e}") from e
            return DeviceRunner(name, instances, self._metrics, flops, bucketed, str(version))

        # Off the event loop too: a worker's power meter may probe sensors (fpgainfo, sysfs).
        workers = await asyncio.to_thread(lambda: [worker(e) for e in engines])
        outputs = [o.name for o in spec.outputs]
        workers, warmup_s = await self._warm_up(spec, workers, warmup, outputs)
        _log_gpu_memory(spec, workers, gpu_memory)
        ranking = DeviceRanking(name, workers, routing, budget_s, outputs, self._metrics,
                                self._power_budget, prefer_order)
        policy = BatchPolicy.from_config(entry.config, self._settings.max_queue_size)
        slots = BATCHES_PER_DEVICE * sum(w.instances for w in workers)
        buffers = BatchBuffers({t.name: (t.dims, contract.served_dtype(t.datatype))
                                for t in spec.inputs}, spec.max_batch_size, slots)
        stats = ModelStatistics()
        scheduler = Scheduler(
            name, policy, ranking, outputs, slots, buffers, stats,
            self._metrics.queue_duration.labels(model=name, version=str(version)).observe,
            self._metrics.expired.labels(model=name, version=str(version)).inc,
            self._power_budget)
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(entry.config)
        policy.effective(config)
        config.parameters["devices"].string_value = ", ".join(
            f"{w.device.engine}:{w.device.name}" for w in workers)
        config.parameters["policy"].string_value = ranking.policy
        config.parameters["prefer_order"].string_value = ranking.prefer_order
        config.parameters["latency_budget_ms"].string_value = \
            f"{ranking.latency_budget_s * 1e3:g}"
        config.parameters["batch_buckets"].string_value = bucket_mode
        log.info("model %r version %d ready on %s (policy %s, instances %s, batch sizes %s, "
                 "warm-up %.2f s)", name, version, config.parameters["devices"].string_value,
                 ranking.policy, [w.instances for w in workers],
                 [list(w.buckets.sizes) if w.buckets else "any" for w in workers], warmup_s)
        return LoadedModel(spec, config, ranking, scheduler, stats, entry.stamps[version],
                           next(self._generations))

    async def _warm_up(self, spec: ModelSpec, workers: list[DeviceRunner],
                       batches: list[WarmupBatch], outputs: list[str],
                       ) -> tuple[list[DeviceRunner], float]:
        """Runs the warm-up on every worker's instances at once. A device that fails it is
        dropped, with one log line naming it and the cause, and the others serve; only when
        every device fails does the model fail. The devices that passed, and the seconds (also
        exported)."""
        started = time.perf_counter()
        results = await asyncio.gather(*(asyncio.to_thread(w.warm_up, batches, outputs)
                                         for w in workers), return_exceptions=True)
        failed = {w: r for w, r in zip(workers, results) if isinstance(r, Exception)}
        for worker, error in failed.items():
            worker.close()
            log.warning("model %r version %d: %s:%s failed its warm-up and is dropped: %s: %s",
                        spec.name, spec.version, worker.device.engine, worker.device.name,
                        type(error).__name__, error)
        if len(failed) == len(workers):
            raise ConfigError(f"model {spec.name!r} version {spec.version}: warm-up failed on "
                              "every device: " + "; ".join(
                                  f"{w.device.name}: {type(e).__name__}: {e}"
                                  for w, e in failed.items()))
        seconds = time.perf_counter() - started
        self._metrics.warmup_duration.labels(model=spec.name,
                                             version=str(spec.version)).set(seconds)
        return [w for w in workers if w not in failed], seconds

    def _engines(self, spec: ModelSpec, path: Path, text: str, ort_options: EngineOptions,
                 shapes: int | None) -> list[list[Engine]]:
        """The engine instances of every device of the model's `devices` parameter that can run
        it; each device that cannot is logged with its reason."""
        try:
            devices = _every_gpu(spec, parse_devices(text))
        except ValueError as e:
            raise ConfigError(f"model {spec.name!r}: parameters.devices: {e}") from e
        engines, reasons = [], []
        for device in devices:
            try:
                engines.append(self._instances(spec, device, path, ort_options, shapes))
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

    def _instances(self, spec: ModelSpec, device: DeviceSpec, path: Path,
                   ort_options: EngineOptions, shapes: int | None) -> list[Engine]:
        """instance_group's count of engines on one device. Unless --intra-op-threads says
        otherwise, several instances split the cores between them rather than each taking all."""
        def threads(count: int) -> int:
            return self._settings.intra_op_threads or (
                max(1, len(os.sched_getaffinity(0)) // count) if count > 1 else 0)

        guess = threads(spec.instances(device.kind))
        served = spec.served_dims()
        first = create_engine(device, path, guess, ort_options, served, shapes)
        _check_signature(spec, first)
        count = spec.instances(first.device.kind)
        # A device named without its kind ("onnxruntime") reveals the kind only now.
        engines = [first] if threads(count) == guess else []
        return engines + [create_engine(device, path, threads(count), ort_options, served,
                                        shapes) for _ in range(count - len(engines))]

    async def close(self) -> None:
        for lock in list(self._locks.values()):  # a load under way ends first; none after
            await lock.acquire()
        for model in self.loaded():
            await model.scheduler.close()
        self._models.clear()


def _parameter(spec: ModelSpec, key: str, default: str) -> str:
    param = spec.config.parameters.get(key)
    return param.string_value.strip() if param is not None else default


def _opencl_shapes(spec: ModelSpec) -> int | None:
    """parameters.opencl_shapes: the request shapes whose plans the OpenCL engine keeps for a
    model with variable dims; None: its default."""
    text = _parameter(spec, "opencl_shapes", "")
    if text and not (text.isdigit() and int(text) > 0):
        raise ConfigError(f"model {spec.name!r}: parameters.opencl_shapes: {text!r} is not a "
                          "positive number of request shapes")
    return int(text) if text else None


def _every_gpu(spec: ModelSpec, devices: list[DeviceSpec]) -> list[DeviceSpec]:
    """`onnxruntime` (its best device) becomes `onnxruntime:gpuN` for each GPU the model's
    instance_group allows (every GPU of the node by default) where the node has GPUs."""
    node_gpus = gpu_count()
    gpus = spec.gpus(node_gpus)  # checks the indexes even where no GPU is used
    out = []
    for device in devices:
        if device.engine == "onnxruntime" and not device.device and node_gpus:
            out += [DeviceSpec("onnxruntime", f"gpu{i}") for i in gpus]
        else:
            out.append(device)
    return out


def _log_gpu_memory(spec: ModelSpec, workers: list[DeviceRunner],
                    before: dict[str, int]) -> None:
    """The growth of each used GPU's memory over the model's load (engines and warm-up)."""
    after = gpu_memory_used()
    used = sorted({w.device.name for w in workers if w.device.kind == "gpu"} & set(before))
    grown = {gpu: (after.get(gpu, before[gpu]) - before[gpu]) / 2**20 for gpu in used}
    if grown:
        log.info("model %r version %d holds GPU memory (growth over its load): %s", spec.name,
                 spec.version, ", ".join(f"{gpu} {mib:.0f} MiB" for gpu, mib in grown.items()))


def _budget_s(spec: ModelSpec) -> float:
    text = _parameter(spec, "latency_budget_ms", str(DEFAULT_LATENCY_BUDGET_MS))
    try:
        budget = float(text)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        raise ConfigError(f"model {spec.name!r}: parameters.latency_budget_ms: {text!r} is not "
                          "a positive number of milliseconds")
    return budget / 1e3


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
