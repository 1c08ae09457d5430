"""KServe V2 over HTTP/REST on --http-port, in this process (the one process, or each front-end
with --workers, sharing the port): aiohttp on the daemon's event loop, behind a door like gRPC's
(service/edge/door.py: connections bounded per peer and in all), with the same TLS and token.
Each request is converted to the protocol's types and answered by the operations object gRPC
uses (service/protocol/operations.py), so the checks, scheduler, priorities, deadlines and
statuses are the same; statuses map to HTTP here, once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from service.core.metrics import Metrics
from service.edge.access_log import AccessLog
from service.edge.credentials import TokenFile, admin_token, holds
from service.edge.door import Bounds, Door, Peers, private_folder
from service.errors import StartupError, Status, status_of
from service.http import codec, compression
from service.protocol.operations import Operations
from service.protocol.types import Identity
from service.settings import Settings

log = logging.getLogger(__name__)
HTTP_STATUS = {
    Status.INVALID_ARGUMENT: 400, Status.FAILED_PRECONDITION: 400, Status.UNAUTHENTICATED: 401,
    Status.PERMISSION_DENIED: 403, Status.NOT_FOUND: 404, Status.ALREADY_EXISTS: 409,
    Status.RESOURCE_EXHAUSTED: 429, Status.CANCELLED: 499, Status.INTERNAL: 500,
    Status.UNIMPLEMENTED: 501, Status.UNAVAILABLE: 503, Status.DEADLINE_EXCEEDED: 504,
}
_HEALTH = "/v2/health/"
_UNROUTED = "none"  # the endpoint of a request no route matched (404, 405)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_WHO = web.RequestKey("identity", Identity)


def _identity(request: web.Request) -> Identity:
    """Who sends an HTTP request: its connection's address (the door's) and its authorization;
    found once a request."""
    who = request.get(_WHO)
    if who is None:
        peername = request.transport.get_extra_info("peername") if request.transport else ""
        who = request[_WHO] = Identity(Peers.address_of(peername or ""),
                                       request.headers.get("Authorization", "").encode())
    return who


class HttpTransport:
    def __init__(self, settings: Settings, token: TokenFile | None,
                 operations: Operations, peers: Peers, metrics: Metrics,
                 reuseport: bool = False) -> None:
        self._settings, self._operations, self._peers = settings, operations, peers
        self._metrics = metrics
        self._access = AccessLog.of(settings, peers)
        # As on gRPC: the token, where one is set, guards all but health checks (the admin
        # token's holders pass too); the admin token alone guards only model control, which
        # the operations check.
        self._tokens = [t for t in (token, admin_token(settings)) if t is not None] \
            if token is not None else []
        self._reuseport = reuseport
        self._runner: web.AppRunner | None = None
        self._door: Door | None = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self._settings.max_message_bytes,
                              middlewares=[self._measured, self._answered])
        model = r"/v2/models/{model}{version:(/versions/[^/]+)?}"
        # Each route's name is its `endpoint` in the metrics: a bounded set.
        app.add_routes([
            web.get("/v2/health/live", self._live, name="health_live"),
            web.get("/v2/health/ready", self._ready, name="health_ready"),
            web.get("/v2", self._server_metadata, name="server_metadata"),
            web.get("/v2/models/stats", self._statistics, name="statistics"),
            web.get(model, self._model_metadata, name="model_metadata"),
            web.get(model + "/ready", self._model_ready, name="model_ready"),
            web.get(model + "/config", self._model_config, name="model_config"),
            web.get(model + "/stats", self._statistics, name="model_statistics"),
            web.post(model + "/infer", self._infer, name="infer"),
            web.post("/v2/repository/index", self._index, name="repository_index"),
            web.post("/v2/repository/models/{model}/load", self._load, name="repository_load"),
            web.post("/v2/repository/models/{model}/unload", self._unload,
                     name="repository_unload"),
        ])
        return app

    async def start(self, cleanup: contextlib.AsyncExitStack) -> str:
        s = self._settings
        tls = _ssl(s)
        inner = cleanup.enter_context(private_folder())
        self._door = Door("http", inner / "http.sock", Bounds(
            s.max_connections_per_peer, s.max_connections_tcp, "--max-connections-tcp",
            s.max_stream_resets), self._peers, tls=tls is not None, http2=False)
        # Compressed bodies are inflated by _body, off the loop and within bounds
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False,
                                     auto_decompress=False)
        await self._runner.setup()
        cleanup.push_async_callback(self._runner.cleanup)
        await web.UnixSite(self._runner, str(self._door.inner), ssl_context=tls,
                           shutdown_timeout=s.shutdown_grace_s,
                           backlog=self._door.backlog).start()
        target = f"{s.grpc_host}:{s.http_port}"
        try:
            await self._door.open_tcp(s.grpc_host, s.http_port, self._reuseport)
        except OSError as e:
            raise StartupError(f"cannot listen on {target} (HTTP): address in use or not "
                               "available") from e
        cleanup.callback(self._door.close)
        return f"http{'s' if tls else ''}://{target}"

    async def drain(self) -> None:
        """No new connections; requests in flight finish. Called once the data plane has
        drained: until then REST answers as it does while draining."""
        if self._door is not None and self._runner is not None:
            self._door.close()
            await self._runner.cleanup()

    @web.middleware
    async def _measured(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Counts, times and logs (--access-log) every answered request by its route's name
        and status."""
        start = time.perf_counter()
        response = await handler(request)
        endpoint = request.match_info.route.name or _UNROUTED
        self._metrics.http_requests.labels(endpoint, str(response.status)).inc()
        self._metrics.http_request_duration.labels(endpoint).observe(
            time.perf_counter() - start)
        self._access.rest(endpoint, request.match_info.get("model", ""), response.status,
                          start, _identity(request).peer)
        return response

    @web.middleware
    async def _answered(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token where one is in force (not for health checks, as on gRPC), and every
        error as the protocol's JSON error object with its HTTP status."""
        if self._tokens and not request.path.startswith(_HEALTH) and not any(
                holds(t, _identity(request).authorization) for t in self._tokens):
            return _error(401, "header 'Authorization': a valid 'Bearer <token>' is required")
        try:
            return await handler(request)
        except web.HTTPException as e:  # no such route, a body over the limit
            return _error(e.status, e.reason)
        except Exception as e:
            status, message = status_of(e, f"{request.method} {request.path[:200]}")
            return _error(HTTP_STATUS.get(status, 500), message)

    async def _body(self, request: web.Request, most: int = 0, bound: str = "") -> bytes:
        """The request's body, read within its caller's share of the bodies still arriving
        (429 beyond it), --max-message-bytes (413) and --upload-timeout-s (408); a compressed
        one inflated (service/http/compression.py) to at most `most` bytes (by default
        --max-message-bytes; `bound` says what sets it), charged to the same share."""
        budget, limit = self._peers.uploads, self._settings.max_message_bytes
        peer = self._peers.identify(_identity(request).peer)
        caller = peer.key if peer is not None else "?"
        chunks: list[bytes] = []
        held = 0

        def charge(nbytes: int) -> None:
            nonlocal held
            refusal = budget.charge(caller, nbytes)
            if refusal:
                raise web.HTTPTooManyRequests(reason=refusal)
            held += nbytes

        try:
            async with asyncio.timeout(budget.timeout_s or None):
                async for chunk in request.content.iter_any():
                    if held + len(chunk) > limit:
                        raise web.HTTPRequestEntityTooLarge(
                            max_size=limit, actual_size=held + len(chunk),
                            reason=f"the body is over --max-message-bytes {limit}")
                    charge(len(chunk))
                    chunks.append(chunk)
                body = b"".join(chunks)
                encoding = request.headers.get("Content-Encoding", "").strip().lower()
                if encoding in ("", compression.IDENTITY):
                    return body
                return await compression.inflated(
                    body, encoding, most or limit, bound or "--max-message-bytes", charge)
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"the request body was still arriving after "
                                                f"{budget.timeout_s:g} s (--upload-timeout-s)"
                                         ) from None
        finally:
            budget.release(caller, held)

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._operations.live() else 400)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._operations.ready() else 400)

    async def _server_metadata(self, request: web.Request) -> web.Response:
        metadata = self._operations.server_metadata()
        # REST has no shared-memory endpoints: gRPC on the unix socket offers it.
        return web.json_response({"name": metadata.name, "version": metadata.version,
                                  "extensions": [e for e in metadata.extensions
                                                 if e != "system_shared_memory"]})

    async def _model_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(codec.model_metadata(self._operations.model_metadata(
            request.match_info["model"], _version(request))))

    async def _model_ready(self, request: web.Request) -> web.Response:
        ready = self._operations.model_ready(request.match_info["model"], _version(request))
        return web.Response(status=200 if ready else 400)

    async def _model_config(self, request: web.Request) -> web.Response:
        return web.json_response(codec.as_json(self._operations.model_config(
            request.match_info["model"], _version(request))))

    async def _statistics(self, request: web.Request) -> web.Response:
        return web.json_response(codec.statistics(await self._operations.statistics(
            request.match_info.get("model", ""), _version(request))))

    async def _index(self, request: web.Request) -> web.Response:
        body = codec.parse_json(await self._body(request, *codec.JSON_BOUND), "the request body")
        return web.json_response([
            {"name": s.name, "version": s.version, "state": s.state, "reason": s.reason}
            for s in self._operations.repository_index(body.get("ready") is True)])

    async def _load(self, request: web.Request) -> web.Response:
        body = codec.parse_json(await self._body(request, *codec.JSON_BOUND), "the request body")
        parameters = codec.object_field(body.get("parameters", {}), "parameters")
        await self._operations.load(request.match_info["model"], list(parameters),
                                    _identity(request))
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await self._operations.unload(request.match_info["model"], _identity(request))
        return web.Response(status=200)

    async def _infer(self, request: web.Request) -> web.Response:
        length = request.headers.get(codec.HEADER_LENGTH)
        # JSON alone is parsed up to its cap: a body inflating beyond it is refused on the way
        body = await self._body(request, *(() if length else codec.JSON_BOUND))
        where = (body, length, request.match_info["model"], _version(request))
        who = _identity(request)
        if not codec.INLINE_JSON_BYTES < codec.json_bytes(body, length) <= codec.MAX_JSON_BYTES:
            message, binary = codec.infer_request(*where)  # small, or refused before parsing
        else:  # off the event loop, in the caller's turn
            message, binary = await self._operations.decoded(who, codec.infer_request, *where)
        # REST has no deadline; a `timeout` parameter may say one
        body, header_length = codec.infer_response(await self._operations.infer(message, who),
                                                   binary)
        if header_length is None:
            return web.Response(body=body, content_type="application/json")
        return web.Response(body=body, content_type="application/octet-stream",
                            headers={codec.HEADER_LENGTH: str(header_length)})


def _version(request: web.Request) -> str:
    return request.match_info.get("version", "").removeprefix("/versions/")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _ssl(settings: Settings) -> ssl.SSLContext | None:
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context
