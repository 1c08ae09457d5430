"""Who may call the daemon. The unix socket admits the daemon's user (and --socket-group's
members), so its callers are trusted. TCP stays on
loopback unless the operator exposes it, and then it must carry TLS and a bearer token
(`authorization: Bearer <token>`) on every call but health checks, which load balancers and
kubelets make without credentials."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from service.edge.credentials import ExposureError, TokenFile, holds
from service.edge.socket_owner import is_loopback

_EXEMPT = "/grpc.health.v1.Health/"


def check_exposure(host: str, tls: bool, token: bool) -> None:
    if not is_loopback(host) and not (tls and token):
        missing = [flag for flag, given in (("--tls-cert and --tls-key", tls),
                                           ("--token-file", token)) if not given]
        raise ExposureError(f"host {host!r} exposes gRPC beyond this node: give "
                            + " and ".join(missing) + " (or keep the default 127.0.0.1)")


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses TCP calls without the bearer token in force, or the admin token (whose holders
    may do everything): UNAUTHENTICATED, before any handler runs."""

    def __init__(self, token: TokenFile, admin: TokenFile | None = None) -> None:
        self._token, self._admin = token, admin

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(_EXEMPT):
            return handler
        return _guarded(handler, self._allowed)

    def _allowed(self, context: grpc.aio.ServicerContext) -> bool:
        # On the TCP server alone (service/grpc/transport.py): the peer's address says nothing here,
        # as a connection forwarded over a unix socket still came from TCP.
        sent = sent_bearer(context)
        return holds(self._token, sent) or holds(self._admin, sent)


def sent_bearer(context: grpc.aio.ServicerContext) -> bytes:
    """What a call sent as its 'authorization' metadata."""
    return str(dict(context.invocation_metadata()).get("authorization", "")).encode()


async def _deny(context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                        "metadata 'authorization': a valid 'Bearer <token>' is required over TCP")


def _guarded(handler: grpc.RpcMethodHandler,
             allowed: Callable[[grpc.aio.ServicerContext], bool]) -> grpc.RpcMethodHandler:
    """The same handler, checking the caller first; replies pass through."""
    kind, behavior = next((kind, getattr(handler, kind)) for kind in (
        "unary_unary", "stream_unary", "unary_stream", "stream_stream") if getattr(handler, kind))
    checked: Callable[..., Any]  # one of two kinds of coroutine function
    if inspect.isasyncgenfunction(behavior):  # replies yielded
        async def checked(request, context):
            if not allowed(context):
                await _deny(context)
            async for reply in behavior(request, context):
                yield reply
    else:  # a reply returned, or replies written with context.write
        async def checked(request, context):
            if not allowed(context):
                await _deny(context)
            return await behavior(request, context)
    return getattr(grpc, f"{kind}_rpc_method_handler")(
        checked, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)
