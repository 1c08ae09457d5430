"""How many requests one device owner (`--workers N`) can serve, and its CPU per request, with
gRPC out of the way: simulated front-ends, each a process speaking the owner's channel as a real
front-end does (service/workers/owner_channel.py's Channel, typed messages, inputs in a
shared-memory arena), drive the owner's real OwnerSide, data plane, batcher, router and worker
on bench/null_engine.py, in this process.

Each load point keeps a number of requests in flight, split among the front-ends; a front-end
sends a new request whenever one is answered, so its frames carry what it sent in one
event-loop iteration, as a real front-end's do. With one request in flight the owner answers
one request per wake-up (its cost per round trip); with many it stays busy and its req/s is
what it can feed a node (target: 15k requests/s, 60 µs of CPU per request).

    .venv/bin/python -m bench.owner_capacity [--seconds 3] [--frontends 2] \
        [--in-flight 1 4 16 64 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from service.core.dataplane import DataPlane
from service.workers import messages as msg
from service.workers import owner_channel
from service.workers.arena import Arena
from service.workers.frontends import start_frontend
from service.workers.owner_channel import Channel, OwnerSide

ROOT = Path(__file__).resolve().parent.parent

MODEL = "mnist_cnn"
IMAGE = np.zeros((1, 1, 28, 28), np.float32)
ARENA_BYTES = 1 << 20


# --- a simulated front-end (its own process) ----------------------------------------------------

async def _frontend(channel_fd: int, arena_fd: int, in_flight: int) -> None:
    """Keeps `in_flight` requests at the owner until it closes the channel."""
    inputs = Arena(arena_fd, ARENA_BYTES)
    block = inputs.alloc(IMAGE.nbytes)  # every request reads the same image
    inputs.view(block)[:] = IMAGE.reshape(-1).view(np.uint8)
    place = [("image", IMAGE.dtype.str, IMAGE.shape, block[0], IMAGE.nbytes)]
    ids = iter(range(1 << 62))
    ready = asyncio.get_running_loop().create_future()

    def infer() -> None:
        channel.send(msg.Infer(next(ids), MODEL, 1, ready.result(), 1, place, 0, 0, None, "",
                               False))

    def on_message(message: msg.ToFrontend, _: memoryview) -> None:
        match message:
            case msg.Catalog() if not ready.done():
                ready.set_result(message.generations[0])  # what requests were validated for
            case msg.Reply():
                infer()
            case msg.Failed():
                sys.exit(f"owner refused a request: {message.status} {message.message}")

    channel = await Channel.open(socket.socket(fileno=channel_fd), msg.ToFrontend, on_message)
    await ready
    channel.send(msg.Listening())
    for _ in range(in_flight):
        infer()
    await channel.closed.wait()


# --- the owner (this process) -------------------------------------------------------------------

class Owner:
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        self._catalog = owner_channel.catalog(plane)

    async def start(self, in_flight: int) -> tuple[OwnerSide, asyncio.subprocess.Process]:
        side, process = await start_frontend(
            self._plane, ARENA_BYTES, lambda channel_fd, arena_fd: [
                sys.executable, "-m", "bench.owner_capacity", "--frontend", str(channel_fd),
                str(arena_fd), str(in_flight)], lambda *_: None)
        side.send(*self._catalog)
        return side, process

    async def point(self, in_flight: int, frontends: int, seconds: float) -> dict:
        """req/s, the owner's CPU (this process, every thread) per request, and requests per
        batch, with `in_flight` requests kept at the owner by `frontends` front-ends."""
        shares = [in_flight // frontends + (i < in_flight % frontends) for i in range(frontends)]
        started = [await self.start(share) for share in shares if share]
        serving = [asyncio.create_task(side.serve()) for side, _ in started]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.listening.wait() for s, _ in started)), 30)
            await asyncio.sleep(min(1.0, seconds / 3))  # warm: every front-end at full pace
            stats = self._plane.models.get(MODEL).stats
            before = (stats.success.count, stats.execution_count, time.process_time(),
                      time.monotonic())
            await asyncio.sleep(seconds)
            after = (stats.success.count, stats.execution_count, time.process_time(),
                     time.monotonic())
            if any(process.returncode is not None for _, process in started):
                raise RuntimeError("a simulated front-end exited during the point (its error "
                                   "is above)")
        finally:
            for side, _ in started:
                side.channel.close()
            await asyncio.gather(*serving, return_exceptions=True)
            for _, process in started:
                await asyncio.wait_for(process.wait(), 10)
        answered, batches, cpu_s, wall_s = (b - a for a, b in zip(before, after))
        return {"in_flight": in_flight, "rps": answered / wall_s,
                "cpu_us": 1e6 * cpu_s / max(answered, 1),
                "per_batch": answered / max(batches, 1), "cores": cpu_s / wall_s}


async def _owner(args: argparse.Namespace) -> list[dict]:
    from bench.request_path import data_plane  # registers null:<device>
    from bench.serving import model_repository

    with tempfile.TemporaryDirectory() as tmp:
        async with data_plane(model_repository(Path(tmp), devices="null:cpu0")) as (plane, _, _):
            owner = Owner(plane)
            return [await owner.point(n, args.frontends, args.seconds) for n in args.in_flight]


def main() -> None:
    if sys.argv[1:2] == ["--frontend"]:
        asyncio.run(_frontend(*map(int, sys.argv[2:5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each load point")
    parser.add_argument("--frontends", type=int, default=2, help="simulated front-ends")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16, 64, 256],
                        help="requests kept at the owner, split among the front-ends")
    args = parser.parse_args()
    points = asyncio.run(_owner(args))
    print(f"One device owner, {args.frontends} simulated front-ends, null engine "
          f"({os.cpu_count()} CPUs):\n")
    print("| requests in flight | req/s | owner CPU µs/req | requests per batch | owner cores |")
    print("|---:|---:|---:|---:|---:|")
    for p in points:
        print(f"| {p['in_flight']} | {p['rps']:.0f} | {p['cpu_us']:.1f} | "
              f"{p['per_batch']:.2f} | {p['cores']:.2f} |")


if __name__ == "__main__":
    main()
