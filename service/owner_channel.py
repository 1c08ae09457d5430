"""The private channel between a front-end process and the device owner, over a socketpair:
frames of a JSON header and an optional binary payload. Request tensors do not travel here: they
lie in the front-end's arena (service/arena.py) and the header names their places; outputs (a few
logits per sample) travel in the reply's payload. Nothing from the network is unpickled.

front-end -> owner: infer, cancel, stats, listening, register and unregister (a client's system
shared memory region: the owner reserves or releases its name and passes it on to every other
front-end).
owner -> front-end: loading or catalog (first, then catalog once models are loaded), reply,
error (a status name and message), stats (ModelStatisticsResponse bytes), shared (a region
passed on), register and unregister (from another front-end)."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import struct
from collections.abc import Callable

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from service.arena import Arena
from service.batcher import Answer
from service.dataplane import DataPlane, select
from service.errors import HetserveError
from service.handlers import status_of
from service.queue_policy import RequestOptions

_PREFIX = struct.Struct("<II")  # header bytes, payload bytes


class Channel(asyncio.Protocol):
    """One end of the socketpair. Frames sent in one event-loop iteration leave in one write
    (the answers of a batch, the requests decoded meanwhile); each frame received is handed to
    `on_frame` as it is parsed, with no task or coroutine per frame."""

    def __init__(self, on_frame: Callable[[dict, bytes], None]) -> None:
        self._on_frame = on_frame
        self._received = bytearray()
        self._outgoing: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, sock: socket.socket, on_frame: Callable[[dict, bytes], None]) -> Channel:
        _, channel = await asyncio.get_running_loop().create_unix_connection(
            lambda: cls(on_frame), sock=sock)
        return channel

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def data_received(self, data: bytes) -> None:
        self._received += data
        buffer, at = self._received, 0
        while len(buffer) - at >= _PREFIX.size:
            header_bytes, payload_bytes = _PREFIX.unpack_from(buffer, at)
            end = at + _PREFIX.size + header_bytes + payload_bytes
            if len(buffer) < end:
                break
            body = at + _PREFIX.size
            header = json.loads(buffer[body:body + header_bytes])
            payload = bytes(buffer[body + header_bytes:end])
            at = end
            self._on_frame(header, payload)
        del buffer[:at]

    def send(self, header: dict, payload: bytes = b"") -> None:
        if self.closed.is_set() or self._transport is None:
            return
        data = json.dumps(header, separators=(",", ":")).encode()
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing += (_PREFIX.pack(len(data), len(payload)), data, payload)

    def _flush(self) -> None:
        if not self.closed.is_set():
            self._transport.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def catalog(plane: DataPlane) -> tuple[dict, bytes]:
    """The served models (their effective configs) and the failed ones, for front-ends."""
    models = plane.registry.loaded()
    configs = [m.config.SerializeToString() for m in models]
    return ({"op": "catalog", "models": [[m.spec.version, len(c)] for m, c in zip(models, configs)],
             "failures": plane.registry.failures}, b"".join(configs))


class OwnerSide:
    """Serves one front-end's requests on the owner's data plane; every infer gets exactly one
    answer (reply or error), also when cancelled, because the front-end frees the request's
    arena block only then."""

    def __init__(self, plane: DataPlane, inputs: Arena,
                 on_share: Callable[[OwnerSide, dict], None]) -> None:
        self._plane, self._inputs = plane, inputs  # the front-end's arena
        self._on_share = on_share  # a client's shared memory (un)registered at this front-end
        self._answers: dict[int, asyncio.Future[Answer]] = {}
        self.listening = asyncio.Event()  # the front-end's gRPC server has started
        self.channel: Channel | None = None

    def send(self, header: dict, payload: bytes = b"") -> None:
        self.channel.send(header, payload)

    async def open(self, sock: socket.socket) -> None:
        self.channel = await Channel.open(sock, self._on_frame)

    async def serve(self) -> None:
        """Until the front-end goes; its requests still queued or running are then withdrawn."""
        try:
            await self.channel.closed.wait()
        finally:
            for answer in list(self._answers.values()):
                answer.cancel()
            self.channel.close()

    def _on_frame(self, header: dict, _: bytes) -> None:
        op = header["op"]
        if op == "infer":
            self._infer(header)
        elif op == "cancel" and header["id"] in self._answers:
            self._answers[header["id"]].cancel()
        elif op == "stats":
            self._statistics(header)
        elif op in ("register", "unregister"):
            self._on_share(self, header)
        elif op == "listening":
            self.listening.set()

    def _infer(self, h: dict) -> None:
        """Queues the request now; `_reply` answers it when its batch is done (no task per
        request)."""
        try:
            model = self._plane.model(h["model"], h["version"])
            inputs = {name: np.frombuffer(self._inputs.view((offset, nbytes)), dtype).reshape(shape)
                      for name, dtype, shape, offset, nbytes in h["inputs"]}
            names, answer = self._plane.submit(
                model, inputs, [], RequestOptions(h["priority"], h["timeout_us"], h["deadline"]))
        except Exception as e:
            self.fail(h["id"], e)
        else:
            self._answers[h["id"]] = answer
            answer.add_done_callback(functools.partial(self._reply, h["id"], names))

    def _reply(self, request_id: int, names: list[str], answer: asyncio.Future[Answer]) -> None:
        del self._answers[request_id]
        if answer.cancelled():  # the client went away, or the owner stops
            self._error(request_id, "CANCELLED", "the request was cancelled")
        elif (e := answer.exception()) is not None:
            self.fail(request_id, e)
        else:
            result = select(answer.result(), names)
            arrays = [np.ascontiguousarray(a) for a in result.outputs.values()]
            self.send({"op": "reply", "id": request_id, "device": result.device,
                       "outputs": [[n, a.dtype.str, a.shape, a.nbytes]
                                   for n, a in zip(result.outputs, arrays)]},
                      b"".join(a.tobytes() for a in arrays))

    def _statistics(self, h: dict) -> None:
        try:
            reply = pb.ModelStatisticsResponse(model_stats=[
                m.stats.proto(m.spec.name, m.spec.version)
                for m in self._plane.statistics(h["name"], h["version"])])
        except HetserveError as e:
            self._error(h["id"], e.status.name, str(e))
        else:
            self.send({"op": "stats", "id": h["id"]}, reply.SerializeToString())

    def fail(self, request_id: int, error: BaseException) -> None:
        """A refused or failed request's answer; a bug's is logged, and still answered."""
        status, message = status_of(error, f"request {request_id} from a front-end")
        self._error(request_id, status.name, message)

    def _error(self, request_id: int, status: str, message: str) -> None:
        self.send({"op": "error", "id": request_id, "status": status, "message": message})
