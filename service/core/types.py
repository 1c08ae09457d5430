"""The core's vocabulary, shared by every room: tensors by name, a request's inputs (some read
only where their batch is assembled), a request's answer, and what the data plane needs of a
served model and of the table it looks models up in (the device owner's registry, or a
front-end's catalog of the owner's models)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2

from service.core.model import ModelSpec
from service.core.queue_policy import RequestOptions
from service.core.statistics import ModelStatistics

Tensors = dict[str, np.ndarray]  # tensors by name: a batch's inputs, a model's outputs


class DeferredTensor(Protocol):
    """An input whose bytes are read only where its batch is assembled, straight into the batch
    buffer: a region of a client's shared memory (service/edge/shared_memory.py)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def nbytes(self) -> int: ...

    def read_into(self, out: np.ndarray) -> None:
        """Fills `out` (contiguous, of this shape and dtype); InvalidInputError if the bytes
        are no longer there."""


Inputs = Mapping[str, "np.ndarray | DeferredTensor"]  # a request's inputs by name


@dataclass(frozen=True)
class Cost:
    """What running a batch, or a request's rows of it, took (replies tell clients)."""

    joules: float  # the device energy charged to it (accelerators/power/meter.py)
    source: str  # where the watts came from: a sensor's name, or `model` for an estimate
    flops: int
    # The op types the FLOP counter does not know, where the model has any: `flops` is then a
    # lower bound.
    flops_unknown_ops: tuple[str, ...] = ()

    @property
    def flops_partial(self) -> bool:
        return bool(self.flops_unknown_ops)

    def share(self, rows: int, of: int) -> Cost:
        """The part of a batch's cost that `rows` of its `of` rows caused; padding is shared by
        the rows that caused it."""
        return Cost(self.joules * rows / of, self.source, self.flops * rows // of,
                    self.flops_unknown_ops)


@dataclass(frozen=True)
class Answer:
    """A request's outputs, the device that ran them and what it cost."""

    outputs: Tensors
    device: str
    cost: Cost


# A batch's answer, or what it failed with (Answer None), called on the event loop's thread.
Finished = Callable[[Answer | None, BaseException | None], None]


class RequestQueue(Protocol):
    """What a served model takes requests through: its scheduler, in the device owner's process
    (service/core/scheduler.py) or a front-end's proxy of it."""

    def enqueue(self, inputs: Inputs, size: int, options: RequestOptions,
                alone: bool = True) -> asyncio.Future[Answer]:
        """Queues a request now (raising what refuses it); its answer's future. Cancelling the
        future withdraws the request. `alone` false says that others came with it."""
        ...


class ServedModel(Protocol):
    # Read-only here, so that a registry's own model types (with their own schedulers) fit.
    @property
    def spec(self) -> ModelSpec: ...

    @property
    def config(self) -> model_config_pb2.ModelConfig:  # the effective configuration
        ...

    @property
    def scheduler(self) -> RequestQueue: ...

    @property
    def stats(self) -> ModelStatistics: ...

    @property
    def generation(self) -> int:  # which load of the model this is (a reload makes a new one)
        ...


class ServedModels(Protocol):
    failures: dict[str, str]  # model name -> why it is not served

    def get(self, name: str, version: str = "") -> ServedModel:
        """The version asked for (the latest for ""); ModelNotFoundError otherwise."""
        ...

    def loaded(self) -> Sequence[ServedModel]:
        ...

    def failed(self) -> dict[str, str]:
        """Models asked for that serve no version, and why (service/core/model_table.py)."""
        ...


class ModelControls(Protocol):
    """RepositoryModelLoad / Unload, once the transport has checked the caller: the device
    owner's model control (service/core/model_control.py), or a front-end's way to it."""

    async def load(self, name: str, parameters: Sequence[str] = ()) -> None:
        ...

    async def unload(self, name: str) -> None:
        ...


def settle(future: asyncio.Future, result: object = None,
           error: BaseException | None = None) -> None:
    """Answers a future once: a late second answer (its caller gone, a scheduler closing) is
    dropped."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
