"""A front-end's end of the channel to the device owner (service/owner_channel.py): the catalog
of served models that the front-end's data plane looks models up in, and, in place of each
model's batcher, a proxy that puts a request's inputs into the arena and hands it to the owner,
whose batcher forms batches across every front-end."""

from __future__ import annotations

import asyncio
import functools
import itertools
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2

from service.arena import Arena
from service.batcher import Answer
from service.errors import HetserveError, ModelUnavailableError, QueueFullError
from service.model import ModelSpec
from service.model_table import ModelTable
from service.owner_channel import Channel
from service.queue_policy import DEFAULT_OPTIONS, RequestOptions
from service.statistics import ModelStatistics
from service.tensors import Tensors


class OwnerClient:
    def __init__(self, arena: Arena, on_catalog: Callable[[dict, bytes], None],
                 on_share: Callable[[dict], None]) -> None:
        self._arena, self._on_catalog, self._on_share = arena, on_catalog, on_share
        self._ids = itertools.count()
        # request id -> its future, and its arena block (None for a statistics request)
        self._pending: dict[int, tuple[asyncio.Future, tuple[int, int] | None]] = {}
        self._channel: Channel | None = None
        self.first = asyncio.get_running_loop().create_future()  # the owner's first word

    async def open(self, sock: socket.socket) -> None:
        self._channel = await Channel.open(sock, self._on_frame)

    @property
    def gone(self) -> asyncio.Event:
        """Set once the owner has gone: the front-end stops."""
        return self._channel.closed

    def send(self, header: dict) -> None:
        self._channel.send(header)

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

    def _on_frame(self, header: dict, payload: bytes) -> None:
        """Matches answers to requests; the owner's state (loading, catalog) goes elsewhere."""
        op = header["op"]
        if op in ("register", "unregister") and "id" not in header:  # another front-end's
            self._on_share(header)
            return
        if op in ("loading", "catalog"):
            if not self.first.done():
                self.first.set_result(op)
            if op == "catalog":
                self._on_catalog(header, payload)
            return
        future, block = self._pending.pop(header["id"])
        if block is not None:
            self._arena.free(block)
        if future.done():  # cancelled meanwhile
            return
        if op == "error":
            error = HetserveError(header["message"])
            error.status = grpc.StatusCode[header["status"]]
            future.set_exception(error)
        elif op == "reply":
            future.set_result(_answer(header, payload))
        else:
            future.set_result(payload)

    def enqueue(self, name: str, version: int, inputs: Tensors,
                options: RequestOptions) -> asyncio.Future[Answer]:
        """Hands a request to the owner now; the future of its answer. Cancelling the future
        withdraws the request (the owner still answers, and only then is its block freed)."""
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
        for tensor, array in inputs.items():
            view[at:at + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            places.append([tensor, array.dtype.str, array.shape, block[0] + at, array.nbytes])
            at += array.nbytes
        request_id, future = self._request({"op": "infer", "model": name, "version": str(version),
                                "inputs": places, "priority": options.priority,
                                "timeout_us": options.timeout_us,
                                "deadline": options.deadline}, block)
        future.add_done_callback(functools.partial(self._withdraw, request_id))
        return future

    def _withdraw(self, request_id: int, future: asyncio.Future) -> None:
        if future.cancelled() and not self.gone.is_set():  # the client went
            self.send({"op": "cancel", "id": request_id})

    async def share(self, header: dict) -> None:
        """Passes a client's shared memory (un)registration on to every other front-end; done
        once the owner has sent it to each of them."""
        if self.gone.is_set():
            raise ModelUnavailableError("the daemon's device owner process has gone; retry")
        await self._request(header, None)[1]

    async def statistics(self, name: str, version: str) -> bytes:
        if self.gone.is_set():
            raise ModelUnavailableError("the daemon's device owner process has gone; retry")
        return await self._request({"op": "stats", "name": name, "version": version}, None)[1]

    def _request(self, header: dict, block: tuple[int, int] | None
                 ) -> tuple[int, asyncio.Future]:
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, block)
        self.send({**header, "id": request_id})
        return request_id, future


def _answer(header: dict, payload: bytes) -> Answer:
    outputs, start = {}, 0
    for name, dtype, shape, size in header["outputs"]:
        outputs[name] = np.frombuffer(payload, dtype, size // np.dtype(dtype).itemsize,
                                      start).reshape(shape)
        start += size
    return Answer(outputs, header["device"])


@dataclass
class RemoteModel:
    """What a front-end's data plane needs of a model: its spec and config, and a batcher."""

    spec: ModelSpec
    config: model_config_pb2.ModelConfig
    batcher: RemoteBatcher
    # Counted by the data plane here; ModelStatistics answers with the owner's counts.
    stats: ModelStatistics = field(default_factory=ModelStatistics)


@dataclass(frozen=True)
class RemoteBatcher:
    owner: OwnerClient
    spec: ModelSpec

    def enqueue(self, inputs: Tensors, size: int,
                options: RequestOptions = DEFAULT_OPTIONS) -> asyncio.Future[Answer]:
        return self.owner.enqueue(self.spec.name, self.spec.version, inputs, options)


class Catalog(ModelTable[RemoteModel]):
    """The owner's served models, as its catalog message lists them."""

    def update(self, owner: OwnerClient, header: dict, payload: bytes) -> None:
        models: dict[str, dict[int, RemoteModel]] = {}
        start = 0
        for version, size in header["models"]:
            config = model_config_pb2.ModelConfig.FromString(payload[start:start + size])
            start += size
            spec = ModelSpec.from_config(config, version)
            models.setdefault(spec.name, {})[version] = RemoteModel(
                spec, config, RemoteBatcher(owner, spec))
        self._models, self.failures = models, header["failures"]
