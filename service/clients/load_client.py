"""The load client of `hetserve tune` and the serving benchmarks: batch-1 requests, closed loop,
open loop (Poisson arrivals) or on one stream per process, from several client processes so that
the client is not what limits the server. Each process is spawned with its own event loop and a
gRPC channel per target; a load point's concurrency, rate or stream window is split among them,
they start at one instant, and their raw latencies are merged into one summary (percentiles of
all requests, never an average of per-process percentiles)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import signal
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from service import contract

START_AFTER_S = 0.2  # from sending a load point to the processes until they all begin it


def infer_request(model: str, inputs: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    """One request carrying `inputs` (each with its batch axis) in raw bytes."""
    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=contract.wire_dtype(array.dtype),
                           shape=list(array.shape))
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    return request


# --- one process's part of a load point ---------------------------------------------------------
# Each returns its raw part: latencies (s), errors by status, when it started and ended
# (time.monotonic(), shared by the processes of one machine) and the CPU seconds it used.

class _Part:
    def __init__(self, start_at: float) -> None:
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.start_at = start_at
        self._cpu = time.process_time()

    async def begin(self) -> None:
        await asyncio.sleep(max(self.start_at - time.monotonic(), 0))
        self.started = time.monotonic()

    def result(self) -> dict:
        return {"latencies": self.latencies, "errors": dict(self.errors),
                "started": self.started, "ended": time.monotonic(),
                "cpu_s": time.process_time() - self._cpu}


async def closed_loop(stub, request, concurrency: int, seconds: float, start_at: float) -> dict:
    """`concurrency` callers, each sending its next request when the last is answered."""
    part = _Part(start_at)
    await part.begin()
    end = time.perf_counter() + seconds

    async def caller():
        while (start := time.perf_counter()) < end:
            try:
                await stub.ModelInfer(request)
                part.latencies.append(time.perf_counter() - start)
            except grpc.aio.AioRpcError as e:
                part.errors[e.code().name] += 1
    await asyncio.gather(*[caller() for _ in range(concurrency)])
    return part.result()


async def open_loop(stub, request, rate: float, seconds: float, start_at: float,
                    seed: int) -> dict:
    """Poisson arrivals at `rate` per second, whatever the replies do."""
    part = _Part(start_at)
    rng = random.Random(seed)
    await part.begin()

    async def one(due: float):
        try:
            await stub.ModelInfer(request)
            part.latencies.append(time.perf_counter() - due)
        except grpc.aio.AioRpcError as e:
            part.errors[e.code().name] += 1
    calls = []
    started = due = time.perf_counter()
    while due < started + seconds:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(due - time.perf_counter(), 0))
        calls.append(asyncio.create_task(one(due)))
    await asyncio.gather(*calls)
    return part.result()


async def streaming(stub, request: pb.ModelInferRequest, window: int, seconds: float,
                    start_at: float) -> dict:
    """One bidirectional stream keeping `window` requests in flight."""
    part = _Part(start_at)
    sent: dict[str, float] = {}
    slots = asyncio.Semaphore(window)
    requests = [pb.ModelInferRequest.FromString(request.SerializeToString())
                for _ in range(window)]
    await part.begin()
    end = time.perf_counter() + seconds

    async def produce():
        i = 0
        while time.perf_counter() < end:
            await slots.acquire()
            request = requests[i % window]
            request.id = str(i)
            sent[request.id] = time.perf_counter()
            yield request
            i += 1
    async for reply in stub.ModelStreamInfer(produce()):
        if reply.error_message:
            part.errors[reply.error_message.split(":")[0]] += 1
        else:
            part.latencies.append(time.perf_counter() - sent.pop(reply.infer_response.id))
        slots.release()
    return part.result()


# --- merging the parts ----------------------------------------------------------------------------

def shares(total: int, processes: int) -> list[int]:
    """`total` callers (or stream slots) split as evenly as possible; some may get none."""
    return [total // processes + (i < total % processes) for i in range(processes)]


def summary(latencies: Iterable[float], errors: Counter, seconds: float) -> dict:
    ms = np.fromiter(latencies, float) * 1e3
    answered = len(ms)
    if not answered:
        ms = np.array([np.nan])
    return {"rps": answered / seconds if seconds > 0 else 0.0, "requests": answered,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "errors": dict(errors)}


def merge(parts: list[dict]) -> dict:
    """One load point from its processes' parts: the rate over the span from the first start to
    the last end, percentiles over every latency, errors and client CPU summed."""
    errors: Counter = Counter()
    for part in parts:
        errors.update(part["errors"])
    span = max(p["ended"] for p in parts) - min(p["started"] for p in parts)
    return summary((x for p in parts for x in p["latencies"]), errors, span) | {
        "client_cpu_s": sum(p["cpu_s"] for p in parts)}


# --- the client processes -------------------------------------------------------------------------

class ClientPool:
    """`processes` spawned client processes (gRPC objects must not cross a fork), each holding a
    channel to every target; `run` drives one load point from all of them. On a unix socket the
    processes take the daemon's front-end sockets in turn, as the Spark client's calls do: on the
    daemon's own socket alone, one front-end carried every call, and ResNet-50 on an H200 at
    concurrency 64 ran batches of 8-17 where spread it runs 32 (docs/benchmarks/gpu.md)."""

    def __init__(self, processes: int, addresses: dict[str, str],
                 request: pb.ModelInferRequest) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes = []
        self._processes = []
        spread = {target: contract.front_end_addresses(a) for target, a in addresses.items()}
        for i in range(processes):
            ours, theirs = context.Pipe()
            mine = {target: a[i % len(a)] for target, a in spread.items()}
            process = context.Process(target=_client_main,
                                      args=(theirs, mine, request.SerializeToString()),
                                      daemon=True)
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)

    def __len__(self) -> int:
        return len(self._pipes)

    def wait_ready(self) -> None:
        self._ask([{"kind": "ready"}] * len(self))

    def run(self, target: str, kind: str, load: float, seconds: float) -> dict:
        """A load point: `kind` closed (load: concurrency), poisson (load: requests per second)
        or stream (load: requests in flight)."""
        start_at = time.monotonic() + START_AFTER_S
        loads: Sequence[float]
        if kind == "poisson":
            loads = [load / len(self)] * len(self)  # Poisson streams add up to one
        else:
            loads = shares(int(load), len(self))
        jobs = [{"kind": kind, "target": target, "load": share, "seconds": seconds,
                 "start_at": start_at, "seed": i} for i, share in enumerate(loads)]
        return merge([part for part in self._ask(jobs) if part is not None])

    def _ask(self, jobs: list[dict]) -> list:
        for pipe, job in zip(self._pipes, jobs, strict=True):
            pipe.send(job)
        replies = [pipe.recv() for pipe in self._pipes]
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # a process that is gone already
                pipe.send(None)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def _client_main(pipe, addresses: dict[str, str], request: bytes) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops us
    asyncio.run(_serve_jobs(pipe, addresses, pb.ModelInferRequest.FromString(request)))


async def _serve_jobs(pipe, addresses: dict[str, str], request: pb.ModelInferRequest) -> None:
    loop = asyncio.get_running_loop()
    channels = {t: grpc.aio.insecure_channel(a) for t, a in addresses.items()}
    stubs = {t: service_pb2_grpc.GRPCInferenceServiceStub(c) for t, c in channels.items()}
    try:
        while (job := await loop.run_in_executor(None, pipe.recv)) is not None:
            try:
                pipe.send(await _job(job, stubs, request))
            except Exception as e:  # the parent raises it
                pipe.send(RuntimeError(f"client process: {type(e).__name__}: {e}"))
    finally:
        for channel in channels.values():
            await channel.close()


async def _job(job: dict, stubs: dict, request: pb.ModelInferRequest) -> dict | None:
    if job["kind"] == "ready":
        for stub in stubs.values():
            await wait_ready(stub)
        return None
    stub, load, seconds, start_at = stubs[job["target"]], job["load"], job["seconds"], \
        job["start_at"]
    if job["kind"] == "poisson":
        return await open_loop(stub, request, load, seconds, start_at, job["seed"])
    if not load:  # this process's share of the callers is none
        return None
    if job["kind"] == "stream":
        return await streaming(stub, request, load, seconds, start_at)
    return await closed_loop(stub, request, load, seconds, start_at)


async def wait_ready(stub) -> None:
    for _ in range(600):
        try:
            if (await stub.ServerReady(pb.ServerReadyRequest(), timeout=1)).ready:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("server did not become ready")
