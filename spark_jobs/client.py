"""The executor-side client: one channel per Python worker, reused across tasks, sending
large batches to the node-local daemon with a few requests in flight, at low priority, and
retrying what a restarting or busy daemon answers. The tensors of a call go through one shared
memory region where the daemon can read it, and inside the messages otherwise."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service import socket_lock, tensors

log = logging.getLogger(__name__)
RETRIED = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"})
# Addresses of daemons on this node, which can read the job's shared memory.
_LOCAL_ADDRESSES = ("unix:", "127.", "localhost:", "[::1]:")
# Where a model's config.pbtxt says how to turn 8-bit images into its input (see docs/spark.md).
IMAGE_PARAMETERS = ("image_mean", "image_std", "image_channel_order")


@dataclass(frozen=True)
class ModelInterface:
    """What a job needs to know of a served model, read once on the driver."""

    name: str
    input_name: str
    input_datatype: str
    input_dims: tuple[int, ...]  # one sample's shape
    output_name: str
    max_batch_size: int
    priority_levels: int = 0
    image: dict[str, str] = field(default_factory=dict)  # the IMAGE_PARAMETERS it sets

    @classmethod
    def fetch(cls, address: str, model: str) -> ModelInterface:
        client = grpcclient.InferenceServerClient(address)
        try:
            config = client.get_model_config(model).config
        finally:
            client.close()
        if config.max_batch_size < 1 or len(config.input) != 1 or not config.output:
            raise ValueError(f"model {model!r}: scoring needs one batched input and an output; "
                             f"max_batch_size is {config.max_batch_size}, "
                             f"inputs are {[i.name for i in config.input]}")
        tensor = config.input[0]
        image = {k: config.parameters[k].string_value
                 for k in IMAGE_PARAMETERS if k in config.parameters}
        return cls(model, tensor.name, tensors.wire_from_config(tensor.data_type),
                   tuple(tensor.dims), config.output[0].name, config.max_batch_size,
                   config.dynamic_batching.priority_levels, image)

    @property
    def lowest_priority(self) -> int:
        """Triton's priority levels count from 1 (highest); 0 asks for the default level."""
        return self.priority_levels


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for UNAVAILABLE and RESOURCE_EXHAUSTED."""

    attempts: int = 8
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts: {self.attempts} given, at least 1 expected")

    def delay_s(self, attempt: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** attempt) * random.uniform(0.5, 1)


@dataclass(frozen=True)
class Inference:
    logits: np.ndarray
    model_version: str
    devices: list[str | None]  # per sample: where it ran (None from servers that do not say)


_clients: dict[str, grpcclient.InferenceServerClient] = {}  # per Python worker
_clients_lock = threading.Lock()


def _client(address: str) -> grpcclient.InferenceServerClient:
    with _clients_lock:
        if address not in _clients:
            _clients[address] = grpcclient.InferenceServerClient(address)
        return _clients[address]


def _forget(address: str, client: grpcclient.InferenceServerClient) -> None:
    """Drops a worker's channel after a transport failure: a fresh one connects at once, where
    the old one would wait out gRPC's reconnect backoff. Requests still on the old channel
    finish or fail there; it closes when the last of them lets go of it."""
    with _clients_lock:
        if _clients.get(address) is client:
            del _clients[address]


def _status(e: InferenceServerException) -> str:
    return str(e.status())


@contextlib.contextmanager
def _staged(client: grpcclient.InferenceServerClient, address: str,
            samples: np.ndarray) -> Iterator[str | None]:
    """The samples in a POSIX shared memory region registered with the daemon, so that each
    request names its slice instead of carrying the bytes (Triton's system shared memory). None
    where that cannot be: a daemon on another node, or one that cannot open the region (another
    user's daemon, a server without the extension); the bytes then travel in the messages."""
    if not address.startswith(_LOCAL_ADDRESSES) or samples.nbytes == 0:
        yield None
        return
    memory = shared_memory.SharedMemory(create=True, size=samples.nbytes)
    try:
        memory.buf[:samples.nbytes] = samples.reshape(-1).view(np.uint8)
        try:
            client.register_system_shared_memory(memory.name, "/" + memory.name,
                                                 samples.nbytes)
        except InferenceServerException as e:
            log.info("daemon at %s cannot use shared memory (%s); sending tensors in gRPC "
                     "messages", address, e.message())
            yield None
            return
        try:
            yield memory.name
        finally:
            with contextlib.suppress(InferenceServerException):  # a daemon gone meanwhile
                client.unregister_system_shared_memory(memory.name)
    finally:
        memory.close()
        memory.unlink()


@contextlib.contextmanager
def _beside(clients: list[grpcclient.InferenceServerClient], region: str | None,
            nbytes: int) -> Iterator[str | None]:
    """The call's region registered also with the daemon's other front-ends (one client per
    socket); None where one of them cannot open it: the bytes then travel in the messages."""
    registered: list[grpcclient.InferenceServerClient] = []
    usable = region
    try:
        for client in clients if region is not None else ():
            client.register_system_shared_memory(region, "/" + region, nbytes)
            registered.append(client)
    except InferenceServerException as e:
        log.info("a front-end of the daemon cannot use shared memory (%s); sending tensors in "
                 "gRPC messages", e.message())
        usable = None
    try:
        yield usable
    finally:
        for client in registered:
            with contextlib.suppress(InferenceServerException):  # a front-end gone meanwhile
                client.unregister_system_shared_memory(region)


def _spread(address: str) -> list[str]:
    """The addresses a call spreads its requests over: every socket of a daemon with several
    front-end processes (service/socket_lock.worker_sockets), else the address alone."""
    if not address.startswith("unix:"):
        return [address]
    own = Path(address.removeprefix("unix:").removeprefix("//"))
    return [address] + [f"unix:{path}" for path in socket_lock.worker_sockets(own)[1:]]


def infer(address: str, model: ModelInterface, samples: np.ndarray, batch_size: int,
          inflight: int, priority: int = 0, retry: RetryPolicy = RetryPolicy(),
          recover: Callable[[], str] | None = None) -> Inference:
    """Runs `samples` (N, *dims) through the daemon in requests of at most `batch_size`.
    `recover`, called before a retry of an UNAVAILABLE request, returns the address to use
    then (restarting the node's daemon where the job manages it)."""
    step = max(1, min(batch_size, model.max_batch_size))
    samples = np.ascontiguousarray(samples)
    sample_bytes = samples[:1].nbytes
    targets = _spread(address)
    region: list[str | None] = [None]  # the call's shared memory, while the daemon knows it

    def one(start: int) -> grpcclient.InferResult:
        chunk = samples[start:start + step]
        tensor = grpcclient.InferInput(model.input_name, list(chunk.shape),
                                       model.input_datatype)
        if region[0] is not None:
            tensor.set_shared_memory(region[0], chunk.nbytes, offset=start * sample_bytes)
        else:
            tensor.set_data_from_numpy(chunk)
        outputs = [grpcclient.InferRequestedOutput(model.output_name)]
        target = targets[start // step % len(targets)]
        for attempt in range(retry.attempts):
            client = _client(target)
            try:
                return client.infer(model.name, [tensor], outputs=outputs, priority=priority,
                                    client_timeout=retry.request_timeout_s)
            except InferenceServerException as e:
                if _status(e) not in RETRIED or attempt == retry.attempts - 1:
                    raise
                log.warning("daemon at %s answered %s (attempt %d of %d): %s", target,
                            _status(e), attempt + 1, retry.attempts, e.message())
                time.sleep(retry.delay_s(attempt))
                if _status(e) == str(grpc.StatusCode.UNAVAILABLE):
                    # A restarted daemon knows no region of ours: bytes travel in the messages.
                    region[0] = None
                    tensor.set_data_from_numpy(chunk)
                    _forget(target, client)
                    if recover is not None:
                        target = recover()
        raise AssertionError("unreachable")

    with _staged(_client(address), address, samples) as staged, \
            _beside([_client(t) for t in targets[1:]], staged, samples.nbytes) as region[0], \
            ThreadPoolExecutor(max(1, inflight)) as pool:
        results = list(pool.map(one, range(0, len(samples), step)))
    logits = [r.as_numpy(model.output_name) for r in results]
    replies = [r.get_response() for r in results]
    devices = [reply.parameters["device"].string_param if "device" in reply.parameters
               else None for reply in replies]
    return Inference(np.concatenate(logits) if logits else np.empty((0,), np.float32),
                     replies[-1].model_version if replies else "",
                     [d for d, out in zip(devices, logits) for _ in range(len(out))])
