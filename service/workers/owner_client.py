"""A front-end's end of the channel to the device owner (service/workers/owner_channel.py): the
catalog of served models that the front-end's data plane looks models up in, and, in place of each
model's scheduler, a proxy that puts a request's inputs into the arena and hands it to the owner,
whose scheduler forms batches across every front-end."""

from __future__ import annotations

import asyncio
import functools
import itertools
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2

from service.core.model import ModelSpec
from service.core.model_table import ModelTable
from service.core.queue_policy import DEFAULT_OPTIONS, RequestOptions
from service.core.statistics import ModelStatistics
from service.core.types import Answer, Cost, Inputs
from service.edge.shared_memory import Caller
from service.errors import ModelUnavailableError, QueueFullError, Status, StatusError
from service.protocol import types as protocol
from service.workers import messages as msg
from service.workers.arena import Arena
from service.workers.owner_channel import Channel


class OwnerClient:
    def __init__(self, arena: Arena, on_catalog: Callable[[msg.Catalog, memoryview], None],
                 on_share: Callable[[msg.Registered | msg.Released], None]) -> None:
        self._arena, self._on_catalog, self._on_share = arena, on_catalog, on_share
        self._ids = itertools.count()
        # request id -> its future, and its arena block (None for a request without inputs)
        self._pending: dict[int, tuple[asyncio.Future, tuple[int, int] | None]] = {}
        self._channel: Channel[msg.ToFrontend]  # by open()
        self.first = asyncio.get_running_loop().create_future()  # the owner's first word

    async def open(self, sock: socket.socket) -> None:
        self._channel = await Channel.open(sock, msg.ToFrontend, self._on_message)

    @property
    def gone(self) -> asyncio.Event:
        """Set once the owner has gone: the front-end stops."""
        return self._channel.closed

    def send(self, message: msg.ToOwner) -> None:
        self._channel.send(message)

    async def run(self) -> None:
        """Until the owner goes; then every request waiting fails UNAVAILABLE, so that clients
        retry elsewhere."""
        try:
            await self.gone.wait()
        finally:
            for future, _ in self._pending.values():
                if not future.done():
                    future.set_exception(ModelUnavailableError(
                        "the daemon's device owner process has gone; retry"))
            self._pending.clear()

    def _on_message(self, message: msg.ToFrontend, payload: memoryview) -> None:
        """Matches answers to requests; the owner's state (loading, catalog, regions registered
        elsewhere) goes to the front-end."""
        match message:
            case msg.Registered() | msg.Released():
                self._on_share(message)
                return
            case msg.Loading() | msg.Catalog():
                if not self.first.done():
                    self.first.set_result(message)
                if isinstance(message, msg.Catalog):
                    self._on_catalog(message, payload)
                return
        future, block = self._pending.pop(message.id)
        if block is not None:
            self._arena.free(block)
        if future.done():  # cancelled meanwhile
            return
        match message:
            case msg.Failed(status=status, message=text):
                future.set_exception(StatusError(Status[status], text))
            case msg.Reply():
                future.set_result(_answer(message, payload))
            case msg.Statistics(models=models):
                future.set_result(models)
            case msg.Done():
                future.set_result(None)

    def enqueue(self, name: str, version: int, generation: int, inputs: Inputs, size: int,
                options: RequestOptions) -> asyncio.Future[Answer]:
        """Hands a validated request to the owner now; the future of its answer. Cancelling the
        future withdraws the request (the owner still answers, and only then is its block
        freed)."""
        if self.gone.is_set():
            raise ModelUnavailableError("the daemon's device owner process has gone; retry")
        nbytes = sum(a.nbytes for a in inputs.values())
        block = self._arena.alloc(nbytes)
        if block is None:
            raise QueueFullError(
                f"inputs of {nbytes} bytes: this front-end's shared memory arena of "
                f"{self._arena.size} bytes is " + (
                    "too full now; retry later" if nbytes <= self._arena.size else
                    "smaller; send smaller requests, or serve with --workers 1"))
        places, view, at = [], self._arena.view(block), 0
        try:
            for tensor, array in inputs.items():
                # A client's shared memory is read straight into the arena.
                into = np.ndarray(array.shape, array.dtype, buffer=view, offset=at)
                if isinstance(array, np.ndarray):
                    into[...] = array
                else:
                    array.read_into(into)
                places.append((tensor, array.dtype.str, array.shape, block[0] + at,
                               array.nbytes))
                at += array.nbytes
        except BaseException:
            self._arena.free(block)
            raise
        request_id, future = self._request(lambda i: msg.Infer(
            i, name, version, generation, size, places, options.priority, options.timeout_us,
            options.deadline, options.caller, options.anonymous), block)
        future.add_done_callback(functools.partial(self._withdraw, request_id))
        return future

    def _withdraw(self, request_id: int, future: asyncio.Future) -> None:
        if future.cancelled() and not self.gone.is_set():  # the client went
            self.send(msg.Cancel(request_id))

    async def register(self, name: str, key: str, offset: int, byte_size: int,
                       caller: Caller) -> None:
        """Has the owner reserve a client's region name (raising why not) and pass the region
        on to every other front-end; done once each of them has it."""
        await self._ask(lambda i: msg.Register(i, name, key, offset, byte_size, caller.name,
                                               caller.uid, caller.gids))

    async def unregister(self, name: str, caller: Caller) -> None:
        """The same for a client's release of its region `name` (every one for "")."""
        await self._ask(lambda i: msg.Unregister(i, name, caller.name))

    async def load(self, name: str, parameters: Sequence[str] = ()) -> None:
        """Has the owner load or reload model `name`; done once every front-end has been sent
        the new catalog (this one has it then)."""
        await self._ask(lambda i: msg.Load(i, name, list(parameters)))

    async def unload(self, name: str) -> None:
        await self._ask(lambda i: msg.Unload(i, name))

    async def statistics(self, name: str, version: str) -> list[protocol.ModelStatistics]:
        return await self._ask(lambda i: msg.Stats(i, name, version))

    async def _ask(self, message: Callable[[int], msg.ToOwner]):
        if self.gone.is_set():
            raise ModelUnavailableError("the daemon's device owner process has gone; retry")
        return await self._request(message, None)[1]

    def _request(self, message: Callable[[int], msg.ToOwner], block: tuple[int, int] | None
                 ) -> tuple[int, asyncio.Future]:
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, block)
        self.send(message(request_id))
        return request_id, future


def _answer(reply: msg.Reply, payload: memoryview) -> Answer:
    outputs, start = {}, 0
    for name, dtype, shape, size in reply.outputs:
        outputs[name] = np.frombuffer(payload, dtype, size // np.dtype(dtype).itemsize,
                                      start).reshape(shape)
        start += size
    return Answer(outputs, reply.device, Cost(reply.joules, reply.power_source, reply.flops,
                                              tuple(reply.flops_unknown_ops)))


@dataclass
class RemoteModel:
    """What a front-end's data plane needs of a model: its spec and config, and a scheduler."""

    spec: ModelSpec
    config: model_config_pb2.ModelConfig
    scheduler: RemoteScheduler
    generation: int
    # Counted by the data plane here; ModelStatistics answers with the owner's counts.
    stats: ModelStatistics = field(default_factory=ModelStatistics)


@dataclass(frozen=True)
class RemoteScheduler:
    owner: OwnerClient
    spec: ModelSpec
    version: int  # as the owner is asked for it: 0 for the latest
    generation: int

    def enqueue(self, inputs: Inputs, size: int, options: RequestOptions = DEFAULT_OPTIONS,
                alone: bool = True) -> asyncio.Future[Answer]:
        """Hands the request to the owner, which sees for itself what comes together (its
        frames)."""
        return self.owner.enqueue(self.spec.name, self.version, self.generation, inputs, size,
                                  options)


class Catalog(ModelTable[RemoteModel]):
    """The owner's served models, as its latest catalog message lists them. A request for a
    model's latest version asks the owner for the latest, whichever it is by then: a version
    swapped in meanwhile serves it (the owner checks it against the new version)."""

    def __init__(self) -> None:
        super().__init__()
        self._latest: dict[str, RemoteModel] = {}

    def get(self, name: str, version: str = "") -> RemoteModel:
        model = super().get(name, version)
        return model if version else self._latest[name]

    def update(self, owner: OwnerClient, catalog: msg.Catalog, payload: memoryview) -> None:
        models: dict[str, dict[int, RemoteModel]] = {}
        start = 0
        for version, generation, size, labels, minimums in zip(
                catalog.versions, catalog.generations, catalog.sizes, catalog.labels,
                catalog.minimums, strict=True):
            config = model_config_pb2.ModelConfig.FromString(bytes(payload[start:start + size]))
            start += size
            spec = ModelSpec.from_config(config, version,
                                         {k: tuple(v) for k, v in labels.items()}, minimums)
            models.setdefault(spec.name, {})[version] = RemoteModel(
                spec, config, RemoteScheduler(owner, spec, version, generation), generation)
        latest = {name: versions[max(versions)] for name, versions in models.items()}
        self._latest = {name: RemoteModel(m.spec, m.config, RemoteScheduler(
            owner, m.spec, 0, m.generation), m.generation) for name, m in latest.items()}
        self._models, self.failures = models, catalog.failures
