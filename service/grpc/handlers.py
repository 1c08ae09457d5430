"""Puts the servicer on a grpc server, and is the one place where errors become gRPC statuses.
Every method of Triton's service receives the bytes of its request and parses them here, so a
message that does not parse gets INVALID_ARGUMENT (grpc's own deserializer would answer UNKNOWN);
the one streaming method parses each message itself, so that a bad one fails alone. A domain
error answers its status; any other exception, a bug, answers INTERNAL with one log line, never
UNKNOWN; a call whose gRPC deadline has passed is left to gRPC, which answers it
DEADLINE_EXCEEDED. Methods the servicer does not define get UNIMPLEMENTED, in one line and
without the traceback the generated base class logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

from service.edge.access_log import OFF, AccessLog
from service.errors import InvalidInputError, Status, status_of
from service.grpc.codec import parse_message

log = logging.getLogger(__name__)
SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def add_to_server(servicer: object, server: grpc.aio.Server,
                  access: AccessLog = OFF) -> None:
    """`access`: the access log, off unless given one that is on."""
    handlers = {m.name: _handler(servicer, m, access) for m in SERVICE.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))


def _handler(servicer: object, method: MethodDescriptor,
             access: AccessLog) -> grpc.RpcMethodHandler:
    serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
    behaviour = getattr(servicer, method.name, None)
    if behaviour is None:
        return grpc.unary_unary_rpc_method_handler(_unimplemented(method.name),
                                                   response_serializer=serialize)
    if method.client_streaming:  # ModelStreamInfer: the servicer parses each message
        return grpc.stream_stream_rpc_method_handler(_streamed(behaviour, method.name, access),
                                                     response_serializer=serialize)
    return grpc.unary_unary_rpc_method_handler(
        _parsed(behaviour, message_factory.GetMessageClass(method.input_type), method.name,
                access), response_serializer=serialize)


def _model_of(request: Message) -> str:
    """The model a request names: `model_name` (inference, load, unload) or the `name` of the
    Model* methods' requests (elsewhere `name` is a shared memory region's)."""
    fields = request.DESCRIPTOR.fields_by_name
    if "model_name" in fields:
        return request.model_name
    return request.name if "name" in fields and \
        request.DESCRIPTOR.name.startswith("Model") else ""


def _parsed(behaviour: Callable, request_class: type[Message], name: str,
            access: AccessLog) -> Callable:
    async def handle(data: bytes, context: grpc.aio.ServicerContext):
        with access.grpc(name, context) as call:
            try:
                request = parse_message(request_class, data)
            except InvalidInputError as e:
                await context.abort(grpc_status(e.status), f"{name}: {e}")
            call.model = _model_of(request)
            try:
                reply = await behaviour(request, context)
            except Exception as e:
                await _abort(context, name, e)
            _end_if_past_deadline(context)
            return reply
    return handle


def _streamed(behaviour: Callable, name: str, access: AccessLog) -> Callable:
    """Replies written here (not yielded to grpc, which logs a traceback when the client has
    gone while one is written): a write fails only once the call has ended (the client gone,
    or its deadline passed), and then the stream ends as gRPC ends a call its client has left,
    sending nothing more (a status sent then would fail, and grpc would log it with a
    traceback). The access log has one line per stream, when it ends."""
    async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        replies = behaviour(requests, context)
        with access.grpc(name, context) as call:
            try:
                async for reply in replies:
                    try:
                        await context.write(reply)
                    except Exception:
                        raise asyncio.CancelledError from None
            except Exception as e:
                if context.done():  # the client has gone: nobody to answer
                    call.status = "CANCELLED"
                    return
                await _abort(context, name, e)
            finally:
                await replies.aclose()
    return handle


async def _abort(context: grpc.aio.ServicerContext, method: str, error: Exception) -> None:
    if isinstance(error, grpc.aio.AbortError):  # aborted already, with its status
        raise error
    status, message = grpc_status_of(error, method)
    _end_if_past_deadline(context)
    await context.abort(status, message)


def _end_if_past_deadline(context: grpc.aio.ServicerContext) -> None:
    """Ends a call whose gRPC deadline has passed without a reply: gRPC answers it
    DEADLINE_EXCEEDED itself, and a reply or status sent meanwhile races that end (grpc logs the
    send that loses with a traceback, for each such call). The daemon's queue answers at the
    same deadline, so without this a client with short deadlines floods the log."""
    if context.time_remaining() == 0:
        raise asyncio.CancelledError  # what gRPC raises in a call its client has left


def grpc_status(status: Status) -> grpc.StatusCode:
    return grpc.StatusCode[status.name]


def grpc_status_of(error: BaseException, where: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a client gets for `error` (service.errors.status_of)."""
    status, message = status_of(error, where)
    return grpc_status(status), message


def _unimplemented(name: str) -> Callable:
    async def handle(data: bytes, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not supported by hetserve"
                            + (" (use system shared memory)" if "CudaShared" in name else ""))
    return handle
