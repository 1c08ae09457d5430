"""Several front-end processes behind the daemon's addresses (`--workers N`, N > 1).

This process stays the device owner: it loads the models, owns every device, batches across all
front-ends and serves /metrics. The N front-ends (service/workers/frontend_process.py) do gRPC,
decoding, validation, auth and replies; they share the TCP port through SO_REUSEPORT and each serves
its own unix socket (service.contract.worker_socket). Each hands requests to the owner through its
shared-memory arena and a socketpair (service/workers/owner_channel.py). Clients' shared memory
region names are reserved here, for every front-end: a name is registered once, whichever front-end
a client reaches. Models are loaded and unloaded here, at a front-end's request too, and every
front-end is sent the new catalog the moment a change takes traffic.

The port is guarded here first: a probe bind without SO_REUSEPORT fails when any other program
or daemon holds it, and a bound, never-listening SO_REUSEPORT socket then keeps it for the
daemon's life (no other program takes it while a front-end restarts; another daemon's probe
fails). A front-end that dies is started again, and only its own requests in flight fail; the
front-ends end with this process (PR_SET_PDEATHSIG), and their requests waiting on it fail
UNAVAILABLE at once. Restarts back off per cause: one that cannot start waits longer each time;
one that served and then died (killed, crashed) comes back after the first wait, every time, so
that what one client did to it never keeps the others waiting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health, health_pb2
from prometheus_client import multiprocess

from service.contract import worker_socket
from service.core.dataplane import DataPlane
from service.core.metrics import Metrics
from service.core.model_control import ModelControl
from service.edge.shared_memory import SHM_ROOT, Limits, RegionNames
from service.errors import HetserveError, StartupError
from service.grpc.transport import health_status, set_health
from service.setting_names import setting_variables
from service.settings import Settings
from service.workers import arena, owner_channel
from service.workers import messages as msg
from service.workers.arena import Arena
from service.workers.owner_channel import OwnerSide

log = logging.getLogger(__name__)
# Wait before starting a dead front-end again: the first, doubled while it cannot start.
_RESTART_S = (0.5, 30.0)
_EXIT_MARGIN_S = 5.0  # beyond the grace, for front-ends to stop before they are killed


class Frontends:
    def __init__(self, settings: Settings, count: int, plane: DataPlane, metrics: Metrics,
                 control: ModelControl) -> None:
        self._settings, self._count = settings, count
        self._plane, self._metrics, self._control = plane, metrics, control
        self._controls: set[asyncio.Task] = set()  # loads and unloads front-ends asked for
        self.health = health.aio.HealthServicer()  # the daemon's, for --health-port
        self._arena_size = arena.size_for(settings.max_message_bytes, count)
        self._sides: dict[int, OwnerSide] = {}
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._slots: list[asyncio.Task] = []
        self._started: list[asyncio.Future] = []
        self._catalog: tuple[msg.Catalog, bytes] | None = None
        self._names = RegionNames(Limits.from_settings(settings))  # clients' regions
        self._shared: dict[str, msg.Registered] = {}  # for front-ends started later
        self._stopping = False
        self._env: dict[str, str] = {}
        self._metrics_dir = ""  # the front-ends' metric files

    async def start(self, cleanup: contextlib.AsyncExitStack) -> list[str]:
        """Holds the addresses, starts every front-end and waits until each listens."""
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING)
        s = self._settings
        addresses = []
        if s.grpc_port:
            for held in _hold_port(s.grpc_host, s.grpc_port):
                cleanup.callback(held.close)
            addresses.append(f"{s.grpc_host}:{s.grpc_port}" + (" (TLS)" if s.tls_cert else ""))
        if s.http_port:
            for held in _hold_port(s.grpc_host, s.http_port):
                cleanup.callback(held.close)
            addresses.append(f"http{'s' if s.tls_cert else ''}://{s.grpc_host}:{s.http_port}")
        if s.unix_socket:
            _remove_worker_sockets(s.unix_socket)  # ours to remove: this daemon holds the lock
            cleanup.callback(_remove_worker_sockets, s.unix_socket)
            addresses.append(f"unix:{s.unix_socket} and {self._count - 1} beside it")
        # The front-ends' request metrics reach this process's /metrics through their files.
        self._metrics_dir = cleanup.enter_context(
            tempfile.TemporaryDirectory(prefix="hetserve-"))
        for served_there in self._metrics.front_end:
            self._metrics.registry.unregister(served_there)
        multiprocess.MultiProcessCollector(self._metrics.registry, path=self._metrics_dir)
        settings = dataclasses.replace(s, workers=1)
        # Only the settings as resolved here: a variable another name of a setting (HETSERVE_PORT
        # beside HETSERVE_GRPC_PORT) would disagree with them there.
        inherited = setting_variables()
        self._env = {**{k: v for k, v in os.environ.items() if k not in inherited},
                     "PROMETHEUS_MULTIPROC_DIR": self._metrics_dir, **settings.to_env()}
        cleanup.push_async_callback(self._stop_all)
        loop = asyncio.get_running_loop()
        self._started = [loop.create_future() for _ in range(self._count)]
        self._slots = [asyncio.create_task(self._keep(i), name=f"frontend-{i}")
                       for i in range(self._count)]
        await asyncio.gather(*self._started)
        return addresses

    async def serving(self) -> None:
        """Models are loaded: every front-end (and each one started later) gets the catalog,
        and again whenever what serves changes."""
        self._publish()
        self._control.listeners.append(self._publish)
        await set_health(self.health, health_status(self._plane))

    def _publish(self) -> None:
        self._catalog = owner_channel.catalog(self._plane)
        for side in self._sides.values():
            side.send(*self._catalog)

    async def drain(self, grace_s: float) -> None:
        """Every front-end drains (refuses new requests, finishes those in flight) while this
        process still runs their batches; then this process drains what is left."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self.health.enter_graceful_shutdown()
        self._stopping = True
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError):  # exited already (systemd's SIGTERM)
                process.send_signal(signal.SIGTERM)
        await asyncio.wait(self._slots, timeout=grace_s + _EXIT_MARGIN_S)
        if not await self._plane.drain(max(grace_s - (loop.time() - started), 0.0)):
            log.warning("requests still in flight after %.1f s are cancelled", grace_s)

    async def _stop_all(self) -> None:
        self._stopping = True
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await asyncio.gather(*self._slots, return_exceptions=True)

    async def _keep(self, index: int) -> None:
        """Runs front-end `index`, and starts it again whenever it dies."""
        delay = _RESTART_S[0]
        while True:
            listened = False
            code: int | str  # the exit code, or why there is none
            try:
                code, listened = await self._run(index)
            except Exception as e:  # could not be started (/dev/shm full, no fork): try again
                log.exception("front-end %d could not be started", index)
                code = f"none ({type(e).__name__}: {e})"
            if not self._started[index].done():
                self._started[index].set_exception(StartupError(
                    f"front-end {index} exited with code {code} before it listened (its "
                    "errors are logged above)"))
                return
            if self._stopping:
                return
            delay = _RESTART_S[0] if listened else min(delay * 2, _RESTART_S[1])
            log.warning("front-end %d exited with code %s; starting it again in %.1f s",
                        index, code, delay)
            await asyncio.sleep(delay)
            if self._stopping:  # a SIGTERM to every process of the daemon (systemd) raced
                return

    async def _run(self, index: int) -> tuple[int, bool]:
        """Starts front-end `index` with a fresh arena and channel; its exit code, and whether
        it listened."""
        if self._settings.unix_socket:  # a dead front-end's socket file is stale
            worker_socket(self._settings.unix_socket, index).unlink(missing_ok=True)
        side, process = await start_frontend(
            self._plane, self._arena_size, lambda channel_fd, arena_fd: [
                sys.executable, "-m", "service.workers.frontend_process", str(index),
                str(channel_fd), str(arena_fd), str(self._arena_size), str(os.getpid())],
            self._requested, self._env)
        for registered in self._shared.values():  # known before it listens: sent first
            side.send(registered)
        side.send(*(self._catalog or (msg.Loading(), b"")))
        self._sides[index], self._processes[index] = side, process
        serving = asyncio.create_task(side.serve())
        announce = asyncio.create_task(self._announce(index, side))
        try:
            return await process.wait(), side.listening.is_set()
        finally:
            announce.cancel()
            await serving  # the channel ends with the process: its requests are cancelled
            del self._sides[index], self._processes[index]
            # Its requests are no longer pending (livesum gauges drop a dead process's file).
            multiprocess.mark_process_dead(process.pid, self._metrics_dir)

    def _requested(self, origin: OwnerSide, request: msg.ForDaemon) -> None:
        if isinstance(request, msg.Load | msg.Unload):
            task = asyncio.create_task(self._load_or_unload(origin, request))
            self._controls.add(task)
            task.add_done_callback(self._controls.discard)
        else:
            self._share(origin, request)

    async def _load_or_unload(self, origin: OwnerSide, request: msg.Load | msg.Unload) -> None:
        """Answered once the change serves: every front-end has been sent the catalog before
        the answer (on each channel, in that order)."""
        try:
            if isinstance(request, msg.Load):
                await self._control.load(request.name, request.parameters)
            else:
                await self._control.unload(request.name)
        except Exception as e:  # refused or failed: that caller's answer
            origin.fail(request.id, e)
        else:
            origin.send(msg.Done(request.id))

    def _share(self, origin: OwnerSide, request: msg.Register | msg.Unregister) -> None:
        """A client registers or unregisters a shared memory region at one front-end: the name is
        reserved (or released) here first, then every other front-end does the same, and one
        started later learns the regions registered, so that a region is the daemon's,
        whichever front-end a connection reaches."""
        passed: msg.Registered | msg.Released
        if isinstance(request, msg.Register):
            try:
                self._names.reserve(request.name, request.caller)
            except HetserveError as e:  # taken, or a limit reached: that front-end refuses
                origin.fail(request.id, e)
                return
            self._shared[request.name] = passed = msg.Registered(
                request.name, request.key, request.offset, request.byte_size, request.caller,
                request.uid, request.gids)
        else:
            released = self._names.release(request.name, request.caller)
            for name in released:
                del self._shared[name]
            passed = msg.Released(released)
        for side in self._sides.values():
            if side is not origin:
                side.send(passed)
        origin.send(msg.Done(request.id))  # after the others, on each channel

    async def _announce(self, index: int, side: OwnerSide) -> None:
        await side.listening.wait()
        if not self._started[index].done():
            self._started[index].set_result(None)


async def start_frontend(plane: DataPlane, arena_size: int,
                         command: Callable[[int, int], list[str]],
                         on_request: Callable[[OwnerSide, msg.ForDaemon], None],
                         env: dict[str, str] | None = None
                         ) -> tuple[OwnerSide, asyncio.subprocess.Process]:
    """A front-end process with a fresh arena and channel to `plane`, and this process's side
    of them: `command(channel_fd, arena_fd)` is its command line (the descriptors it inherits).
    The arena's name is unlinked once both processes hold it, so that no death can leak it."""
    key, fd = arena.create(arena_size)
    here, there = socket.socketpair()
    try:
        inputs = Arena(fd, arena_size)  # where the owner reads its requests' inputs
        process = await asyncio.create_subprocess_exec(
            *command(there.fileno(), fd), pass_fds=(there.fileno(), fd), env=env)
    except BaseException:
        here.close()
        raise
    finally:
        there.close()
        os.close(fd)
        (SHM_ROOT / key).unlink()  # both hold it now (or nobody)
    side = OwnerSide(plane, inputs, on_request)
    await side.open(here)
    return side, process


def _hold_port(host: str, port: int) -> list[socket.socket]:
    """Sockets that keep `host:port` for this daemon's front-ends (see the module's doc)."""
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
            keeper = socket.socket(family, kind, proto)
            held.append(keeper)
            keeper.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            keeper.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            keeper.bind(address)
    except OSError as e:
        for keeper in held:
            keeper.close()
        raise StartupError(f"cannot listen on {host}:{port}: address in use or not available "
                           f"({e.strerror})") from e
    return held


def _remove_worker_sockets(socket_path: Path) -> None:
    """The sockets of front-ends beside the daemon's own, also those of an earlier daemon that
    had more; the daemon's own socket is _own_socket's (service/ops/server.py)."""
    for path in socket_path.parent.glob(socket_path.name + ".*"):
        if path.suffix[1:].isdigit():
            path.unlink(missing_ok=True)
