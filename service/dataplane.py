"""The transport-neutral core of the daemon: validate, queue, batch, run, answer, drain."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


from service.batcher import Answer
from service.errors import HetserveError, ModelUnavailableError
from service.queue_policy import DEFAULT_OPTIONS, RequestOptions
from service.registry import LoadedModel, ModelRegistry
from service.tensors import Tensors



@dataclass(frozen=True)
class ModelState:
    name: str
    version: str
    state: str  # "READY" | "UNAVAILABLE"
    reason: str = ""


class DataPlane:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.ready = False  # true once models are loaded, false again while draining
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def model(self, name: str, version: str = "") -> LoadedModel:
        if not self.ready:
            raise ModelUnavailableError("the daemon is not serving (starting or draining)")
        return self.registry.get(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.registry.get(name, version)
        except HetserveError:
            return False
        return self.ready

    async def infer(self, model: LoadedModel, inputs: Tensors, requested_outputs: list[str],
                    options: RequestOptions = DEFAULT_OPTIONS) -> Answer:
        if not self.ready:
            raise ModelUnavailableError("the daemon is not serving (starting or draining)")
        start = time.monotonic()
        self._in_flight += 1
        self._idle.clear()
        try:
            size = model.spec.validate(inputs)
            names = model.spec.check_outputs(requested_outputs)
            answer = await model.batcher.submit(inputs, size, options)
        except BaseException:  # errors and cancellations (a client gone) alike
            model.stats.fail.add(time.monotonic() - start)
            raise
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        model.stats.success.add(time.monotonic() - start)
        return Answer({name: answer.outputs[name] for name in names}, answer.device)

    async def drain(self, grace_s: float) -> bool:
        """Refuses new requests and waits for those in flight; false if the grace ran out."""
        self.ready = False
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            return False
        return True

    def statistics(self, name: str, version: str) -> list[LoadedModel]:
        """Every served model version when `name` is empty, else the one asked for."""
        return self.registry.loaded() if not name else [self.registry.get(name, version)]

    def index(self) -> list[ModelState]:
        states = [ModelState(m.spec.name, str(m.spec.version), "READY")
                  for m in self.registry.loaded()]
        states += [ModelState(name, "", "UNAVAILABLE", reason)
                   for name, reason in self.registry.failures.items()]
        return sorted(states, key=lambda s: (s.name, s.version))
