"""Loaded models: each version with its engine, device worker and batcher. A model that fails to
load is kept as a reason, reported by readiness and the index, and never takes others down."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from accelerators.engine import Engine
from accelerators.engines import DEFAULT_DEVICES, create_engine, parse_devices
from accelerators.flops import count_flops
from service.batcher import BatchPolicy, DynamicBatcher
from service.errors import ConfigError, ModelNotFoundError
from service.metrics import Metrics
from service.model import ModelSpec
from service.repository import ModelRepository, check_model_name
from service.settings import Settings
from service.worker import DeviceWorker

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    spec: ModelSpec
    worker: DeviceWorker
    batcher: DynamicBatcher


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._repository = ModelRepository(settings.model_repository)
        self._models: dict[str, dict[int, LoadedModel]] = {}
        self.failures: dict[str, str] = {}  # model name -> why it is not served

    async def load_all(self) -> None:
        for name in self._repository.names():
            try:
                await self._load(name)
            except ConfigError as e:
                self.failures[name] = str(e)
                log.error("model %r not served: %s", name, e)

    async def _load(self, name: str) -> None:
        entry = self._repository.load(name)
        versions: dict[int, LoadedModel] = {}
        for version, path in entry.versions.items():
            spec = ModelSpec.from_config(entry.config, version)
            engine = await asyncio.to_thread(self._first_engine, spec, path)
            flops = await asyncio.to_thread(count_flops, path)
            worker = DeviceWorker(name, engine, self._metrics, flops.total)
            queue_s = self._metrics.queue_duration.labels(model=name)
            batcher = DynamicBatcher(
                name, BatchPolicy.from_config(entry.config, self._settings.max_queue_size),
                lambda inputs, size, w=worker, s=spec: w.run(
                    inputs, [o.name for o in s.outputs], size),
                queue_s.observe)
            versions[version] = LoadedModel(spec, worker, batcher)
            log.info("model %r version %d ready on %s", name, version, engine.device.name)
        self._models[name] = versions

    def _first_engine(self, spec: ModelSpec, path: Path) -> Engine:
        """The first device of the model's `devices` parameter that can run it."""
        param = spec.config.parameters.get("devices")
        text = param.string_value if param is not None else DEFAULT_DEVICES
        try:
            devices = parse_devices(text)
        except ValueError as e:
            raise ConfigError(f"model {spec.name!r}: parameters.devices: {e}") from e
        reasons = []
        for device in devices:
            try:
                engine = create_engine(device, path, self._settings.intra_op_threads)
                _check_signature(spec, engine)
                return engine
            except ConfigError as e:
                reasons.append(str(e))
            except Exception as e:  # engines raise their own types for models they cannot run
                reasons.append(f"{device}: {e}")
            log.warning("model %r version %d cannot run on %s: %s", spec.name, spec.version,
                        device, reasons[-1])
        raise ConfigError(f"model {spec.name!r} version {spec.version}: no device can run "
                          f"{path}: " + "; ".join(reasons))

    def get(self, name: str, version: str = "") -> LoadedModel:
        versions = self._models.get(check_model_name(name))
        if versions is None:
            reason = self.failures.get(name)
            raise ModelNotFoundError(f"model_name {name!r}: " + (
                f"failed to load: {reason}" if reason else
                f"no such model; serving {sorted(self._models)}"))
        if not version:
            return versions[max(versions)]
        if not version.isdigit() or int(version) not in versions:
            raise ModelNotFoundError(f"model_version {version!r} of model {name!r} is not "
                                     f"served; versions are {sorted(versions)}")
        return versions[int(version)]

    def loaded(self) -> list[LoadedModel]:
        return [m for versions in self._models.values() for m in versions.values()]

    async def close(self) -> None:
        for model in self.loaded():
            await model.batcher.close()
            model.worker.close()
        self._models.clear()


def _check_signature(spec: ModelSpec, engine: Engine) -> None:
    """config.pbtxt must describe the ONNX graph it serves: same names, datatypes, shapes."""
    lead = [-1] if spec.max_batch_size > 0 else []
    for side, declared, actual in (("input", spec.inputs, engine.inputs),
                                   ("output", spec.outputs, engine.outputs)):
        graph = {t.name: t for t in actual}
        for t in declared:
            g = graph.get(t.name)
            if g is None:
                raise ConfigError(f"model {spec.name!r}: config {side} {t.name!r} is not in the "
                                  f"ONNX graph, whose {side}s are {sorted(graph)}")
            want = lead + list(t.dims)
            if g.datatype != t.datatype or len(g.shape) != len(want) or any(
                    a != -1 and b != -1 and a != b for a, b in zip(g.shape, want)):
                raise ConfigError(
                    f"model {spec.name!r}: config {side} {t.name!r} is {t.datatype} {want}, "
                    f"the ONNX graph has {g.datatype} {list(g.shape)}")
