"""The executor-side client's transport: one channel per Python worker and address, reused
across tasks, sending large batches to the node-local daemon (spread over its front-ends'
sockets) with a few requests in flight, at low priority, and retrying what a restarting or busy
daemon answers. The tensors of a call go through one shared memory region where the daemon can
read it (spark_jobs.staging), and inside the messages otherwise. What the model takes comes from
spark_jobs.interface, how to connect from spark_jobs.credentials."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service import contract
from service.errors import shown
from spark_jobs import staging
from spark_jobs.cost import Cost
from spark_jobs.credentials import NO_CREDENTIALS, Credentials
from spark_jobs.interface import ModelInterface

log = logging.getLogger(__name__)
UNAVAILABLE = str(grpc.StatusCode.UNAVAILABLE)
QUEUE_FULL = str(grpc.StatusCode.RESOURCE_EXHAUSTED)


class DaemonUnavailableError(RuntimeError):
    """The daemon stopped answering and asking the node for its daemon failed too: the task
    fails with both reasons (Spark's task retries then ask the node again)."""


class ReplyMismatchError(RuntimeError):
    """A reply whose output is not what the model's config and the request call for: none of
    its rows is used, as any of them could be another sample's."""


@dataclass(frozen=True)
class RetryPolicy:
    """UNAVAILABLE (the daemon down or restarting): `attempts`, with exponential backoff and
    jitter. RESOURCE_EXHAUSTED (the daemon up, its queue full): backpressure, not a failure; a
    refused request is sent again when an answer to this worker shows the queue moving, or
    after a wait from `busy_first_delay_s` doubling to `busy_max_delay_s`, for as long as
    `request_timeout_s`, which also bounds every single call to the daemon."""

    attempts: int = 8
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    request_timeout_s: float = 60.0
    busy_first_delay_s: float = 0.005
    busy_max_delay_s: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts: {self.attempts} given, at least 1 expected")

    def delay_s(self, attempt: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** attempt) * random.uniform(0.5, 1)


@dataclass(frozen=True)
class Inference:
    logits: np.ndarray  # the model's first output (its configured output_name)
    model_version: str
    devices: np.ndarray  # per sample (object): where it ran (None from servers that do not say)
    costs: tuple[Cost, ...] = ()  # per request, in the samples' order (none: no daemon's)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # every output asked for

    @property
    def joules(self) -> np.ndarray:
        """Per sample: its share of its request's joules (NaN where the reply does not say)."""
        if not self.costs:
            return np.full(len(self.devices), np.nan)
        return np.repeat([np.nan if c.joules is None else c.joules / c.rows for c in self.costs],
                         [c.rows for c in self.costs])


_Connection = tuple[grpcclient.InferenceServerClient, "dict | None"]
_clients: dict[tuple[str, Credentials], _Connection] = {}  # per Python worker
_clients_lock = threading.Lock()
_answered = threading.Condition()  # notified whenever a request of this worker is answered
_warned_full: set[str] = set()  # daemons whose full queue this worker has reported


def _client(address: str, credentials: Credentials = NO_CREDENTIALS) -> _Connection:
    with _clients_lock:
        if (address, credentials) not in _clients:
            _clients[address, credentials] = credentials.connect(address)
        return _clients[address, credentials]


def _forget(address: str, credentials: Credentials, connection: _Connection) -> None:
    """Drops a worker's channel after a transport failure: a fresh one connects at once, where
    the old one would wait out gRPC's reconnect backoff. Requests still on the old channel
    finish or fail there; it closes when the last of them lets go of it."""
    with _clients_lock:
        if _clients.get((address, credentials)) is connection:
            del _clients[address, credentials]


def _status(e: InferenceServerException) -> str:
    return str(e.status())


def infer(address: str, model: ModelInterface, samples: np.ndarray, batch_size: int | None,
          inflight: int, priority: int = 0, retry: RetryPolicy = RetryPolicy(),
          recover: Callable[[], str] | None = None,
          credentials: Credentials = NO_CREDENTIALS, every_output: bool = False) -> Inference:
    """Runs `samples` (N, *dims) through the daemon in requests of model.request_batch(
    batch_size) samples, `inflight` at a time, asking for the model's output (every output
    of its config with `every_output`). `recover`, called before a retry of an UNAVAILABLE
    request, returns the address to use then (restarting the node's daemon where the job
    manages it); where it fails, DaemonUnavailableError says why. A reply that does not match
    the model's config and its request is a ReplyMismatchError."""
    wanted = model.outputs if every_output and model.outputs else (
        (model.output_name, model.output_datatype, model.output_dims),)
    step = model.request_batch(batch_size)
    samples = np.ascontiguousarray(samples)
    sample_bytes = samples[:1].nbytes
    targets = contract.front_end_addresses(address)
    region: list[str | None] = [None]  # the call's shared memory, while the daemon knows it

    def one(start: int) -> grpcclient.InferResult:
        chunk = samples[start:start + step]
        tensor = grpcclient.InferInput(model.input_name, list(chunk.shape),
                                       model.input_datatype)
        if region[0] is not None:
            tensor.set_shared_memory(region[0], chunk.nbytes, offset=start * sample_bytes)
        else:
            tensor.set_data_from_numpy(chunk)
        outputs = [grpcclient.InferRequestedOutput(name) for name, _, _ in wanted]
        target = targets[start // step % len(targets)]
        for attempt in range(retry.attempts):
            connection = _client(target, credentials)
            client, headers = connection
            try:
                return _queued(lambda: client.infer(
                    model.name, [tensor], outputs=outputs, priority=priority,
                    client_timeout=retry.request_timeout_s, headers=headers), target, retry)
            except InferenceServerException as e:
                if _status(e) != UNAVAILABLE or attempt == retry.attempts - 1:
                    raise
                log.warning("daemon at %s answered %s (attempt %d of %d): %s", target,
                            _status(e), attempt + 1, retry.attempts, e.message())
                time.sleep(retry.delay_s(attempt))
                # A restarted daemon knows no region of ours: bytes travel in the messages.
                region[0] = None
                tensor.set_data_from_numpy(chunk)
                _forget(target, credentials, connection)
                if recover is not None:
                    target = _recovered(recover, target, e)
        raise AssertionError("unreachable")

    starts = range(0, len(samples), step)
    with staging.staged(_client(address, credentials), address, samples,
                        retry.request_timeout_s) as region[0], \
            ThreadPoolExecutor(max(1, inflight)) as pool:
        results = list(pool.map(one, starts))
    rows = [min(step, len(samples) - s) for s in starts]
    arrays = {spec[0]: [_output(model, r, n, *spec) for r, n in zip(results, rows)]
              for spec in wanted}
    replies = [r.get_response() for r in results]
    costs = tuple(Cost.of(reply, n) for reply, n in zip(replies, rows))
    outputs = {name: np.concatenate(parts) if parts else np.empty((0,), np.float32)
               for name, parts in arrays.items()}
    return Inference(outputs[wanted[0][0]], replies[-1].model_version if replies else "",
                     np.repeat(np.array([c.device for c in costs], object),
                               [c.rows for c in costs]), costs, outputs)


def _output(model: ModelInterface, result: grpcclient.InferResult, rows: int, name: str,
            datatype: str | None, dims: tuple[int, ...] | None) -> np.ndarray:
    """Output `name` in a reply to `rows` samples, once it is there with the configured
    datatype and one row per sample of the configured dims."""
    outputs = result.get_response().outputs
    got = next((o for o in outputs if o.name == name), None)
    if got is not None and datatype in (None, got.datatype) and \
            _rows_of(list(got.shape), rows, dims):
        return result.as_numpy(name)
    arrived = ", ".join(f"{o.name} {o.datatype} {list(o.shape)}" for o in outputs)
    raise ReplyMismatchError(
        f"model {model.name!r}: the reply to {rows} samples holds {shown(arrived)}; expected "
        f"{name} {datatype or '(any datatype)'} {[rows, *(dims or ['...'])]}")


def _rows_of(shape: list[int], rows: int, dims: tuple[int, ...] | None) -> bool:
    """Whether `shape` is `rows` samples of `dims` (-1: any size; None: any shape)."""
    if not shape or shape[0] != rows:
        return False
    return dims is None or (len(shape) == len(dims) + 1 and
                            all(d in (-1, s) for s, d in zip(shape[1:], dims)))


def _queued(send: Callable[[], grpcclient.InferResult], target: str,
            retry: RetryPolicy) -> grpcclient.InferResult:
    """send()'s answer once the daemon's queue takes the request. A full queue frees room as
    batches leave it, which answers follow, so each answer to this worker wakes one refused
    request (on a fast device, within a batch's time); one that no answer wakes is sent again
    after a growing delay. Past `request_timeout_s` of refusals the last one is raised."""
    give_up = time.monotonic() + retry.request_timeout_s
    delay = retry.busy_first_delay_s
    while True:
        try:
            result = send()
        except InferenceServerException as e:
            if _status(e) != QUEUE_FULL or time.monotonic() > give_up:
                raise
            with _answered:  # its lock also keeps the report to one per worker and daemon
                if target not in _warned_full:  # refusals are routine under load
                    _warned_full.add(target)
                    log.warning("daemon at %s answered %s: requests wait for room in its queue "
                                "(its --max-queue-size against the tasks x --inflight x request "
                                "size sent to it): %s", target, _status(e), e.message())
                _answered.wait(delay * random.uniform(0.5, 1))
            delay = min(delay * 2, retry.busy_max_delay_s)
            continue
        with _answered:
            _answered.notify()  # one: its batch's room fits a request of the same size
        return result


def _recovered(recover: Callable[[], str], address: str, failure: InferenceServerException
               ) -> str:
    try:
        return recover()
    except Exception as e:
        raise DaemonUnavailableError(
            f"the daemon at {address} answered {_status(failure)} ({failure.message()}), and "
            f"asking this node for its daemon failed: {e}") from e
