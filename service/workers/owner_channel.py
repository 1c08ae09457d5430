"""The private channel between a front-end process and the device owner, over a socketpair:
frames of typed messages (service/workers/messages.py), each with an optional binary payload.
Request tensors do not travel here: they lie in the front-end's arena (service/workers/arena.py)
and the message names their places; outputs (a few logits per sample) travel in the reply's
payload. Nothing from the network is unpickled."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import struct
from collections.abc import Callable
from typing import Generic, TypeVar, cast

import msgspec
import numpy as np

from service.core.dataplane import DataPlane
from service.core.queue_policy import RequestOptions
from service.core.types import Answer
from service.errors import status_of
from service.protocol import outputs
from service.workers import messages as msg
from service.workers.arena import Arena

_PREFIX = struct.Struct("<II")  # header bytes (the messages), payload bytes (theirs, in order)
log = logging.getLogger(__name__)
_encode = msgspec.msgpack.Encoder().encode
M = TypeVar("M")


class Channel(asyncio.Protocol, Generic[M]):
    """One end of the socketpair, receiving messages of type `M`. The messages sent in one
    event-loop iteration (the requests decoded meanwhile, the answers of a batch) leave as one
    frame, in one write and one encoding, and wake the other side once; each message received
    is handed to `on_message` with its payload as it is parsed, with no task per message. A
    frame that does not decode closes the channel: the other process is ours, so it is a bug
    there, and it is started again (service/workers/frontends.py)."""

    def __init__(self, kind: object, on_message: Callable[[M, memoryview], None]) -> None:
        """`kind`: M, a message type or a union of them, as msgspec decodes it."""
        # A type built at run time for msgspec, which mypy would read as an annotation.
        self._decode = msgspec.msgpack.Decoder(tuple[list[kind], list[int]]).decode  # type: ignore[valid-type]
        self._on_message = on_message
        self._received = bytearray()
        self._messages: list[msgspec.Struct] = []  # to send, with their payloads
        self._payloads: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self.in_frame = 0  # messages in the frame being handed to on_message

    @classmethod
    async def open(cls, sock: socket.socket, kind: object,
                   on_message: Callable[[M, memoryview], None]) -> Channel[M]:
        _, channel = await asyncio.get_running_loop().create_unix_connection(
            lambda: cls(kind, on_message), sock=sock)
        return channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a unix connection's

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def data_received(self, data: bytes) -> None:
        self._received += data
        buffer, at, frames = self._received, 0, []
        while len(buffer) - at >= _PREFIX.size:
            header_bytes, payload_bytes = _PREFIX.unpack_from(buffer, at)
            end = at + _PREFIX.size + header_bytes + payload_bytes
            if len(buffer) < end:
                break
            body = at + _PREFIX.size
            frames.append((bytes(buffer[body:body + header_bytes]),
                           bytes(buffer[body + header_bytes:end])))
            at = end
        del buffer[:at]
        for header, payload in frames:
            try:
                messages, sizes = self._decode(header)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.error("a frame from the other process does not decode (%s): closing", e)
                self.close()
                return
            view, start = memoryview(payload), 0
            self.in_frame = len(messages)
            for message, size in zip(messages, sizes, strict=True):
                self._on_message(message, view[start:start + size])
                start += size

    def send(self, message: msgspec.Struct, payload: bytes = b"") -> None:
        if self.closed.is_set() or self._transport is None:
            return
        if not self._messages:
            asyncio.get_running_loop().call_soon(self._flush)
        self._messages.append(message)
        self._payloads.append(payload)

    def _flush(self) -> None:
        if not self.closed.is_set():
            assert self._transport is not None  # send() queues nothing before it is
            sizes = [len(p) for p in self._payloads]
            header = _encode((self._messages, sizes))
            self._transport.write(b"".join(
                [_PREFIX.pack(len(header), sum(sizes)), header, *self._payloads]))
        self._messages, self._payloads = [], []

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def catalog(plane: DataPlane) -> tuple[msg.Catalog, bytes]:
    """The served models (their effective configs) and the failed ones, for front-ends."""
    models = plane.models.loaded()
    configs = [m.config.SerializeToString() for m in models]
    return (msg.Catalog([m.spec.version for m in models], [m.generation for m in models],
                        [len(c) for c in configs],
                        [{k: list(v) for k, v in m.spec.labels.items()} for m in models],
                        [m.spec.minimums for m in models],
                        plane.models.failures),
            b"".join(configs))


class OwnerSide:
    """Serves one front-end's requests on the owner's data plane; every Infer gets exactly one
    answer (Reply or Failed), also when cancelled, because the front-end frees the request's
    arena block only then."""

    def __init__(self, plane: DataPlane, inputs: Arena,
                 on_request: Callable[[OwnerSide, msg.ForDaemon], None]) -> None:
        self._plane, self._inputs = plane, inputs  # the front-end's arena
        # what a front-end asks of the whole daemon: a client's shared memory region
        # (un)registered there, a model to load or unload
        self._on_request = on_request
        self._answers: dict[int, asyncio.Future[Answer]] = {}
        self.listening = asyncio.Event()  # the front-end's gRPC server has started
        self.channel: Channel[msg.ToOwner]  # by open()

    def send(self, message: msgspec.Struct, payload: bytes = b"") -> None:
        self.channel.send(message, payload)

    async def open(self, sock: socket.socket) -> None:
        self.channel = await Channel.open(sock, msg.ToOwner, self._on_message)

    async def serve(self) -> None:
        """Until the front-end goes; its requests still queued or running are then withdrawn."""
        try:
            await self.channel.closed.wait()
        finally:
            for answer in list(self._answers.values()):
                answer.cancel()
            self.channel.close()

    def _on_message(self, message: msg.ToOwner, _: memoryview) -> None:
        match message:
            case msg.Infer():
                self._infer(message)
            case msg.Cancel(id=request_id) if request_id in self._answers:
                self._answers[request_id].cancel()
            case msg.Stats():
                self._statistics(message)
            case msg.Register() | msg.Unregister() | msg.Load() | msg.Unload():
                self._on_request(self, message)
            case msg.Listening():
                self.listening.set()

    def _infer(self, m: msg.Infer) -> None:
        """Queues the request now, validated by the front-end; `_reply` answers it when its
        batch is done (no task per request). Requests of one frame came together."""
        try:
            inputs = {name: np.frombuffer(self._inputs.view((offset, nbytes)), dtype).reshape(shape)
                      for name, dtype, shape, offset, nbytes in m.inputs}
            model = self._plane.model(m.model, str(m.version) if m.version else "")
            # A model reloaded since the front-end validated the request: checked again here,
            # so that it runs on the new version or is refused naming what is expected.
            size = m.size if model.generation == m.generation else model.spec.validate(inputs)
            answer = self._plane.enqueue(
                model, inputs, size, RequestOptions(m.priority, m.timeout_us, m.deadline,
                                                    m.caller, m.anonymous),
                alone=self.channel.in_frame == 1)
        except Exception as e:
            self.fail(m.id, e)
        else:
            self._answers[m.id] = answer
            answer.add_done_callback(functools.partial(self._reply, m.id))

    def _reply(self, request_id: int, answer: asyncio.Future[Answer]) -> None:
        del self._answers[request_id]
        if answer.cancelled():  # the client went away, or the owner stops
            self.send(msg.Failed(request_id, "CANCELLED", "the request was cancelled"))
        elif (e := answer.exception()) is not None:
            self.fail(request_id, e)
        else:
            result = answer.result()
            arrays = [np.ascontiguousarray(a) for a in result.outputs.values()]
            places = [(name, a.dtype.str, a.shape, a.nbytes)
                      for name, a in zip(result.outputs, arrays)]
            cost = result.cost
            self.send(msg.Reply(request_id, result.device, places, cost.joules, cost.source,
                                cost.flops, list(cost.flops_unknown_ops)),
                      # the one copy of them; numpy declares the buffer protocol from 3.12 on
                      b"".join(memoryview(a).cast("B")  # type: ignore[arg-type]
                               for a in arrays))

    def _statistics(self, m: msg.Stats) -> None:
        try:
            models = outputs.statistics_of(self._plane, m.name, m.version)
        except Exception as e:
            self.fail(m.id, e)
        else:
            self.send(msg.Statistics(m.id, models))

    def fail(self, request_id: int, error: BaseException) -> None:
        """A refused or failed request's answer; a bug's is logged, and still answered."""
        status, message = status_of(error, f"request {request_id} from a front-end")
        self.send(msg.Failed(request_id, status.name, message))
