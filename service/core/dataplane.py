"""The transport-neutral core of the daemon: validate, queue, batch, run, answer, drain."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from service.core.model import Shaped
from service.core.queue_policy import DEFAULT_OPTIONS, RequestOptions
from service.core.statistics import ModelStatistics
from service.core.types import Answer, Inputs, ServedModel, ServedModels
from service.errors import HetserveError, InvalidInputError, ModelUnavailableError


@dataclass(frozen=True)
class ModelState:
    name: str
    version: str
    state: str  # "READY" | "UNAVAILABLE"
    reason: str = ""


class DataPlane:
    def __init__(self, models: ServedModels, strict_readiness: bool = False) -> None:
        self.models = models
        self.ready = False  # true once models are loaded, false again while draining
        self._strict = strict_readiness
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def model(self, name: str, version: str = "") -> ServedModel:
        if not self.ready:
            raise ModelUnavailableError("the daemon is not serving (starting or draining)")
        return self.models.get(name, version)

    def server_ready(self) -> bool:
        """ServerReady, /v2/health/ready and health: serving, and with strict readiness every
        model asked for serves."""
        return self.ready and not (self._strict and self.models.failed())

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self.models.get(name, version)
        except HetserveError:
            return False
        return self.ready

    def check(self, model: ServedModel, inputs: Mapping[str, Shaped],
              requested_outputs: list[str]) -> tuple[list[str], int]:
        """Checks a request's inputs (their headers: names, datatypes, shapes; no value need be
        read) and outputs against the model, counting a refusal; returns the names of the
        outputs to reply with (`select` picks them from the answer) and the batch size."""
        start = time.monotonic()
        try:
            size = model.spec.validate(inputs)
            return model.spec.check_outputs(requested_outputs), size
        except BaseException:
            model.stats.fail.add(time.monotonic() - start)
            raise

    def enqueue(self, model: ServedModel, inputs: Inputs, size: int,
                options: RequestOptions = DEFAULT_OPTIONS, start: float | None = None,
                alone: bool = True) -> asyncio.Future[Answer]:
        """Queues a request validated already (by submit, or by a front-end process) and
        returns the future of its batch's answer, every output; `start` (time.monotonic()) is
        when its handling began; `alone` false says that others came with it."""
        if not self.ready:
            raise ModelUnavailableError("the daemon is not serving (starting or draining)")
        start = time.monotonic() if start is None else start
        try:
            answer = model.scheduler.enqueue(inputs, size, options, alone)
        except BaseException:
            model.stats.fail.add(time.monotonic() - start)
            raise
        self._in_flight += 1
        self._idle.clear()
        answer.add_done_callback(functools.partial(self._answered, model.stats, start))
        return answer

    def _answered(self, stats: ModelStatistics, start: float, answer: asyncio.Future) -> None:
        """Counts a queued request once it is answered, failed or cancelled (a client gone)."""
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()
        failed = answer.cancelled() or answer.exception() is not None
        (stats.fail if failed else stats.success).add(time.monotonic() - start)

    @property
    def in_flight(self) -> int:
        """Requests queued or running."""
        return self._in_flight

    async def drain(self, grace_s: float) -> bool:
        """Refuses new requests and waits for those in flight; false if the grace ran out."""
        self.ready = False
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            return False
        return True

    def statistics(self, name: str, version: str) -> Sequence[ServedModel]:
        """Every served model version when `name` is empty, else the one asked for."""
        return self.models.loaded() if not name else [self.models.get(name, version)]

    def index(self) -> list[ModelState]:
        states = [ModelState(m.spec.name, str(m.spec.version), "READY")
                  for m in self.models.loaded()]
        states += [ModelState(name, "", "UNAVAILABLE", reason)
                   for name, reason in self.models.failures.items()]
        return sorted(states, key=lambda s: (s.name, s.version))


def select(answer: Answer, names: list[str]) -> Answer:
    """The answer with only the outputs named, in that order."""
    if names == list(answer.outputs):
        return answer  # the common case: every output, in the model's order
    missing = [name for name in names if name not in answer.outputs]
    if missing:  # a version swapped in while the request waited lacks an output it asked for
        raise InvalidInputError(f"requested outputs {missing}: the model's version that ran "
                                f"has the outputs {list(answer.outputs)}")
    return Answer({name: answer.outputs[name] for name in names}, answer.device, answer.cost)
