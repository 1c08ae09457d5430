"""hetserve's own cost per request, without gRPC and without a model: requests go through the
servicer's path (decode, validate, queue, batch, split, encode, metrics, statistics) to an
engine that returns zeros. Reference in the same run: ONNX Runtime's own time per image.

    .venv/bin/python bench/request_path.py [--seconds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "bench")]

import null_engine  # noqa: E402,F401  (registers null:cpu0)
from serving import infer_request, model_ceiling, model_repository  # noqa: E402

from service.core.dataplane import DataPlane  # noqa: E402
from service.core.metrics import Metrics  # noqa: E402
from service.core.registry import ModelRegistry  # noqa: E402
from service.grpc.servicer import InferenceServicer  # noqa: E402
from service.grpc.shared_memory import SharedMemoryRegions  # noqa: E402
from service.settings import Settings  # noqa: E402


async def measure(models: Path, concurrency: int, seconds: float, image: np.ndarray) -> dict:
    metrics = Metrics()
    settings = Settings(model_repository=models, unix_socket=None)
    registry = ModelRegistry(settings, metrics)
    await registry.load_all()
    plane = DataPlane(registry)
    plane.ready = True
    servicer = InferenceServicer(plane, metrics, SharedMemoryRegions.from_settings(settings),
                                 settings)
    request = infer_request(image)
    done = 0

    async def client(end: float) -> None:
        nonlocal done
        while time.perf_counter() < end:
            await servicer._infer(request, None, None)
            done += 1
    await asyncio.gather(*[client(time.perf_counter() + 1.0) for _ in range(concurrency)])
    done, cpu, wall = 0, time.process_time(), time.perf_counter()
    await asyncio.gather(*[client(wall + seconds) for _ in range(concurrency)])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await registry.close()
    return {"cpu_us_per_request": 1e6 * cpu / done, "requests_per_s": done / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    import mnist_digits
    image = mnist_digits.holdout_split()[0][:1]
    with tempfile.TemporaryDirectory() as tmp:
        models = model_repository(Path(tmp), devices="null:cpu0")
        path = asyncio.run(measure(models, args.concurrency, args.seconds, image))
    ort = model_ceiling(image, 1, args.seconds)
    model_us, path_us = 1e6 / ort["batch_16_img_per_s"], path["cpu_us_per_request"]
    print(f"hetserve request path: {path_us:.0f} µs CPU per request "
          f"({path['requests_per_s']:.0f} req/s at concurrency {args.concurrency}, one thread "
          f"for the loop, one per engine instance)\nONNX Runtime alone, same run: "
          f"{model_us:.0f} µs per image at batch 16; the path costs {path_us / model_us:.2f}× "
          "the model's own time")


if __name__ == "__main__":
    main()
