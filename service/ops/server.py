"""Builds and runs the daemon: gRPC on loopback TCP and a unix socket (in this process, or in
several front-end processes: service/workers/frontends.py), health, metrics, signals."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import resource
import signal

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from accelerators import icd
from accelerators.power.meter import SAMPLE_S, PowerMonitor
from accelerators.safe_files import UnsafeFolderError
from service import unix_socket
from service.core.dataplane import DataPlane
from service.core.metrics import Metrics
from service.core.model_control import ModelControl
from service.core.model_control import check_settings as check_model_control
from service.core.power_budget import BUDGET_SAMPLE_S, PowerBudget, check_budget
from service.core.registry import ModelRegistry
from service.edge.credentials import ExposureError, TokenFile, admin_token
from service.edge.door import Peers
from service.edge.shared_memory import SharedMemoryRegions
from service.edge.uploads import UploadBudget
from service.errors import StartupError
from service.grpc.auth import check_exposure
from service.grpc.servicer import InferenceServicer
from service.grpc.transport import GrpcTransport, add_port, health_status, set_health
from service.http.transport import HttpTransport
from service.ops.systemd import notify
from service.protocol.operations import Operations
from service.settings import Settings
from service.workers.frontends import Frontends

log = logging.getLogger(__name__)


def default_workers() -> int:
    """Front-end processes when --workers is 0: half the CPUs this process may run on, at most
    8, the other half left to the device owner's batching and engines; so 1 (one process, no
    channel) up to 3 CPUs."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


async def serve(settings: Settings) -> None:
    """Runs until SIGTERM or SIGINT, then drains: health turns NOT_SERVING, new requests are
    refused with UNAVAILABLE, and requests in flight get `shutdown_grace_s` to finish."""
    token, power = _checked(settings)
    workers = settings.workers or default_workers()
    _raise_descriptor_limit()
    async with contextlib.AsyncExitStack() as cleanup:  # also when start-up fails half-way
        if settings.unix_socket:  # first taken, last let go: devices close before a successor
            _own_socket(settings, cleanup)
        metrics = Metrics(power)
        budget = None if settings.power_budget_w is None else \
            PowerBudget(settings.power_budget_w, power, metrics.registry)
        registry = ModelRegistry(settings, metrics, budget)
        cleanup.push_async_callback(registry.close)
        control = ModelControl(registry, settings)
        cleanup.push_async_callback(control.close)  # before the registry closes
        plane = DataPlane(registry, settings.strict_readiness)
        if workers == 1:
            regions = SharedMemoryRegions.from_settings(settings)
            cleanup.callback(regions.close)
            peers = Peers(UploadBudget.from_settings(settings))
            operations = Operations(plane, metrics, regions, peers, settings, control)
            cleanup.callback(operations.decoding.close)
            listeners: GrpcTransport | Frontends = GrpcTransport(settings, token,
                                                     InferenceServicer(operations), plane, peers)
            http = HttpTransport(settings, token, operations, peers, metrics) \
                if settings.http_port else None
        else:
            listeners, http = Frontends(settings, workers, plane, metrics, control), None
        addresses = await listeners.start(cleanup)
        if http is not None:
            addresses.append(await http.start(cleanup))
        probes = _health_port(listeners.health, settings)
        if settings.metrics_port:
            try:
                metrics.serve(settings.metrics_host, settings.metrics_port)
            except OSError as e:
                raise StartupError(f"cannot serve metrics on {settings.metrics_host}:"
                                   f"{settings.metrics_port}: {e.strerror}") from e
            addresses.append(f"http://{settings.metrics_host}:{settings.metrics_port}/metrics")
        if probes:
            await probes.start()
            cleanup.push_async_callback(probes.stop, 0)
        power.start()
        cleanup.callback(power.stop)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        await control.start()
        failed = registry.failed()
        if settings.exit_on_error and failed:
            raise StartupError("--exit-on-error: models failed to load: " + "; ".join(
                f"{name!r}: {' '.join(reason.split())}" for name, reason in sorted(failed.items())))
        if budget is not None:
            try:
                check_budget(budget.budget_w, power)
            except ValueError as e:
                raise StartupError(str(e)) from None
        plane.ready = True
        await listeners.serving()
        if settings.strict_readiness:
            _follow_readiness(listeners.health, plane, control)
        log.info("serving %d model version(s) on %s", len(registry.loaded()), ", ".join(addresses))
        notify("READY=1", f"STATUS=serving {len(registry.loaded())} model version(s)")

        await stop.wait()
        log.info("draining: refusing new requests, %.1f s for those in flight",
                 settings.shutdown_grace_s)
        notify("STOPPING=1")
        # REST keeps answering while the requests in flight finish, as gRPC does: ready 400,
        # inference 503 (UNAVAILABLE); then it closes too.
        await listeners.drain(settings.shutdown_grace_s)
        if http:
            await http.drain()
    log.info("stopped: the listeners closed, the devices released")


def _follow_readiness(servicer: health.aio.HealthServicer, plane: DataPlane,
                      control: ModelControl) -> None:
    """Health changes whenever what serves does (a model loaded, failed or unloaded later),
    since strict readiness depends on it; draining sets it apart."""
    pending: set[asyncio.Task] = set()

    def refresh() -> None:
        if plane.ready:
            task = asyncio.create_task(set_health(servicer, health_status(plane)))
            pending.add(task)
            task.add_done_callback(pending.discard)
    control.listeners.append(refresh)


def _checked(settings: Settings) -> tuple[TokenFile | None, PowerMonitor]:
    """Start-up checks that need no port: engines, repository, TLS, exposure, power."""
    for module in filter(None, (m.strip() for m in settings.engine_modules.split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise StartupError(f"engine_modules: cannot import {module!r}: {e}") from e
    if not settings.model_repository.is_dir():
        raise StartupError(f"--models: {str(settings.model_repository)!r} is not a directory; "
                           "expected a Triton-layout model repository")
    try:  # before any engine loads a runtime through it
        icd.check_trusted()
    except UnsafeFolderError as e:
        raise StartupError(str(e)) from None
    if not (settings.grpc_port or settings.unix_socket or settings.http_port):
        raise StartupError("--port, --socket and --http-port are all off: nothing to listen on")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise StartupError("--tls-cert and --tls-key: give both or neither")
    check_model_control(settings)
    if settings.workers < 0:
        raise StartupError(f"workers: {settings.workers} received, expected 0 (chosen from "
                           "the CPUs) or a number of front-end processes")
    for name in ("max_shm_regions", "max_shm_regions_per_client", "max_stream_inflight",
                 "max_rpcs_tcp", "max_rpcs_socket", "max_rpcs_per_caller", "max_connections_tcp",
                 "max_connections_socket", "max_streams_per_connection",
                 "max_connections_per_peer", "max_stream_resets"):
        if getattr(settings, name) < 1:
            raise StartupError(f"{name}: {getattr(settings, name)} received, expected at "
                               "least 1")
    for name in ("grpc_port", "http_port", "metrics_port", "health_port"):
        if not 0 <= getattr(settings, name) <= 65535:
            raise StartupError(f"{name}: {getattr(settings, name)} received, expected a TCP "
                               "port, 1 to 65535 (0: off)")
    for name in ("stream_idle_s", "connection_idle_s", "connection_age_s",
                 "connection_age_grace_s", "min_ping_interval_s", "shutdown_grace_s"):
        if not getattr(settings, name) >= 0:
            raise StartupError(f"{name}: {getattr(settings, name):g} received, expected "
                               "seconds (0: none)")
    try:
        unix_socket.group_id(settings.socket_group)
    except ValueError as e:
        raise StartupError(str(e)) from None
    try:
        check_exposure(settings.grpc_host, bool(settings.tls_cert), bool(settings.token_file))
        token = TokenFile(settings.token_file) if settings.token_file else None
        admin_token(settings)  # readable and not empty
    except ExposureError as e:
        raise StartupError(str(e)) from e
    budget = settings.power_budget_w
    if budget is not None and not budget > 0:
        raise StartupError(f"power_budget_w: {budget:g} W received, expected watts above the "
                           "node's idle power")
    try:
        return token, PowerMonitor(settings.power_sources, settings.power_model,
                                   interval_s=SAMPLE_S if budget is None else BUDGET_SAMPLE_S)
    except ValueError as e:
        raise StartupError(str(e)) from e


def _raise_descriptor_limit() -> None:
    """Up to the hard limit: each client region keeps a descriptor open (within
    --max-shm-regions), beside every connection's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _own_socket(settings: Settings, cleanup: contextlib.AsyncExitStack) -> None:
    """Checks the socket's folder, takes the socket's lock for the daemon's life, then removes a
    socket file left by a daemon that died without removing it; another daemon's live socket is
    never touched."""
    path = settings.unix_socket
    assert path is not None  # serve() calls this only with a socket
    try:
        unix_socket.prepare_folder(path, unix_socket.group_id(settings.socket_group))
    except unix_socket.FolderError as e:
        raise StartupError(str(e)) from None
    fd = unix_socket.hold(path)
    if fd is None:
        raise StartupError(f"cannot listen on {path}: another daemon is serving there "
                           f"(pid {unix_socket.holder(path)} holds {unix_socket.lock_path(path)})")
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
    add_port(probes, target, target, None)
    return probes
