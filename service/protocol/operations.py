"""KServe V2's operations, once for every transport: metadata, readiness, inference (one request
or a stream), statistics, clients' shared memory and model control. Each takes the caller's
identity (who it is, as its transport saw it) explicitly; what it raises is a service.errors
error, which each transport maps to its statuses in one place (service/grpc/handlers.py,
service/http/transport.py's HTTP_STATUS). What a process answers from elsewhere is injected: model
control, statistics and the registration of clients' regions are this process's own where one
process serves, and reach the device owner from a front-end
(service/workers/frontend_process.py)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from importlib.metadata import version as package_version
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

from service.core.control_callers import check_caller
from service.core.dataplane import DataPlane, ModelState, select
from service.core.metrics import Metrics
from service.core.model import ModelSpec
from service.core.repository import check_model_name
from service.core.types import Answer, ModelControls, ServedModel
from service.edge import shared_memory
from service.edge.credentials import admin_token, holds
from service.edge.door import Peers
from service.edge.inflight import InflightLimit
from service.edge.shared_memory import Caller, Region, SharedMemoryRegions
from service.errors import HetserveError, Status, StreamIdleError, status_of
from service.protocol import inputs, outputs
from service.protocol.decoding import DecodePool
from service.protocol.providers import (
    OwnRegions,
    OwnStatistics,
    RegionRegistry,
    StatisticsSource,
)
from service.protocol.types import (
    Identity,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    StreamReply,
    TensorMetadata,
)
from service.settings import Settings

T = TypeVar("T")
EXTENSIONS = ("classification", "model_repository", "statistics", "system_shared_memory")


@dataclass(slots=True)
class _Queued:
    """A request queued on the data plane, until its response is built."""

    request: InferRequest
    model: ServedModel
    names: list[str]  # outputs to reply with
    answer: asyncio.Future[Answer]
    start: float  # time.perf_counter() at receipt
    caller: Caller | None  # whose shared memory its outputs may go to


class Operations:
    """`control`, `statistics` and `registry` (by default this process's own statistics and
    regions) answer from wherever the process's models and regions are kept."""

    def __init__(self, plane: DataPlane, metrics: Metrics, regions: SharedMemoryRegions,
                 peers: Peers, settings: Settings, control: ModelControls,
                 statistics: StatisticsSource | None = None,
                 registry: RegionRegistry | None = None) -> None:
        self._plane = plane
        self._statistics = statistics or OwnStatistics(plane)
        self._registry = registry or OwnRegions(regions)
        self._metrics = metrics
        self._regions = regions
        self._peers = peers
        self._control = control
        self._admin = admin_token(settings)
        # TCP calls carry the daemon's token: shared memory there as the operator allows
        self._token = bool(settings.token_file)
        self._token_uid = settings.shm_uid_for_token
        self._stream_window = settings.max_stream_inflight
        self._inflight = InflightLimit(settings.max_rpcs_per_caller)  # gRPC's and REST's
        self.decoding = DecodePool()  # gRPC's and REST's; the daemon closes it
        self._stream_idle_s = settings.stream_idle_s
        self._energy = settings.response_energy
        # Children per served model version (and status code): a bounded set of labels.
        self._counters: dict[tuple[str, str, Status], Counter] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._pending: dict[tuple[str, str], Gauge] = {}
        # Fixed for the process: read the package metadata once, not per call.
        self._server_metadata = ServerMetadata("hetserve", package_version("hetserve"),
                                               list(EXTENSIONS))

    def caller(self, who: Identity) -> Caller:
        """Whose shared memory regions a call may use (service.edge.shared_memory.caller)."""
        return shared_memory.caller(self._peers.identify(who.peer), self._token,
                                    self._token_uid)

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._plane.server_ready()

    def model_ready(self, name: str, version: str) -> bool:
        return self._plane.model_ready(name, version)

    def server_metadata(self) -> ServerMetadata:
        return self._server_metadata

    def model_metadata(self, name: str, version: str) -> ModelMetadata:
        spec = self._plane.model(name, version).spec

        def tensors(specs) -> list[TensorMetadata]:
            return [TensorMetadata(t.name, t.datatype, spec.shape_with_batch(t)) for t in specs]
        return ModelMetadata(spec.name, [str(spec.version)], spec.config.platform,
                             tensors(spec.inputs), tensors(spec.outputs))

    def model_config(self, name: str, version: str):
        """The model's effective configuration (model_config_pb2.ModelConfig)."""
        return self._plane.model(name, version).config

    def repository_index(self, ready_only: bool) -> list[ModelState]:
        return [s for s in self._plane.index() if s.state == "READY" or not ready_only]

    async def load(self, name: str, parameters: list[str], who: Identity) -> None:
        await self._control.load(self._controlled(name, who), parameters)

    async def unload(self, name: str, who: Identity) -> None:
        await self._control.unload(self._controlled(name, who))

    def _controlled(self, name: str, who: Identity) -> str:
        """The model a caller may load or unload (PermissionDeniedError otherwise)."""
        peer = self._peers.identify(who.peer)
        check_caller(peer.uid if peer is not None else None,
                     holds(self._admin, who.authorization), self._admin is not None)
        return check_model_name(name)

    async def statistics(self, name: str, version: str) -> list[ModelStatistics]:
        return await self._statistics.statistics(name, version)

    async def register(self, name: str, key: str, offset: int, byte_size: int,
                       who: Identity) -> None:
        await self._registry.register(name, key, offset, byte_size, self.caller(who))

    async def unregister(self, name: str, who: Identity) -> None:
        await self._registry.unregister(name, self.caller(who))

    def regions(self, name: str, who: Identity) -> list[Region]:
        return self._regions.status(name, self.caller(who))

    async def infer(self, request: InferRequest, who: Identity,
                    time_remaining_s: float | None = None) -> InferResponse:
        queued = await self._submit(request, who, time_remaining_s)
        try:
            await queued.answer  # a cancelled caller cancels it, which withdraws the request
        except HetserveError:
            pass  # _finish counts it and raises it
        return self._finish(queued)

    def _queue_caller(self, who: Identity) -> tuple[str, bool]:
        """Whose queue places a call takes (service.edge.door.Peers.queue_caller)."""
        return self._peers.queue_caller(who.peer, self._token)

    async def stream(self, requests: AsyncIterator[bytes], parse: Callable[[bytes], InferRequest],
                     who: Identity, time_remaining: Callable[[], float | None]
                     ) -> AsyncGenerator[StreamReply, None]:
        """Requests of one stream are queued as they arrive (so that they batch together) and
        each reply or error goes back as soon as it is ready, carrying the request's id: a
        callback on each request's answer puts its reply on the stream, no task per request.
        Messages arrive as bytes, which `parse` turns into requests: one that does not parse
        gets its own error reply and the stream goes on. A stream that ends early (the client
        gone) withdraws what it queued. At most `max_stream_inflight` requests are read ahead
        of the replies sent: a client that reads no replies stops being read (its transport's
        flow control) instead of filling memory. A stream with no request for `stream_idle_s`
        while no reply is pending is closed UNAVAILABLE: an idle stream holds one of the
        listener's calls (--max-rpcs-*)."""
        replies: asyncio.Queue[StreamReply | None] = asyncio.Queue()
        waiting: set[asyncio.Future] = set()
        window = asyncio.Semaphore(self._stream_window)
        idle: list[asyncio.Timeout] = []  # the reader's timer, while it reads requests
        pending = 0  # requests read whose replies have not been written

        def settle(change: int) -> None:
            """Counts pending replies; the idle timer runs while there are none."""
            nonlocal pending
            pending += change
            if idle and self._stream_idle_s:
                idle[0].reschedule(None if pending else
                                   asyncio.get_running_loop().time() + self._stream_idle_s)

        def answered(queued: _Queued, answer: asyncio.Future) -> None:
            waiting.discard(answer)
            if answer.cancelled():  # withdrawn: the stream is gone
                return
            try:
                reply = StreamReply(self._finish(queued))
            except Exception as e:
                reply = _error_reply(queued.request, e)
            replies.put_nowait(reply)

        async def read() -> None:
            try:
                async with asyncio.timeout(None) as timer:
                    idle.append(timer)
                    settle(0)
                    async for data in requests:
                        await window.acquire()  # released as its reply leaves
                        settle(+1)
                        request = InferRequest("")
                        try:
                            request = parse(data)
                            queued = await self._submit(request, who, time_remaining())
                        except Exception as e:
                            replies.put_nowait(_error_reply(request, e))
                            continue
                        waiting.add(queued.answer)
                        queued.answer.add_done_callback(functools.partial(answered, queued))
                    idle.clear()  # the client has sent all: no longer idle, just waiting
                if waiting:
                    await asyncio.wait(waiting)  # their callbacks have queued their replies
            except TimeoutError:
                if not timer.expired():
                    raise
                raise StreamIdleError(
                    f"ModelStreamInfer: no request for {self._stream_idle_s:g} s and no reply "
                    "pending: the stream is closed (--stream-idle-s)") from None
            finally:  # the writer below ends however reading ended
                idle.clear()
                replies.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                window.release()
                yield reply
                settle(-1)  # written
            await reader  # raises what reading the stream raised
        finally:
            reader.cancel()
            for answer in list(waiting):
                answer.cancel()

    async def _submit(self, request: InferRequest, who: Identity,
                      time_remaining_s: float | None) -> _Queued:
        """Checks the request's header against the model, then decodes its values (many typed
        values in the decoding process, in the caller's turn) and queues it; raises (and
        counts) what refuses it. Only a request that names shared memory has its caller's
        regions looked up."""
        start = time.perf_counter()
        model = None
        held = ""  # the in-flight count it holds, from before decoding until it is answered
        caller = self.caller(who) if inputs.uses_shared_memory(request) else None
        try:
            model = self._plane.model(request.model_name, request.model_version)
            queue_caller = self._queue_caller(who)
            held = self._inflight.enter(*queue_caller)
            headers = inputs.headers(request)
            names, size = self._plane.check(model, headers, [o.name for o in request.outputs])
            options = inputs.request_options(request, time_remaining_s, *queue_caller)
            arrays = {name: await self.decoding.run(queue_caller[0], inputs.typed, tensor)
                      if isinstance(tensor, inputs.Typed) else tensor for name, tensor in
                      inputs.decode_inputs(request, headers, self._regions, caller).items()}
            answer = self._plane.enqueue(model, arrays, size, options)
        except BaseException as e:
            self._inflight.leave(held)
            if isinstance(e, HetserveError):
                # only served names become label values: clients cannot grow the set
                self._count(model.spec if model else None, e.status)
            raise
        answer.add_done_callback(lambda _: self._inflight.leave(held))
        self._track_pending(model.spec, answer)
        return _Queued(request, model, names, answer, start, caller)

    async def decoded(self, who: Identity, work: Callable[..., T], *args: object) -> T:
        """`work(*args)` in the decoding process, in the turn of the caller (as its queue
        places count it): REST's large JSON bodies."""
        return await self.decoding.run(self._queue_caller(who)[0], work, *args)

    def _track_pending(self, spec: ModelSpec, answer: asyncio.Future[Answer]) -> None:
        """Pending from queueing until the answer is done, however it ends (cancelled too)."""
        key = _labels(spec)
        gauge = self._pending.get(key)
        if gauge is None:
            gauge = self._pending[key] = self._metrics.pending.labels(*key)
        gauge.inc()
        answer.add_done_callback(lambda _: gauge.dec())

    def _finish(self, queued: _Queued) -> InferResponse:
        """The response to a request whose answer is done; raises (and counts) its error."""
        spec = queued.model.spec
        try:
            # Inside: an output that does not fit its shared memory region fails the request.
            response = outputs.respond(queued.request, spec,
                                       select(queued.answer.result(), queued.names),
                                       self._regions, queued.caller, self._energy)
        except HetserveError as e:
            self._count(spec, e.status)
            raise
        self._count(spec, Status.OK)
        key = _labels(spec)
        duration = self._durations.get(key)
        if duration is None:
            duration = self._durations[key] = self._metrics.request_duration.labels(*key)
        duration.observe(time.perf_counter() - queued.start)
        return response

    def _count(self, spec: ModelSpec | None, code: Status) -> None:
        """Counts an outcome; a request naming no served model counts under model ""."""
        key = (*_labels(spec), code) if spec else ("", "", code)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.requests.labels(
                key[0], key[1], code.name)
        counter.inc()


def _error_reply(request: InferRequest, error: Exception) -> StreamReply:
    """Every request of a stream gets an answer, even a bug's."""
    status, message = status_of(error, "ModelStreamInfer")
    return StreamReply(InferResponse(request.model_name[:256], id=request.id[:256]),
                       f"{status.name}: {message}")


def _labels(spec: ModelSpec) -> tuple[str, str]:
    """The model and version labels of a served model version's series."""
    return spec.name, str(spec.version)
