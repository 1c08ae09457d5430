"""Builds and runs the daemon: gRPC on loopback TCP and a unix socket, health, metrics, signals."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from accelerators.power.meter import PowerMonitor
from service.auth import ExposureError, TokenInterceptor, check_exposure
from service.credentials import TlsFiles, TokenFile
from service.dataplane import DataPlane
from service.metrics import Metrics
from service.registry import ModelRegistry
from service.servicer import InferenceServicer
from service import handlers, socket_lock
from service.shared_memory import SharedMemoryRegions
from service.settings import Settings
from service.systemd import notify

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start as configured (a port or socket in use, a bad repository)."""


async def serve(settings: Settings) -> None:
    """Runs until SIGTERM or SIGINT, then drains: health turns NOT_SERVING, new requests are
    refused with UNAVAILABLE, and requests in flight get `shutdown_grace_s` to finish."""
    for module in filter(None, (m.strip() for m in settings.engine_modules.split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise StartupError(f"engine_modules: cannot import {module!r}: {e}") from e
    if not settings.model_repository.is_dir():
        raise StartupError(f"model repository {str(settings.model_repository)!r} is not a "
                           "directory")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise StartupError("tls_cert and tls_key: give both or neither")
    try:
        check_exposure(settings.grpc_host, bool(settings.tls_cert), bool(settings.token_file))
        token = TokenFile(settings.token_file) if settings.token_file else None
    except ExposureError as e:
        raise StartupError(str(e)) from e
    try:
        power = PowerMonitor(settings.power_sources, settings.power_model)
    except ValueError as e:
        raise StartupError(str(e)) from e
    async with contextlib.AsyncExitStack() as cleanup:  # also when start-up fails half-way
        if settings.unix_socket:  # first taken, last let go: devices close before a successor
            _own_socket(settings.unix_socket, cleanup)
        metrics = Metrics(power)
        registry = ModelRegistry(settings, metrics)
        cleanup.push_async_callback(registry.close)
        plane = DataPlane(registry)
        server = grpc.aio.server(interceptors=[TokenInterceptor(token)] if token else [], options=[
            # gRPC turns SO_REUSEPORT on by default: a second daemon would silently share the port.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
        ])
        regions = SharedMemoryRegions()
        cleanup.callback(regions.close)
        handlers.add_to_server(InferenceServicer(plane, metrics, regions), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for service in ("", handlers.SERVICE.full_name):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        reflection.enable_server_reflection(
            (handlers.SERVICE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        probes = _health_port(health_servicer, settings)

        addresses = _bind(server, settings)
        if settings.metrics_port:
            try:
                metrics.serve(settings.metrics_host, settings.metrics_port)
            except OSError as e:
                raise StartupError(f"cannot serve metrics on {settings.metrics_host}:"
                                   f"{settings.metrics_port}: {e.strerror}") from e
            addresses.append(f"http://{settings.metrics_host}:{settings.metrics_port}/metrics")
        await server.start()
        cleanup.push_async_callback(server.stop, 0)  # a no-op after the drain below
        if probes:
            await probes.start()
            cleanup.push_async_callback(probes.stop, 0)
        power.start()
        cleanup.callback(power.stop)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        await registry.load_all()
        plane.ready = True
        for service in ("", handlers.SERVICE.full_name):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %d model version(s) on %s", len(registry.loaded()), ", ".join(addresses))
        notify("READY=1", f"STATUS=serving {len(registry.loaded())} model version(s)")

        await stop.wait()
        grace_s = settings.shutdown_grace_s
        log.info("draining: refusing new requests, %.1f s for those in flight", grace_s)
        notify("STOPPING=1")
        started = loop.time()
        await health_servicer.enter_graceful_shutdown()  # every service NOT_SERVING
        if not await plane.drain(grace_s):
            log.warning("requests still in flight after %.1f s are cancelled", grace_s)
        await server.stop(max(grace_s - (loop.time() - started), 0.0))


def _bind(server: grpc.aio.Server, settings: Settings) -> list[str]:
    addresses = []
    if settings.grpc_port:
        target = f"{settings.grpc_host}:{settings.grpc_port}"
        _add_port(server, target, target, _tls(settings))
        addresses.append(target + (" (TLS)" if settings.tls_cert else ""))
    if settings.unix_socket:
        target = f"unix:{settings.unix_socket}"
        _add_port(server, target, str(settings.unix_socket), None)
        addresses.append(target)
    if not addresses:
        raise StartupError("neither grpc_port nor unix_socket is set: nothing to listen on")
    return addresses


def _tls(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert:
        return None
    try:  # the pair is re-read when its files change
        return TlsFiles(settings.tls_cert, settings.tls_key).credentials()
    except ExposureError as e:
        raise StartupError(str(e)) from None


def _add_port(server: grpc.aio.Server, target: str, shown: str,
              tls: grpc.ServerCredentials | None) -> None:
    try:
        bound = server.add_secure_port(target, tls) if tls else server.add_insecure_port(target)
    except RuntimeError as e:  # grpc raises RuntimeError("Failed to bind ...")
        raise StartupError(f"cannot listen on {shown}: address in use or not available") from e
    if not bound and not target.startswith("unix:"):
        raise StartupError(f"cannot listen on {shown}: address in use or not available")


def _own_socket(path: Path, cleanup: contextlib.AsyncExitStack) -> None:
    """Takes the socket's lock for the daemon's life, then removes a socket file left by a
    daemon that died without removing it; another daemon's live socket is never touched."""
    fd = socket_lock.hold(path)
    if fd is None:
        raise StartupError(f"cannot listen on {path}: another daemon is serving there "
                           f"(pid {socket_lock.holder(path)} holds {socket_lock.lock_path(path)})")
    cleanup.callback(os.close, fd)
    path.unlink(missing_ok=True)
    cleanup.callback(path.unlink, missing_ok=True)  # before the lock goes: never a successor's


def _health_port(servicer: health.aio.HealthServicer,
                 settings: Settings) -> grpc.aio.Server | None:
    """Health alone, in plaintext, for probes that send neither TLS nor a token (kubelet's)."""
    if not settings.health_port:
        return None
    probes = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, probes)
    target = f"{settings.metrics_host}:{settings.health_port}"
    _add_port(probes, target, target, None)
    return probes
