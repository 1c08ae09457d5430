"""KServe V2 over HTTP/REST on --http-port, in this process (the one process, or each front-end
with --workers, sharing the port): aiohttp on the daemon's event loop, behind a door like gRPC's
(service/edge/door.py: connections bounded per peer and in all), with the same TLS and token.
Each request is decoded into the protocol's message and answered by the servicer gRPC uses, so
the checks, scheduler, priorities, deadlines and statuses are the same; statuses map to HTTP here,
once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from tritonclient.grpc import service_pb2 as pb

from service.core.metrics import Metrics
from service.edge.access_log import AccessLog
from service.edge.credentials import TokenFile, admin_token, holds
from service.edge.door import Bounds, Door, Peers, private_folder
from service.errors import StartupError, Status, status_of
from service.grpc.servicer import InferenceServicer
from service.http import codec
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


class _Call:
    """What the servicer reads of a gRPC call, for one HTTP request."""

    def __init__(self, request: web.Request) -> None:
        peername = request.transport.get_extra_info("peername") if request.transport else ""
        self._peer = Peers.address_of(peername or "")
        self._authorization = request.headers.get("Authorization", "")

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> None:  # REST has no deadline; a `timeout` parameter may say one
        return None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", self._authorization),)


class HttpFront:
    def __init__(self, settings: Settings, token: TokenFile | None,
                 servicer: InferenceServicer, peers: Peers, metrics: Metrics,
                 reuseport: bool = False) -> None:
        self._settings, self._servicer, self._peers = settings, servicer, peers
        self._metrics = metrics
        self._access = AccessLog.of(settings, peers)
        # As on gRPC: the token, where one is set, guards all but health checks (the admin
        # token's holders pass too); the admin token alone guards only model control, which
        # the servicer checks.
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
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
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
                          start, _Call(request).peer())
        return response

    @web.middleware
    async def _answered(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token where one is in force (not for health checks, as on gRPC), and every
        error as the protocol's JSON error object with its HTTP status."""
        if self._tokens and not request.path.startswith(_HEALTH) and not any(
                holds(t, _Call(request)) for t in self._tokens):
            return _error(401, "header 'Authorization': a valid 'Bearer <token>' is required")
        try:
            return await handler(request)
        except web.HTTPException as e:  # no such route, a body over the limit
            return _error(e.status, e.reason)
        except Exception as e:
            status, message = status_of(e, f"{request.method} {request.path[:200]}")
            return _error(HTTP_STATUS.get(status, 500), message)

    async def _body(self, request: web.Request) -> bytes:
        """The request's body, read within its caller's share of the bodies still arriving
        (429 beyond it), --max-message-bytes (413) and --upload-timeout-s (408)."""
        budget, limit = self._peers.uploads, self._settings.max_message_bytes
        peer = self._peers.identify(_Call(request).peer())
        caller = peer.key if peer is not None else "?"
        chunks: list[bytes] = []
        held = 0
        try:
            async with asyncio.timeout(budget.timeout_s or None):
                async for chunk in request.content.iter_any():
                    if held + len(chunk) > limit:
                        raise web.HTTPRequestEntityTooLarge(
                            max_size=limit, actual_size=held + len(chunk),
                            reason=f"the body is over --max-message-bytes {limit}")
                    refusal = budget.charge(caller, len(chunk))
                    if refusal:
                        raise web.HTTPTooManyRequests(reason=refusal)
                    held += len(chunk)
                    chunks.append(chunk)
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason=f"the request body was still arriving after "
                                                f"{budget.timeout_s:g} s (--upload-timeout-s)"
                                         ) from None
        finally:
            budget.release(caller, held)
        return b"".join(chunks)

    async def _live(self, request: web.Request) -> web.Response:
        reply = await self._servicer.ServerLive(pb.ServerLiveRequest(), _Call(request))
        return web.Response(status=200 if reply.live else 400)

    async def _ready(self, request: web.Request) -> web.Response:
        reply = await self._servicer.ServerReady(pb.ServerReadyRequest(), _Call(request))
        return web.Response(status=200 if reply.ready else 400)

    async def _server_metadata(self, request: web.Request) -> web.Response:
        metadata = pb.ServerMetadataResponse()
        metadata.CopyFrom(await self._servicer.ServerMetadata(pb.ServerMetadataRequest(),
                                                              _Call(request)))
        # REST has no shared-memory endpoints: gRPC on the unix socket offers it.
        extensions = [e for e in metadata.extensions if e != "system_shared_memory"]
        del metadata.extensions[:]
        metadata.extensions.extend(extensions)
        return _json(metadata)

    async def _model_metadata(self, request: web.Request) -> web.Response:
        return _json(await self._servicer.ModelMetadata(pb.ModelMetadataRequest(
            name=request.match_info["model"], version=_version(request)), _Call(request)))

    async def _model_ready(self, request: web.Request) -> web.Response:
        reply = await self._servicer.ModelReady(pb.ModelReadyRequest(
            name=request.match_info["model"], version=_version(request)), _Call(request))
        return web.Response(status=200 if reply.ready else 400)

    async def _model_config(self, request: web.Request) -> web.Response:
        reply = await self._servicer.ModelConfig(pb.ModelConfigRequest(
            name=request.match_info["model"], version=_version(request)), _Call(request))
        return web.json_response(codec.as_json(reply.config))

    async def _statistics(self, request: web.Request) -> web.Response:
        return _json(await self._servicer.ModelStatistics(pb.ModelStatisticsRequest(
            name=request.match_info.get("model", ""), version=_version(request)),
            _Call(request)))

    async def _index(self, request: web.Request) -> web.Response:
        body = codec.parse_json(await self._body(request), "the request body")
        reply = await self._servicer.RepositoryIndex(pb.RepositoryIndexRequest(
            ready=body.get("ready") is True), _Call(request))
        return web.json_response([codec.as_json(m) for m in reply.models])

    async def _load(self, request: web.Request) -> web.Response:
        body = codec.parse_json(await self._body(request), "the request body")
        message = pb.RepositoryModelLoadRequest(model_name=request.match_info["model"])
        for key, value in codec.object_field(body.get("parameters", {}), "parameters").items():
            message.parameters[key].string_param = str(value)
        await self._servicer.RepositoryModelLoad(message, _Call(request))
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await self._servicer.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(
            model_name=request.match_info["model"]), _Call(request))
        return web.Response(status=200)

    async def _infer(self, request: web.Request) -> web.Response:
        body, length = await self._body(request), request.headers.get(codec.HEADER_LENGTH)
        where = (body, length, request.match_info["model"], _version(request))
        if codec.json_bytes(body, length) <= codec.INLINE_JSON_BYTES:
            message, binary = codec.infer_request(*where)
        else:  # off the event loop, in the caller's turn
            data, binary = await self._servicer.decoded(
                _Call(request), codec.serialized_infer_request, *where)
            message = pb.ModelInferRequest.FromString(data)
        body, header_length = codec.infer_response(
            await self._servicer.ModelInfer(message, _Call(request)), binary)
        if header_length is None:
            return web.Response(body=body, content_type="application/json")
        return web.Response(body=body, content_type="application/octet-stream",
                            headers={codec.HEADER_LENGTH: str(header_length)})


def _version(request: web.Request) -> str:
    return request.match_info.get("version", "").removeprefix("/versions/")


def _json(message) -> web.Response:
    return web.json_response(codec.as_json(message))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _ssl(settings: Settings) -> ssl.SSLContext | None:
    if not settings.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context
