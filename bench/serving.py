"""Serving benchmark: batch-1 MNIST requests from an async gRPC client, closed loop at several
concurrencies, an open-loop Poisson rate sweep, and a streaming client, against
  echo      a bare grpc.aio server with the same protocol and stubs (the ceiling),
  daemon    `hetserve serve` on the example model (dynamic batching on),
  unbatched the same daemon and model with dynamic_batching removed,
  nocompute the daemon with an engine that computes nothing (bench/null_engine.py): the serving
            core's own cost, as when the model runs on an accelerator instead of these cores,
and, for scale, the model itself in this process (ONNX Runtime, batch 1 and batch 16).
Every target is driven by the same client in the same run; figures are ratios to echo. Besides
req/s and latency, each load point reports the server's and the client's CPU time per answered
request, and the table ends with the bound that the model's own CPU time puts on the daemon.

    .venv/bin/python bench/serving.py [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
MODEL = "mnist_cnn"


# --- the client -------------------------------------------------------------------------------

def infer_request(image: np.ndarray) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(np.ascontiguousarray(image, np.float32).tobytes())
    return request


def _summary(latencies: list[float], errors: Counter, seconds: float) -> dict:
    ms = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    return {"rps": len(latencies) / seconds, "requests": len(latencies), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "errors": dict(errors)}


async def closed_loop(stub, request, concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors: Counter = Counter()
    end = time.perf_counter() + seconds

    async def worker():
        while (start := time.perf_counter()) < end:
            try:
                await stub.ModelInfer(request)
                latencies.append(time.perf_counter() - start)
            except grpc.aio.AioRpcError as e:
                errors[e.code().name] += 1
    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return _summary(latencies, errors, time.perf_counter() - started)


async def open_loop(stub, request, rate: float, seconds: float) -> dict:
    """Poisson arrivals at `rate` per second, whatever the replies do."""
    latencies: list[float] = []
    errors: Counter = Counter()
    rng = random.Random(0)

    async def one(start: float):
        try:
            await stub.ModelInfer(request)
            latencies.append(time.perf_counter() - start)
        except grpc.aio.AioRpcError as e:
            errors[e.code().name] += 1
    calls = []
    started = time.perf_counter()
    due = started
    while due < started + seconds:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(due - time.perf_counter(), 0))
        calls.append(asyncio.create_task(one(due)))
    await asyncio.gather(*calls)
    return _summary(latencies, errors, time.perf_counter() - started) | {"offered": rate}


async def streaming(stub, image: np.ndarray, window: int, seconds: float) -> dict:
    """One bidirectional stream keeping `window` requests in flight."""
    sent: dict[str, float] = {}
    latencies: list[float] = []
    errors: Counter = Counter()
    slots = asyncio.Semaphore(window)
    end = time.perf_counter() + seconds
    requests = [infer_request(image) for _ in range(window)]

    async def produce():
        i = 0
        while time.perf_counter() < end:
            await slots.acquire()
            request = requests[i % window]
            request.id = str(i)
            sent[request.id] = time.perf_counter()
            yield request
            i += 1
    started = time.perf_counter()
    async for reply in stub.ModelStreamInfer(produce()):
        if reply.error_message:
            errors[reply.error_message.split(":")[0]] += 1
        else:
            latencies.append(time.perf_counter() - sent.pop(reply.infer_response.id))
        slots.release()
    return _summary(latencies, errors, time.perf_counter() - started) | {"window": window}


# --- running it -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_repository(folder: Path, batching: bool = True, devices: str = "") -> Path:
    """A copy of the example model's repository, without dynamic batching or on other devices."""
    shutil.copytree(ROOT / "models" / MODEL, folder / MODEL)
    config = folder / MODEL / "config.pbtxt"
    text = config.read_text()
    if not batching:
        text = re.sub(r"dynamic_batching \{.*\}\n", "", text)
    if devices:
        text += f'parameters {{ key: "devices" value: {{ string_value: "{devices}" }} }}\n'
    config.write_text(text)
    return folder


def _start(kind: str, port: int, tmp: Path, threads: int) -> subprocess.Popen:
    if kind == "echo":
        args = [sys.executable, str(Path(__file__).with_name("echo_server.py")), str(port)]
    else:
        models = {"daemon": lambda: ROOT / "models",
                  "unbatched": lambda: model_repository(tmp / kind, batching=False),
                  "nocompute": lambda: model_repository(tmp / kind, devices="null:cpu0")}[kind]()
        args = [sys.executable, "-m", "service", "serve", "--models", str(models),
                "--port", str(port), "--socket", "", "--metrics-port", "0",
                "--intra-op-threads", str(threads), "--log-level", "WARNING"]
        if kind == "nocompute":
            args += ["--engine-modules", "null_engine"]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT)])}
    return subprocess.Popen(args, cwd=ROOT, env=env)


async def _wait_ready(stub) -> None:
    for _ in range(600):
        try:
            if (await stub.ServerReady(pb.ServerReadyRequest(), timeout=1)).ready:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("server did not become ready")


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _metered(pid: int, run) -> dict:
    """A load point, with the server's and this client's CPU time per answered request: unlike
    throughput on a shared machine, they do not depend on how much CPU each side was given."""
    server, client = _cpu_s(pid), time.process_time()
    result = await run
    answered = max(result["requests"], 1)
    return result | {"server_cpu_us": 1e6 * (_cpu_s(pid) - server) / answered,
                     "client_cpu_us": 1e6 * (time.process_time() - client) / answered}


async def bench_targets(ports: dict[str, int], pids: dict[str, int], args: argparse.Namespace,
                        image: np.ndarray) -> dict:
    """Every load point runs on each target in turn, so that drift on a shared machine hits
    all targets alike."""
    channels = {t: grpc.aio.insecure_channel(f"127.0.0.1:{p}") for t, p in ports.items()}
    try:
        stubs = {t: service_pb2_grpc.GRPCInferenceServiceStub(c) for t, c in channels.items()}
        request = infer_request(image)
        for stub in stubs.values():
            await _wait_ready(stub)
            await closed_loop(stub, request, 16, 1.0)  # warm-up
        results: dict = {t: {"closed": [], "poisson": []} for t in stubs}
        for c in args.concurrency:
            for t, stub in stubs.items():
                results[t]["closed"].append(await _metered(
                    pids[t], closed_loop(stub, request, c, args.seconds)))
        for rate in args.rates:
            for t, stub in stubs.items():
                results[t]["poisson"].append(await _metered(
                    pids[t], open_loop(stub, request, rate, args.seconds)))
        if args.stream_window:
            for t, stub in stubs.items():
                results[t]["stream"] = await _metered(
                    pids[t], streaming(stub, image, args.stream_window, args.seconds))
        return results
    finally:
        for channel in channels.values():
            await channel.close()


def model_ceiling(image: np.ndarray, threads: int, seconds: float) -> dict:
    """Images per second of ONNX Runtime alone, no serving around it."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(ROOT / "models" / MODEL / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    rates = {}
    for batch in (1, 16):
        x = {"image": np.repeat(image, batch, axis=0)}
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(["logits"], x)
            runs += 1
        rates[f"batch_{batch}_img_per_s"] = runs * batch / (time.perf_counter() - start)
    return rates


def _table(results: dict) -> str:
    echo = results["echo"]
    lines = ["| target | load | req/s | x echo | p50 ms | p99 ms | server CPU µs/req | x echo "
             "| client CPU µs/req | errors |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for target, runs in results.items():
        if target in ("args", "onnxruntime"):
            continue
        rows = [(f"concurrency {c}", r, e) for c, r, e in
                zip(results["args"]["concurrency"], runs["closed"], echo["closed"], strict=True)]
        rows += [(f"Poisson {r['offered']:.0f}/s", r, e)
                 for r, e in zip(runs["poisson"], echo["poisson"], strict=True)]
        if "stream" in runs:
            rows.append((f"stream, window {runs['stream']['window']}", runs["stream"],
                         echo["stream"]))
        for load, r, e in rows:
            lines.append(f"| {target} | {load} | {r['rps']:.0f} | {r['rps'] / e['rps']:.2f} | "
                         f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['server_cpu_us']:.0f} | "
                         f"{r['server_cpu_us'] / e['server_cpu_us']:.2f} | "
                         f"{r['client_cpu_us']:.0f} | "
                         + (", ".join(f"{n} {k}" for k, n in r["errors"].items()) or "0") + " |")
    ceiling = results["onnxruntime"]
    model_us = 1e6 / ceiling["batch_16_img_per_s"]
    lines.append(f"\nONNX Runtime alone, same run: {ceiling['batch_1_img_per_s']:.0f} img/s at "
                 f"batch 1, {ceiling['batch_16_img_per_s']:.0f} at batch 16 ({model_us:.0f} µs "
                 "of one core per image)")
    # Client and server share the machine's cores: where echo saturates them, a daemon that
    # added nothing but the model's own CPU time to echo's would reach this share of echo.
    for c, e in zip(results["args"]["concurrency"], echo["closed"], strict=True):
        both = e["client_cpu_us"] + e["server_cpu_us"]
        bound = both / (both + model_us)
        lines.append(f"Bound at concurrency {c}: echo + model alone = {bound:.2f}× echo (echo's "
                     f"client + server CPU {both:.0f} µs per request)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--rates", type=float, nargs="*", default=[500, 1000, 2000, 3000],
                        help="open-loop Poisson arrival rates, requests per second")
    parser.add_argument("--stream-window", type=int, default=64,
                        help="requests in flight on the streaming run; 0 skips it")
    parser.add_argument("--targets", nargs="+",
                        default=["echo", "daemon", "nocompute", "unbatched"])
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="the daemons' ONNX Runtime threads per engine instance (default: "
                             "0, the daemon's choice), and the in-process reference's (0: 1)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tools"))
    import mnist_digits
    image = mnist_digits.holdout_split()[0][:1]
    results: dict = {"args": {**vars(args), "json": str(args.json)}}
    results["onnxruntime"] = model_ceiling(image, args.intra_op_threads or 1, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        ports = {target: _free_port() for target in args.targets}
        processes = {t: _start(t, p, Path(tmp), args.intra_op_threads) for t, p in ports.items()}
        try:
            results |= asyncio.run(bench_targets(
                ports, {t: p.pid for t, p in processes.items()}, args, image))
        finally:
            for process in processes.values():
                process.terminate()
                process.wait(30)
    print(_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
