"""The daemon's gRPC servers in one process: the KServe V2 servicer, health and reflection behind
the daemon's doors (loopback TCP, the unix socket: service/edge/door.py), a server for each so
that TCP clients cannot take the socket users' share (service/grpc/limits.py), with TLS and the
token on TCP where configured; a drain that refuses new requests and lets those in flight
finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service import unix_socket
from service.core.dataplane import DataPlane
from service.edge.access_log import AccessLog
from service.edge.credentials import ExposureError, TlsFiles, TokenFile, admin_token
from service.edge.door import Bounds, Door, Peers, private_folder
from service.errors import StartupError
from service.grpc import handlers
from service.grpc.auth import TokenInterceptor
from service.grpc.limits import Listener, RpcLimit, backstop, server_options
from service.settings import Settings

log = logging.getLogger(__name__)


class GrpcTransport:
    """The daemon's gRPC servers in this process, one per listener with its own limits and door:
    the whole daemon with one worker, and each front-end process with several (then sharing the
    TCP port)."""

    def __init__(self, settings: Settings, token: TokenFile | None, servicer: object,
                 plane: DataPlane, peers: Peers, reuseport: bool = False) -> None:
        self._settings, self._plane, self._peers = settings, plane, peers
        self._access = AccessLog.of(settings, peers)
        # Front-ends share the port on purpose, once their owner holds it
        # (service/workers/frontends.py); a second daemon must not share it silently.
        self._reuseport = reuseport
        self.health = health.aio.HealthServicer()
        self._servers: dict[Listener, grpc.aio.Server] = {}
        if settings.grpc_port:  # the socket's users need no token
            tcp = Listener.tcp(settings)
            self._servers[tcp] = self._server(
                tcp, servicer, [TokenInterceptor(token, admin_token(settings))] if token else [])
        if settings.unix_socket:
            socket = Listener.socket(settings)
            self._servers[socket] = self._server(socket, servicer, [])

    def _server(self, listener: Listener, servicer: object,
                interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
        server = grpc.aio.server(
            interceptors=[*interceptors, RpcLimit(listener, self._peers)],
            options=server_options(self._settings), maximum_concurrent_rpcs=backstop(listener))
        handlers.add_to_server(servicer, server, self._access)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (handlers.SERVICE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    async def start(self, cleanup: contextlib.AsyncExitStack) -> list[str]:
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        inner = cleanup.enter_context(private_folder())
        doors = []
        for listener, server in self._servers.items():
            door = Door(listener.door, inner / f"{listener.door}.sock", Bounds(
                self._settings.max_connections_per_peer, listener.max_connections,
                listener.connections_flag, self._settings.max_stream_resets),
                self._peers, tls=listener.door == "tcp" and bool(self._settings.tls_cert))
            add_port(server, f"unix:{door.inner}", str(door.inner),
                     _tls(self._settings) if door.tls else None)
            await server.start()
            cleanup.push_async_callback(server.stop, 0)  # a no-op after a drain
            doors.append(door)
        addresses = []
        for door in doors:  # clients may connect once gRPC listens behind every door
            addresses.append(await self._open(door))
            cleanup.callback(door.close)
        return addresses

    async def _open(self, door: Door) -> str:
        s = self._settings
        if door.listener == "unix":
            assert s.unix_socket is not None
            try:
                await door.open_unix(s.unix_socket)
            except OSError as e:
                raise StartupError(f"cannot listen on {s.unix_socket}: {e.strerror}") from e
            # Bound already: its mode says who may connect before anyone can.
            unix_socket.restrict(s.unix_socket, unix_socket.group_id(s.socket_group))
            return f"unix:{s.unix_socket}"
        target = f"{s.grpc_host}:{s.grpc_port}"
        try:
            await door.open_tcp(s.grpc_host, s.grpc_port, self._reuseport)
        except OSError as e:
            raise StartupError(f"cannot listen on {target}: address in use or not "
                               "available") from e
        return target + (" (TLS)" if s.tls_cert else "")

    async def serving(self) -> None:
        """Models are loaded, or what serves changed: health says whether the daemon is ready."""
        await set_health(self.health, health_status(self._plane))

    async def drain(self, grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self.health.enter_graceful_shutdown()  # every service NOT_SERVING
        if not await self._plane.drain(grace_s):
            log.warning("requests still in flight after %.1f s are cancelled", grace_s)
        left = max(grace_s - (loop.time() - started), 0.0)
        await asyncio.gather(*(server.stop(left) for server in self._servers.values()))


def health_status(plane: DataPlane) -> int:
    """SERVING while the data plane is ready (with strict readiness: every model asked for)."""
    return health_pb2.HealthCheckResponse.SERVING if plane.server_ready() else \
        health_pb2.HealthCheckResponse.NOT_SERVING


async def set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for service in ("", handlers.SERVICE.full_name):
        await servicer.set(service, status)


def _tls(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert:
        return None
    assert settings.tls_key is not None  # serve() checked: both or neither
    try:  # the pair is re-read when its files change
        return TlsFiles(settings.tls_cert, settings.tls_key).credentials()
    except ExposureError as e:
        raise StartupError(str(e)) from None


def add_port(server: grpc.aio.Server, target: str, shown: str,
              tls: grpc.ServerCredentials | None) -> None:
    try:
        bound = server.add_secure_port(target, tls) if tls else server.add_insecure_port(target)
    except RuntimeError as e:  # grpc raises RuntimeError("Failed to bind ...")
        raise StartupError(f"cannot listen on {shown}: address in use or not available") from e
    if not bound and not target.startswith("unix:"):
        raise StartupError(f"cannot listen on {shown}: address in use or not available")
