"""The daemon's gRPC server in one process: the KServe V2 servicer, health and reflection behind
the daemon's doors (loopback TCP, the unix socket: service/grpc/door.py), with TLS and the token
where configured; a drain that refuses new requests and lets those in flight finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.core.dataplane import DataPlane
from service.errors import StartupError
from service.grpc import handlers, unix_socket
from service.grpc.auth import TokenInterceptor
from service.grpc.credentials import ExposureError, TlsFiles, TokenFile, admin_token
from service.grpc.door import Bounds, Door, Peers, private_folder
from service.settings import Settings

log = logging.getLogger(__name__)


class GrpcFront:
    """A gRPC server on the daemon's addresses, in this process: the whole daemon with one
    worker, and each front-end process with several (then sharing the TCP port)."""

    def __init__(self, settings: Settings, token: TokenFile | None, servicer: object,
                 plane: DataPlane, peers: Peers, reuseport: bool = False) -> None:
        self._settings, self._plane, self.peers = settings, plane, peers
        # Front-ends share the port on purpose, once their owner holds it
        # (service/workers/frontends.py); a second daemon must not share it silently.
        self._reuseport = reuseport
        self._server = grpc.aio.server(
            interceptors=[TokenInterceptor(token, peers, admin_token(settings))]
            if token else [], options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", settings.max_message_bytes),
            ])
        handlers.add_to_server(servicer, self._server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (handlers.SERVICE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME),
            self._server)

    async def start(self, cleanup: contextlib.AsyncExitStack) -> list[str]:
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        inner = cleanup.enter_context(private_folder())
        doors = self._doors(inner)
        for door in doors:
            add_port(self._server, f"unix:{door.inner}", str(door.inner),
                     _tls(self._settings) if door.listener == "tcp" else None)
        await self._server.start()
        cleanup.push_async_callback(self._server.stop, 0)  # a no-op after a drain
        addresses = []
        for door in doors:  # clients may connect once gRPC listens behind the doors
            addresses.append(await self._open(door))
            cleanup.callback(door.close)
        return addresses

    def _doors(self, inner: Path) -> list[Door]:
        s = self._settings
        bounds = Bounds(s.max_connections_per_peer, s.max_connections)
        doors = [Door("tcp", inner / "tcp.sock", bounds, self.peers, tls=bool(s.tls_cert))
                 ] if s.grpc_port else []
        if s.unix_socket:
            doors.append(Door("unix", inner / "unix.sock", bounds, self.peers))
        if not doors:
            raise StartupError("neither grpc_port nor unix_socket is set: nothing to listen on")
        return doors

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
        await set_health(self.health, health_pb2.HealthCheckResponse.SERVING)

    async def drain(self, grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self.health.enter_graceful_shutdown()  # every service NOT_SERVING
        if not await self._plane.drain(grace_s):
            log.warning("requests still in flight after %.1f s are cancelled", grace_s)
        await self._server.stop(max(grace_s - (loop.time() - started), 0.0))


async def set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for service in ("", handlers.SERVICE.full_name):
        await servicer.set(service, status)


def _tls(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert:
        return None
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
