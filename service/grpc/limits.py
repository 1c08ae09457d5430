"""What one client may hold of a gRPC server, bounded per listener: each listener (TCP, the unix
socket) has a server of its own in each process, so that a flood over TCP fills only TCP's
limits. Its door bounds connections (service/edge/door.py); grpc core keeps the stream, idle and
age bounds (`server_options`); calls in progress are counted here (`RpcLimit`), in all and per
caller, so that a refusal names the flag that sets the limit."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from service.core.queue_policy import callers_share
from service.edge.door import Peers
from service.edge.inflight import CallerCounts
from service.settings import Settings

# grpc's own default: the third ping that comes too soon closes the connection.
_PING_STRIKES = 2
_IDENTITY = 0  # grpc_compression_algorithm GRPC_COMPRESS_NONE: no compression


@dataclass(frozen=True)
class Listener:
    door: str  # its door's name: "tcp" or "unix" (service/edge/door.py)
    name: str  # as messages name it
    max_rpcs: int
    max_connections: int  # kept by its door
    flag: str  # the flag that sets max_rpcs
    connections_flag: str  # the one that sets max_connections

    @classmethod
    def tcp(cls, settings: Settings) -> Listener:
        return cls("tcp", "TCP", settings.max_rpcs_tcp, settings.max_connections_tcp,
                   "--max-rpcs-tcp", "--max-connections-tcp")

    @classmethod
    def socket(cls, settings: Settings) -> Listener:
        return cls("unix", "the unix socket", settings.max_rpcs_socket,
                   settings.max_connections_socket, "--max-rpcs-socket",
                   "--max-connections-socket")


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """grpc core's channel arguments for a listener's server (behind its door, on a private
    socket)."""
    def ms(seconds: float) -> int:
        return round(seconds * 1000)
    return [
        ("grpc.so_reuseport", 0),  # its own private socket: the door shares the port
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # Counted until grpc has freed a stream (overload protection, on by default), so that
        # streams opened and reset at once (HTTP/2 rapid reset) are refused beyond it too.
        ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(settings.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", _PING_STRIKES),
        ("grpc.keepalive_permit_without_calls", 0),
        # Compressed requests refused (UNIMPLEMENTED, naming the algorithm) before inflating:
        # grpc core inflates a message whole, then the loop copies and parses it, so 58 KB of
        # gzip that inflate to 60 MB held every caller's requests for about 0.4 s each.
        ("grpc.compression_enabled_algorithms_bitset", 1 << _IDENTITY),
    ] + [(name, ms(seconds)) for name, seconds in (  # 0: no such timeout
        ("grpc.max_connection_idle_ms", settings.connection_idle_s),
        ("grpc.max_connection_age_ms", settings.connection_age_s),
        ("grpc.max_connection_age_grace_ms", settings.connection_age_grace_s)) if seconds]


def backstop(listener: Listener) -> int:
    """grpc's own `maximum_concurrent_rpcs`, above RpcLimit's so that RpcLimit refuses first
    (grpc's refusal names no flag), and bounding the refusals in progress too."""
    return 2 * listener.max_rpcs


class RpcLimit(grpc.aio.ServerInterceptor):
    """At most `listener.max_rpcs` calls in progress on one server, and at most three quarters
    of them from one caller (as its door names it: a uid on the socket and over loopback TCP,
    else an address), so that one local user's idle streams (health watches, ModelStreamInfer)
    leave the others room: one more is refused RESOURCE_EXHAUSTED before its handler runs, with
    a message naming the flag."""

    def __init__(self, listener: Listener, peers: Peers) -> None:
        self._listener, self._peers = listener, peers
        self._active = 0
        self._callers = CallerCounts(callers_share(listener.max_rpcs))

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        return None if handler is None else self._counted(handler)

    async def _enter(self, context: grpc.aio.ServicerContext) -> str:
        """Counts the call in; the caller to count out ("" for one that came through no door)."""
        listener = self._listener
        if self._active >= listener.max_rpcs:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"{listener.name} has {listener.max_rpcs} calls in progress at this daemon "
                f"process, the most {listener.flag} allows: try again later"))
        peer = self._peers.identify(context.peer())
        caller = peer.key if peer is not None else ""
        if caller and not self._callers.take(caller):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"{caller} has {self._callers.held(caller)} calls in progress on "
                f"{listener.name} at this daemon process, its share of the {listener.max_rpcs} "
                f"that {listener.flag} allows (the others' room): end some, or wait for replies"))
        self._active += 1
        return caller

    def _leave(self, caller: str) -> None:
        self._active -= 1
        if caller:
            self._callers.give_back(caller)

    def _counted(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kind, behaviour = next((kind, getattr(handler, kind)) for kind in (
            "unary_unary", "stream_unary", "unary_stream", "stream_stream")
            if getattr(handler, kind))
        counted: Callable[..., Any]  # one of two kinds of coroutine function
        if inspect.isasyncgenfunction(behaviour):  # replies yielded
            async def counted(request, context):
                caller = await self._enter(context)
                try:
                    async for reply in behaviour(request, context):
                        yield reply
                finally:
                    self._leave(caller)
        else:  # a reply returned, or replies written with context.write
            async def counted(request, context):
                caller = await self._enter(context)
                try:
                    return await behaviour(request, context)
                finally:
                    self._leave(caller)
        return getattr(grpc, f"{kind}_rpc_method_handler")(
            counted, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
