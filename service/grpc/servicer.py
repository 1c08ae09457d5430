"""The KServe V2 / Triton gRPC servicer: converts messages and calls the data plane; what it
raises becomes a gRPC status in service/grpc/handlers.py, which puts it on a server: the methods it
defines are served, every other method of the service answers UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version as package_version
from typing import TypeVar

import grpc
from prometheus_client import Counter, Gauge, Histogram
from tritonclient.grpc import service_pb2 as pb

from service.core.control_callers import check_caller
from service.core.dataplane import DataPlane, select
from service.core.metrics import Metrics
from service.core.model import ModelSpec
from service.core.repository import check_model_name
from service.core.types import Answer, ModelControls, ServedModel
from service.edge import shared_memory
from service.edge.credentials import admin_token, holds
from service.edge.door import Peers
from service.edge.inflight import InflightLimit
from service.edge.shared_memory import Caller, SharedMemoryRegions
from service.errors import HetserveError, Status, StreamIdleError, status_of
from service.grpc import codec
from service.grpc.decoding import DecodePool
from service.settings import Settings

T = TypeVar("T")


@dataclass(slots=True)
class _Call:
    """A request queued on the data plane, until its reply is encoded."""

    request: pb.ModelInferRequest
    model: ServedModel
    names: list[str]  # outputs to reply with
    answer: asyncio.Future[Answer]
    start: float  # time.perf_counter() at receipt
    caller: Caller | None  # whose shared memory its outputs may go to


class InferenceServicer:
    def __init__(self, plane: DataPlane, metrics: Metrics, regions: SharedMemoryRegions,
                 peers: Peers, settings: Settings, control: ModelControls) -> None:
        self._plane = plane
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
        self._server_metadata = pb.ServerMetadataResponse(
            name="hetserve", version=package_version("hetserve"),
            extensions=["classification", "model_repository", "statistics",
                        "system_shared_memory"])

    def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """Whose shared memory regions a call may use (service.edge.shared_memory.caller)."""
        return shared_memory.caller(self._peers.identify(context.peer()), self._token,
                                    self._token_uid)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self._plane.server_ready())

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self._plane.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):
        return self._server_metadata

    async def ModelMetadata(self, request, context):
        spec = self._plane.model(request.name, request.version).spec

        def tensors(specs):
            return [pb.ModelMetadataResponse.TensorMetadata(
                name=t.name, datatype=t.datatype, shape=spec.shape_with_batch(t)) for t in specs]
        return pb.ModelMetadataResponse(
            name=spec.name, versions=[str(spec.version)], platform=spec.config.platform,
            inputs=tensors(spec.inputs), outputs=tensors(spec.outputs))

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(
            config=self._plane.model(request.name, request.version).config)

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=s.name, version=s.version, state=s.state,
                                                  reason=s.reason)
            for s in self._plane.index() if s.state == "READY" or not request.ready])

    async def RepositoryModelLoad(self, request, context):
        await self._control.load(self._controlled(request.model_name, context),
                                 list(request.parameters))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._control.unload(self._controlled(request.model_name, context))
        return pb.RepositoryModelUnloadResponse()

    def _controlled(self, name: str, context: grpc.aio.ServicerContext) -> str:
        """The model a caller may load or unload (PermissionDeniedError otherwise)."""
        peer = self._peers.identify(context.peer())
        check_caller(peer.uid if peer is not None else None, holds(self._admin, context),
                     self._admin is not None)
        return check_model_name(name)

    async def ModelStatistics(self, request, context):
        return pb.ModelStatisticsResponse(model_stats=[
            codec.statistics(m.spec.name, m.spec.version, m.stats)
            for m in self._plane.statistics(request.name, request.version)])

    async def SystemSharedMemoryRegister(self, request, context):
        self._regions.register(request.name, request.key, request.offset, request.byte_size,
                               self._caller(context))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        self._regions.unregister(request.name, self._caller(context))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):
        reply = pb.SystemSharedMemoryStatusResponse()
        for r in self._regions.status(request.name, self._caller(context)):
            reply.regions[r.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return reply

    async def ModelInfer(self, request, context):
        return await self._infer(request, context, self._caller_of(request, context))

    def _queue_caller(self, context: grpc.aio.ServicerContext) -> tuple[str, bool]:
        """Whose queue places a call takes, and whether it is an unauthenticated TCP caller
        (RequestOptions): the uid on the unix socket, the token's holders where a token guards
        TCP, else the uid (over loopback) or the address the door counted, over TCP."""
        peer = self._peers.identify(context.peer())
        if peer is None:
            return "", False
        if peer.listener == "unix":
            return peer.key, False
        return ("token", False) if self._token else (f"tcp {peer.key}", True)

    def _caller_of(self, request: pb.ModelInferRequest,
                   context: grpc.aio.ServicerContext) -> Caller | None:
        """The caller of a request that names shared memory; None for one that cannot."""
        return self._caller(context) if codec.uses_shared_memory(request) else None

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests of one stream are queued as they arrive (so that they batch together) and
        each reply or error goes back as soon as it is ready, carrying the request's id: a
        callback on each request's answer puts its reply on the stream, no task per request.
        Messages arrive as bytes: one that does not parse gets its own error reply and the
        stream goes on. A stream that ends early (the client gone) withdraws what it queued.
        At most `max_stream_inflight` requests are read ahead of the replies sent: a client that
        reads no replies stops being read (gRPC's flow control) instead of filling memory. A
        stream with no request for `stream_idle_s` while no reply is pending is closed
        UNAVAILABLE: an idle stream holds one of the listener's calls (--max-rpcs-*)."""
        replies: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
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

        def answered(call: _Call, answer: asyncio.Future) -> None:
            waiting.discard(answer)
            if answer.cancelled():  # withdrawn: the stream is gone
                return
            try:
                reply = pb.ModelStreamInferResponse(infer_response=self._finish(call))
            except Exception as e:
                reply = self._error_reply(call.request, e)
            replies.put_nowait(reply)

        async def read() -> None:
            try:
                async with asyncio.timeout(None) as timer:
                    idle.append(timer)
                    settle(0)
                    async for data in request_iterator:
                        await window.acquire()  # released as its reply leaves
                        settle(+1)
                        request = pb.ModelInferRequest()
                        try:
                            request = codec.parse_message(pb.ModelInferRequest, data)
                            call = await self._submit(request, context,
                                                      self._caller_of(request, context))
                        except Exception as e:
                            replies.put_nowait(self._error_reply(request, e))
                            continue
                        waiting.add(call.answer)
                        call.answer.add_done_callback(functools.partial(answered, call))
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

    @staticmethod
    def _error_reply(request: pb.ModelInferRequest,
                     error: Exception) -> pb.ModelStreamInferResponse:
        """Every request of a stream gets an answer, even a bug's."""
        status, message = status_of(error, "ModelStreamInfer")
        return pb.ModelStreamInferResponse(
            error_message=f"{status.name}: {message}", infer_response=pb.ModelInferResponse(
                model_name=request.model_name[:256], id=request.id[:256]))

    async def _infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext,
                     caller: Caller | None) -> pb.ModelInferResponse:
        call = await self._submit(request, context, caller)
        try:
            await call.answer  # a cancelled caller cancels it, which withdraws the request
        except HetserveError:
            pass  # _finish counts it and raises it
        return self._finish(call)

    async def _submit(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext,
                      caller: Caller | None) -> _Call:
        """Checks the request's header against the model, then decodes its values (many typed
        values in the decoding process, in the caller's turn) and queues it; raises (and
        counts) what refuses it. `caller` owns the shared memory regions it may name."""
        start = time.perf_counter()
        model = None
        held = ""  # the in-flight count it holds, from before decoding until it is answered
        try:
            model = self._plane.model(request.model_name, request.model_version)
            queue_caller = self._queue_caller(context)
            held = self._inflight.enter(*queue_caller)
            headers = codec.headers(request)
            names, size = self._plane.check(model, headers, [o.name for o in request.outputs])
            options = codec.request_options(request, context.time_remaining(), *queue_caller)
            inputs = {name: await self.decoding.run(queue_caller[0], codec.typed, tensor)
                      if isinstance(tensor, codec.Typed) else tensor for name, tensor in
                      codec.decode_inputs(request, headers, self._regions, caller).items()}
            answer = self._plane.enqueue(model, inputs, size, options)
        except BaseException as e:
            self._inflight.leave(held)
            if isinstance(e, HetserveError):
                # only served names become label values: clients cannot grow the set
                self._count(model.spec if model else None, e.status)
            raise
        answer.add_done_callback(lambda _: self._inflight.leave(held))
        self._track_pending(model.spec, answer)
        return _Call(request, model, names, answer, start, caller)

    async def decoded(self, context: grpc.aio.ServicerContext, work: Callable[..., T],
                      *args: object) -> T:
        """`work(*args)` in the decoding process, in the turn of the call's caller (as its queue
        places count it): REST's large JSON bodies."""
        return await self.decoding.run(self._queue_caller(context)[0], work, *args)

    def _track_pending(self, spec: ModelSpec, answer: asyncio.Future[Answer]) -> None:
        """Pending from queueing until the answer is done, however it ends (cancelled too)."""
        key = _labels(spec)
        gauge = self._pending.get(key)
        if gauge is None:
            gauge = self._pending[key] = self._metrics.pending.labels(*key)
        gauge.inc()
        answer.add_done_callback(lambda _: gauge.dec())

    def _finish(self, call: _Call) -> pb.ModelInferResponse:
        """The reply to a request whose answer is done; raises (and counts) its error."""
        spec = call.model.spec
        try:
            # Inside: an output that does not fit its shared memory region fails the request.
            response = codec.encode_response(call.request, spec,
                                             select(call.answer.result(), call.names),
                                             self._regions, call.caller, self._energy)
        except HetserveError as e:
            self._count(spec, e.status)
            raise
        self._count(spec, Status.OK)
        key = _labels(spec)
        duration = self._durations.get(key)
        if duration is None:
            duration = self._durations[key] = self._metrics.request_duration.labels(*key)
        duration.observe(time.perf_counter() - call.start)
        return response

    def _count(self, spec: ModelSpec | None, code: Status) -> None:
        """Counts an outcome; a request naming no served model counts under model ""."""
        key = (*_labels(spec), code) if spec else ("", "", code)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.requests.labels(
                key[0], key[1], code.name)
        counter.inc()


def _labels(spec: ModelSpec) -> tuple[str, str]:
    """The model and version labels of a served model version's series."""
    return spec.name, str(spec.version)
