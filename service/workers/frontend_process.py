"""One front-end process of a daemon with several (started by service/workers/frontends.py):

    python -m service.workers.frontend_process INDEX CHANNEL_FD ARENA_FD ARENA_BYTES OWNER_PID

It serves gRPC (and REST) on the daemon's ports (SO_REUSEPORT) and on its own unix socket,
decodes, validates and answers requests, and hands each to the device owner
(service/workers/owner_client.py). Its settings come from the owner as HETSERVE_* variables.
It ends with the owner: SIGTERM from the kernel (PR_SET_PDEATHSIG) or the channel closing,
whichever comes first."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys

from service import daemon_log
from service.contract import worker_socket
from service.core.dataplane import DataPlane
from service.core.metrics import Metrics
from service.edge.credentials import TokenFile
from service.edge.door import Peers
from service.edge.shared_memory import Caller, SharedMemoryRegions
from service.edge.uploads import UploadBudget
from service.errors import HetserveError, StartupError
from service.grpc.servicer import InferenceServicer
from service.grpc.transport import GrpcTransport
from service.http.transport import HttpTransport
from service.parent_death import end_with
from service.protocol.operations import Operations
from service.settings import Settings
from service.workers import messages as msg
from service.workers.arena import Arena
from service.workers.owner_client import Catalog, OwnerClient

log = logging.getLogger(__name__)


class EveryFrontend:
    """Registers a client's system shared memory region with every front-end: the owner
    reserves its name before this one answers OK, so that a name is registered once."""

    def __init__(self, regions: SharedMemoryRegions, owner: OwnerClient) -> None:
        self._regions, self._owner = regions, owner

    async def register(self, name: str, key: str, offset: int, byte_size: int,
                       caller: Caller) -> None:
        region = self._regions.open(name, key, offset, byte_size, caller)
        # a refusal drops the region, which closes it
        await self._owner.register(name, key, offset, byte_size, caller)
        self._regions.add(region)

    async def unregister(self, name: str, caller: Caller) -> None:
        self._regions.unregister(name, caller)
        await self._owner.unregister(name, caller)


async def _serve(settings: Settings, channel_fd: int, arena: Arena) -> None:
    catalog = Catalog()
    plane = DataPlane(catalog, settings.strict_readiness)
    regions = SharedMemoryRegions.from_settings(settings)
    serving: list[bool] = []  # once the server runs, a catalog turns health SERVING
    became_ready: set[asyncio.Task] = set()

    def on_catalog(message: msg.Catalog, payload: memoryview) -> None:
        catalog.update(owner, message, payload)
        plane.ready = True
        if serving:
            task = asyncio.create_task(grpc_transport.serving())
            became_ready.add(task)
            task.add_done_callback(became_ready.discard)

    def on_share(message: msg.Registered | msg.Released) -> None:  # from another front-end
        if isinstance(message, msg.Released):
            regions.drop(message.names)
            return
        try:  # the owner has reserved its name; the object is judged again, here
            regions.add(regions.open(message.name, message.key, message.offset,
                                     message.byte_size,
                                     Caller(message.caller, message.uid, message.gids),
                                     checked=False))
        except HetserveError as e:  # e.g. the client changed its object meanwhile
            log.warning("shared memory region %r registered at another front-end: %s",
                        message.name, e)

    owner = OwnerClient(arena, on_catalog, on_share)
    token = TokenFile(settings.token_file) if settings.token_file else None
    peers = Peers(UploadBudget.from_settings(settings))
    metrics = Metrics()  # what it observes reaches the owner's /metrics through files
    # Statistics are the owner's, which cover every front-end; loads and unloads go through it
    # once the caller is checked here.
    operations = Operations(plane, metrics, regions, peers, settings, control=owner,
                            statistics=owner, registry=EveryFrontend(regions, owner))
    grpc_transport = GrpcTransport(settings, token, InferenceServicer(operations), plane, peers,
                      reuseport=True)
    http = HttpTransport(settings, token, operations, peers, metrics, reuseport=True) \
        if settings.http_port else None
    await owner.open(socket.socket(fileno=channel_fd))
    reading = asyncio.create_task(owner.run())
    # Models loaded already (a front-end started again): ready before the first connection.
    await owner.first
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(regions.close)
        cleanup.callback(operations.decoding.close)
        await grpc_transport.start(cleanup)
        if http is not None:
            await http.start(cleanup)
        if plane.ready:
            await grpc_transport.serving()
        serving.append(True)
        owner.send(msg.Listening())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await asyncio.wait([asyncio.create_task(stop.wait()), reading],
                           return_when=asyncio.FIRST_COMPLETED)
        # REST keeps answering while the requests in flight finish, as gRPC does: ready 400,
        # inference 503 (UNAVAILABLE); then it closes too.
        await grpc_transport.drain(settings.shutdown_grace_s)
        if http:
            await http.drain()
        reading.cancel()


def main(argv: list[str]) -> int:
    index, channel_fd, arena_fd, arena_bytes, owner_pid = map(int, argv)
    end_with(owner_pid)
    settings = Settings.from_env()
    if settings.unix_socket:
        settings = dataclasses.replace(settings,
                                       unix_socket=worker_socket(settings.unix_socket, index))
    daemon_log.configure(settings.log_level, f"front-end {index}", settings.log_format)
    arena = Arena(arena_fd, arena_bytes)
    os.close(arena_fd)
    try:
        asyncio.run(_serve(settings, channel_fd, arena))
    except StartupError as e:
        print(f"hetserve front-end {index}: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as `hetserve serve` does
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
