"""A lone REST request: the daemon's concurrency-1 p50 over HTTP/REST
(`--http-port`, the example model on ONNX Runtime) against a bare aiohttp echo server answering
the same binary-tensor request with a fixed reply (the ceiling), and the model itself in this
process at batch 1. Target: daemon p50 <= echo's + the model's + 0.5 ms. The targets alternate,
twice each, with the same tritonclient.http client.

    .venv/bin/python -m bench.rest_serving [--seconds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from aiohttp import web

from bench.serving import model_ceiling, model_repository
from service.local_daemon import free_port, serve_command

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mnist_cnn"


def echo(port: int) -> None:
    """The ceiling: a fixed reply of the model's output, as the daemon sends it (binary)."""
    header = json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [1, 10],
         "parameters": {"binary_data_size": 40}}]}).encode()

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=header + bytes(40), content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(len(header))})

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application(client_max_size=1 << 26)
    app.add_routes([web.post(f"/v2/models/{MODEL}/infer", infer),
                    web.get("/v2/health/ready", ready)])
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


@contextlib.contextmanager
def server(kind: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    if kind == "echo":
        command = [sys.executable, "-m", "bench.rest_serving", "--echo", str(port)]
    else:
        models = tmp / "models"
        if not models.exists():
            model_repository(models, devices="onnxruntime")  # as bench.serving's daemon
        command = [*serve_command("--models", str(models)),
                   "--port", str(free_port()), "--socket", "", "--metrics-port", "0",
                   "--http-port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        while not _ready(client):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the {kind} server did not become ready on port {port}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


def latencies(address: str, image: np.ndarray, seconds: float) -> list[float]:
    client = httpclient.InferenceServerClient(address)
    tensor = httpclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    for _ in range(50):  # warm the connection and the daemon's paths
        client.infer(MODEL, [tensor])
    took, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        client.infer(MODEL, [tensor])
        took.append(time.perf_counter() - start)
    return took


def _ready(client: httpclient.InferenceServerClient) -> bool:
    try:
        return client.is_server_ready()
    except Exception:  # noqa: BLE001 - not listening yet
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each run's length")
    parser.add_argument("--echo", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo:
        echo(args.echo)
        return 0
    image = np.random.default_rng(0).random((1, 1, 28, 28), np.float32)
    p50 = {"echo": [], "daemon": []}
    with tempfile.TemporaryDirectory(prefix="hetserve-rest-") as tmp:
        for _ in range(2):
            for kind in p50:
                with server(kind, Path(tmp)) as address:
                    took = latencies(address, image, args.seconds)
                p50[kind].append(float(np.median(took)) * 1e3)
                print(f"{kind:7} p50 {p50[kind][-1]:.2f} ms, p99 "
                      f"{np.percentile(took, 99) * 1e3:.2f} ms ({len(took)} requests)")
    # The in-process reference bench.serving's gRPC figure uses (one thread, mean per image).
    model = 1e3 / model_ceiling(image, 1, args.seconds)["batch_1_img_per_s"]
    excess = min(p50["daemon"]) - min(p50["echo"]) - model
    print(f"Concurrency 1 over REST: daemon p50 {min(p50['daemon']):.2f} ms = echo's "
          f"{min(p50['echo']):.2f} ms + the model in-process at batch 1 ({model:.2f} ms) + "
          f"{excess:.2f} ms (target: + 0.5 ms at most; best of two runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
