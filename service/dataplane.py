"""The transport-neutral core of the daemon: validate, queue, batch, run, answer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import HetserveError, ModelUnavailableError
from service.registry import LoadedModel, ModelRegistry

Tensors = dict[str, np.ndarray]


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

    def model(self, name: str, version: str = "") -> LoadedModel:
        return self.registry.get(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.registry.get(name, version)
        except HetserveError:
            return False
        return self.ready

    async def infer(self, model: LoadedModel, inputs: Tensors,
                    requested_outputs: list[str]) -> Tensors:
        if not self.ready:
            raise ModelUnavailableError("the daemon is not serving (starting or draining)")
        size = model.spec.validate(inputs)
        names = model.spec.check_outputs(requested_outputs)
        outputs = await model.batcher.submit(inputs, size)
        return {name: outputs[name] for name in names}

    def index(self) -> list[ModelState]:
        states = [ModelState(m.spec.name, str(m.spec.version), "READY")
                  for m in self.registry.loaded()]
        states += [ModelState(name, "", "UNAVAILABLE", reason)
                   for name, reason in self.registry.failures.items()]
        return sorted(states, key=lambda s: (s.name, s.version))
