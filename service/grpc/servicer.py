"""The KServe V2 / Triton gRPC servicer: converts messages to the protocol's types and back, and
calls the operations object (service/protocol/operations.py) with the caller's identity; what it
raises becomes a gRPC status in service/grpc/handlers.py, which puts it on a server: the methods
it defines are served, every other method of the service answers UNIMPLEMENTED."""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2 as pb

from service.grpc import codec
from service.grpc.auth import sent_bearer
from service.protocol.operations import Operations
from service.protocol.types import Identity


def identity(context: grpc.aio.ServicerContext, authorization: bool = False) -> Identity:
    """Who makes a call: its connection's address (the door's), and with `authorization` what
    it sent as such (read only where an operation checks it: model control)."""
    return Identity(context.peer(), sent_bearer(context) if authorization else b"")


class InferenceServicer:
    def __init__(self, operations: Operations) -> None:
        self.operations = operations
        metadata = operations.server_metadata()
        # Fixed for the process: built once, not per call.
        self._server_metadata = pb.ServerMetadataResponse(
            name=metadata.name, version=metadata.version, extensions=metadata.extensions)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.operations.live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.operations.ready())

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(
            ready=self.operations.model_ready(request.name, request.version))

    async def ServerMetadata(self, request, context):
        return self._server_metadata

    async def ModelMetadata(self, request, context):
        return codec.model_metadata(self.operations.model_metadata(request.name, request.version))

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(
            config=self.operations.model_config(request.name, request.version))

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=s.name, version=s.version, state=s.state,
                                                  reason=s.reason)
            for s in self.operations.repository_index(request.ready)])

    async def RepositoryModelLoad(self, request, context):
        await self.operations.load(request.model_name, list(request.parameters),
                                   identity(context, authorization=True))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self.operations.unload(request.model_name, identity(context, authorization=True))
        return pb.RepositoryModelUnloadResponse()

    async def ModelStatistics(self, request, context):
        return codec.statistics(await self.operations.statistics(request.name, request.version))

    async def SystemSharedMemoryRegister(self, request, context):
        await self.operations.register(request.name, request.key, request.offset,
                                       request.byte_size, identity(context))
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        await self.operations.unregister(request.name, identity(context))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):
        reply = pb.SystemSharedMemoryStatusResponse()
        for r in self.operations.regions(request.name, identity(context)):
            reply.regions[r.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return reply

    async def ModelInfer(self, request, context):
        return codec.infer_response(await self.operations.infer(
            codec.infer_request(request), identity(context), context.time_remaining()))

    async def ModelStreamInfer(self, request_iterator, context):
        """Each message is parsed as the stream reads it (service/protocol/operations.py)."""
        replies = self.operations.stream(request_iterator, codec.parse_infer_request,
                                         identity(context), context.time_remaining)
        try:
            async for reply in replies:
                yield codec.stream_reply(reply)
        finally:
            await replies.aclose()
