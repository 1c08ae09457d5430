"""The KServe V2 / Triton gRPC servicer: converts messages, calls the data plane, and is the one
place where domain errors become gRPC statuses. service/handlers.py puts it on a server: the
methods it defines are served, every other method of the service answers UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from importlib.metadata import version as package_version

import grpc
from prometheus_client import Counter, Histogram
from tritonclient.grpc import service_pb2

from service import codec
from service.dataplane import DataPlane
from service.errors import HetserveError
from service.metrics import Metrics
from service.shared_memory import SharedMemoryRegions, check_local

log = logging.getLogger(__name__)
pb = service_pb2


class InferenceServicer:
    def __init__(self, plane: DataPlane, metrics: Metrics,
                 regions: SharedMemoryRegions) -> None:
        self._plane = plane
        self._metrics = metrics
        self._regions = regions
        self._counters: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._durations: dict[str, Histogram] = {}  # per served model, like _counters
        # Fixed for the process: read the package metadata once, not per call.
        self._server_metadata = pb.ServerMetadataResponse(
            name="hetserve", version=package_version("hetserve"),
            extensions=["model_repository", "statistics", "system_shared_memory"])

    @contextlib.asynccontextmanager
    async def _status(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        try:
            yield
        except HetserveError as e:
            await context.abort(e.status, str(e))

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self._plane.ready)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self._plane.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):
        return self._server_metadata

    async def ModelMetadata(self, request, context):
        async with self._status(context):
            spec = self._plane.model(request.name, request.version).spec
            def tensors(specs):
                return [pb.ModelMetadataResponse.TensorMetadata(
                    name=t.name, datatype=t.datatype, shape=spec.shape_with_batch(t))
                    for t in specs]
            return pb.ModelMetadataResponse(
                name=spec.name, versions=[str(spec.version)], platform=spec.config.platform,
                inputs=tensors(spec.inputs), outputs=tensors(spec.outputs))

    async def ModelConfig(self, request, context):
        async with self._status(context):
            return pb.ModelConfigResponse(
                config=self._plane.model(request.name, request.version).config)

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=s.name, version=s.version, state=s.state,
                                                  reason=s.reason)
            for s in self._plane.index() if s.state == "READY" or not request.ready])

    async def ModelStatistics(self, request, context):
        async with self._status(context):
            return pb.ModelStatisticsResponse(model_stats=[
                m.stats.proto(m.spec.name, m.spec.version)
                for m in self._plane.statistics(request.name, request.version)])

    async def SystemSharedMemoryRegister(self, request, context):
        async with self._status(context):
            check_local(context.peer())
            self._regions.register(request.name, request.key, request.offset,
                                   request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        async with self._status(context):
            check_local(context.peer())
            self._regions.unregister(request.name)
            return pb.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):
        async with self._status(context):
            check_local(context.peer())
            reply = pb.SystemSharedMemoryStatusResponse()
            for r in self._regions.status(request.name):
                reply.regions[r.name].CopyFrom(
                    pb.SystemSharedMemoryStatusResponse.RegionStatus(
                        name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
            return reply

    async def ModelInfer(self, request, context):
        try:
            return await self._infer(request, context.time_remaining())
        except HetserveError as e:
            await context.abort(e.status, str(e))

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests of one stream run concurrently (so that they batch together); each reply
        or error goes back as soon as it is ready, carrying the request's id. Messages arrive
        as bytes: one that does not parse gets its own error reply and the stream goes on."""
        replies: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task] = set()

        async def one(data: bytes) -> None:
            request = pb.ModelInferRequest()
            try:
                request = codec.parse_message(pb.ModelInferRequest, data)
                reply = pb.ModelStreamInferResponse(
                    infer_response=await self._infer(request, context.time_remaining()))
            except Exception as e:  # every request of a stream gets an answer, even a bug's
                if not isinstance(e, HetserveError):
                    log.exception("stream request %r failed", request.id)
                status = e.status if isinstance(e, HetserveError) else grpc.StatusCode.INTERNAL
                reply = pb.ModelStreamInferResponse(
                    error_message=f"{status.name}: {e}", infer_response=pb.ModelInferResponse(
                        model_name=request.model_name, id=request.id))
            replies.put_nowait(reply)

        async def read() -> None:
            try:
                async for data in request_iterator:
                    task = asyncio.create_task(one(data))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.gather(*running)
            finally:  # the writer below ends however reading ended
                replies.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                yield reply
            await reader  # raises what reading the stream raised
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _infer(self, request: pb.ModelInferRequest,
                     time_remaining_s: float | None) -> pb.ModelInferResponse:
        start = time.perf_counter()
        model_label = ""  # only served names become label values: clients cannot grow the set
        try:
            model = self._plane.model(request.model_name, request.model_version)
            model_label = model.spec.name
            answer = await self._plane.infer(
                model, codec.decode_inputs(request, self._regions),
                [o.name for o in request.outputs],
                codec.request_options(request, time_remaining_s))
            # Inside: an output that does not fit its shared memory region fails the request.
            response = codec.encode_response(request, model.spec.name, model.spec.version,
                                             answer, self._regions)
        except HetserveError as e:
            self._count(model_label, e.status)
            raise
        self._count(model_label, grpc.StatusCode.OK)
        duration = self._durations.get(model_label)
        if duration is None:
            duration = self._durations[model_label] = \
                self._metrics.request_duration.labels(model_label)
        duration.observe(time.perf_counter() - start)
        return response

    def _count(self, model: str, code: grpc.StatusCode) -> None:
        counter = self._counters.get((model, code))
        if counter is None:  # served model names times status codes: a bounded set
            counter = self._counters[model, code] = self._metrics.requests.labels(
                model, code.name)
        counter.inc()
