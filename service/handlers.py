"""Puts the servicer on a grpc server. Every method of Triton's service receives the bytes of its
request and parses them here, so a message that does not parse gets INVALID_ARGUMENT (grpc's
own deserializer would answer UNKNOWN); the one streaming method parses each message itself, so
that a bad one fails alone. Methods the servicer does not define get UNIMPLEMENTED, in one line
and without the traceback the generated base class logs."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from tritonclient.grpc import service_pb2

from service.codec import parse_message
from service.errors import InvalidInputError

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def add_to_server(servicer: object, server: grpc.aio.Server) -> None:
    handlers = {m.name: _handler(servicer, m) for m in SERVICE.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))


def _handler(servicer: object, method: MethodDescriptor) -> grpc.RpcMethodHandler:
    serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
    behaviour = getattr(servicer, method.name, None)
    if behaviour is None:
        return grpc.unary_unary_rpc_method_handler(_unimplemented(method.name),
                                                   response_serializer=serialize)
    if method.client_streaming:  # ModelStreamInfer: the servicer parses each message
        return grpc.stream_stream_rpc_method_handler(behaviour, response_serializer=serialize)
    return grpc.unary_unary_rpc_method_handler(
        _parsed(behaviour, message_factory.GetMessageClass(method.input_type), method.name),
        response_serializer=serialize)


def _parsed(behaviour: Callable, request_class: type, name: str) -> Callable:
    async def handle(data: bytes, context: grpc.aio.ServicerContext):
        try:
            request = parse_message(request_class, data)
        except InvalidInputError as e:
            await context.abort(e.status, f"{name}: {e}")
        return await behaviour(request, context)
    return handle


def _unimplemented(name: str) -> Callable:
    async def handle(data: bytes, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not supported by hetserve"
                            + (" (use system shared memory)" if "CudaShared" in name else ""))
    return handle
