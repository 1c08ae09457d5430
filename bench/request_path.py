"""hetserve's own cost per request, without gRPC and without a model: requests go through the
servicer's path (decode, validate, queue, batch, split, encode, metrics, statistics) to an
engine that returns zeros. Two measurements:

- under load: `--concurrency` clients back to back, the CPU per request;
- a lone request: one client, its requests further apart than the batching window (as at
  concurrency 1 over gRPC, each runs in the call that queues it), the median time of one, hot
  and with the CPU caches evicted before it. Between two requests a real server's gRPC and
  kernel work evict the path from the caches, so the cold figure is what it pays.

Reference in the same run: ONNX Runtime's own time per image.

    .venv/bin/python -m bench.request_path [--seconds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from bench import null_engine  # noqa: F401  (registers null:cpu0)
from bench.serving import infer_request, model_ceiling, model_repository
from service.core.dataplane import DataPlane
from service.core.metrics import Metrics
from service.core.model_control import ModelControl
from service.core.registry import ModelRegistry
from service.edge.door import Peers
from service.edge.shared_memory import SharedMemoryRegions
from service.edge.uploads import UploadBudget
from service.grpc.servicer import InferenceServicer
from service.protocol.operations import Operations
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

# Rewritten before each cold request: twice the L2 cache of a core here (2 MB), and of most
# server cores.
_EVICT_BYTES = 4 << 20
_APART_S = 0.001  # between lone requests: longer than the example model's 500 µs window


@contextlib.asynccontextmanager
async def data_plane(models: Path) -> AsyncIterator[tuple[DataPlane, Metrics, Settings]]:
    """The daemon's data plane on `models`, loaded and ready, in this process without gRPC
    (owner_capacity.py's too), with its metrics and settings."""
    metrics = Metrics()
    settings = Settings(model_repository=models, unix_socket=None)
    registry = ModelRegistry(settings, metrics)
    try:
        await registry.load_all()
        plane = DataPlane(registry)
        plane.ready = True
        yield plane, metrics, settings
    finally:
        await registry.close()


@contextlib.asynccontextmanager
async def serving(models: Path) -> AsyncIterator[InferenceServicer]:
    """A servicer on `models`, as the daemon builds it, without gRPC around it."""
    async with data_plane(models) as (plane, metrics, settings):
        yield InferenceServicer(Operations(
            plane, metrics, SharedMemoryRegions.from_settings(settings),
            Peers(UploadBudget.from_settings(settings)), settings,
            ModelControl(plane.models, settings)))


class _NoCall:
    """What the servicer reads of a gRPC call, for a request that comes through no door: no
    deadline, no caller."""

    @staticmethod
    def time_remaining() -> None:
        return None

    @staticmethod
    def peer() -> str:
        return ""


_NO_CALL = _NoCall()


async def measure(models: Path, concurrency: int, seconds: float, image: np.ndarray) -> dict:
    async with serving(models) as servicer:
        request = infer_request(image)
        done = 0

        async def client(end: float) -> None:
            nonlocal done
            while time.perf_counter() < end:
                await servicer.ModelInfer(request, _NO_CALL)
                done += 1
        await asyncio.gather(*[client(time.perf_counter() + 1.0) for _ in range(concurrency)])
        done, cpu, wall = 0, time.process_time(), time.perf_counter()
        await asyncio.gather(*[client(wall + seconds) for _ in range(concurrency)])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_us_per_request": 1e6 * cpu / done, "requests_per_s": done / wall}


async def lone(models: Path, seconds: float, image: np.ndarray) -> dict:
    """Median µs of one request served alone, hot and cold (caches evicted), alternated; and
    the mean time those requests spent in the batcher's queue (none: they ran at once)."""
    async with serving(models) as servicer:
        request = infer_request(image)
        evict = np.zeros(_EVICT_BYTES // 4, np.float32)
        times: dict[str, list[float]] = {"hot": [], "cold": []}
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for kind, runs in times.items():
                if kind == "cold":
                    evict += 1
                start = time.perf_counter()
                await servicer.ModelInfer(request, _NO_CALL)
                runs.append(time.perf_counter() - start)
                await asyncio.sleep(_APART_S)
        queue = (await servicer.operations.statistics("", ""))[0].inference_stats.queue
    return {f"{kind}_us": 1e6 * statistics.median(runs) for kind, runs in times.items()} | {
        "queue_us": queue.ns / 1e3 / queue.count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    from tools import mnist_digits
    image = mnist_digits.holdout_split()[0][:1]
    with tempfile.TemporaryDirectory() as tmp:
        models = model_repository(Path(tmp), devices="null:cpu0")
        path = asyncio.run(measure(models, args.concurrency, args.seconds, image))
        alone = asyncio.run(lone(models, args.seconds, image))
    ort = model_ceiling(image, 1, args.seconds)
    model_us, path_us = 1e6 / ort["batch_16_img_per_s"], path["cpu_us_per_request"]
    print(f"hetserve request path: {path_us:.0f} µs CPU per request "
          f"({path['requests_per_s']:.0f} req/s at concurrency {args.concurrency}, one thread "
          f"for the loop, one per engine instance)\nONNX Runtime alone, same run: "
          f"{model_us:.0f} µs per image at batch 16; the path costs {path_us / model_us:.2f}× "
          "the model's own time\n"
          f"a lone request: {alone['hot_us']:.0f} µs hot, {alone['cold_us']:.0f} µs with the CPU "
          f"caches evicted before it (medians; {alone['queue_us']:.0f} µs in the queue on "
          "average)")


if __name__ == "__main__":
    main()
