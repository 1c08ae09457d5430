"""MLPerf LoadGen's system under test and query sample library for a hetserve daemon.

The SUT sends each query's samples to the daemon over gRPC (tritonclient, asynchronous calls
with completion callbacks), in requests of at most `max_batch` samples with at most `inflight`
requests outstanding, and completes each sample with its predicted class (an int32), which
LoadGen writes to its accuracy log. LoadGen's own thread only issues: replies complete on
gRPC's threads, so Server queries are never serialized behind one another."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlperf_loadgen as lg
import numpy as np
import tritonclient.grpc as grpcclient

log = logging.getLogger(__name__)


@dataclass
class SampleLibrary:
    """Samples held in memory (LoadGen's load/unload calls have nothing to do), with labels
    where they are known (the held-out MNIST digits); synthetic tensors have none."""

    name: str
    images: np.ndarray  # (N, *dims) float32
    labels: np.ndarray | None = None
    handle: int = field(init=False, default=0)

    def __enter__(self) -> SampleLibrary:
        count = len(self.images)
        self.handle = lg.ConstructQSL(count, count, lambda _: None, lambda _: None)
        return self

    def __exit__(self, *exc) -> None:
        lg.DestroyQSL(self.handle)


class DaemonSUT:
    def __init__(self, address: str, model: str, library: SampleLibrary, max_batch: int,
                 inflight: int, input_name: str = "image", output_name: str = "logits") -> None:
        self.model, self.library = model, library
        self.input_name, self.output_name = input_name, output_name
        self.max_batch = max_batch
        self._client = grpcclient.InferenceServerClient(address)
        self._slots = threading.BoundedSemaphore(inflight)
        self._lock = threading.Lock()
        self.latencies_s: list[float] = []  # per sample, issue to completion, seen by the SUT
        self.completed = 0
        self.errors: dict[str, int] = {}
        self.on_complete: Callable[[int], None] | None = None  # samples just completed
        self.handle = 0

    def __enter__(self) -> DaemonSUT:
        self.handle = lg.ConstructSUT(self.issue_queries, self.flush_queries)
        return self

    def __exit__(self, *exc) -> None:
        lg.DestroySUT(self.handle)
        self._client.close()

    def issue_queries(self, samples: list) -> None:
        for start in range(0, len(samples), self.max_batch):
            self._slots.acquire()  # Offline hands over every sample at once: bound the queue
            self._send(samples[start:start + self.max_batch])

    def flush_queries(self) -> None:
        pass

    def _send(self, chunk: list) -> None:
        images = self.library.images[[s.index for s in chunk]]
        tensor = grpcclient.InferInput(self.input_name, list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        outputs = [grpcclient.InferRequestedOutput(self.output_name)]
        start = time.perf_counter()
        try:
            self._client.async_infer(self.model, [tensor], outputs=outputs,
                                     callback=lambda result, error: self._done(
                                         chunk, start, result, error))
        except Exception as e:  # a transport failure before the call went out
            self._done(chunk, start, None, e)

    def _done(self, chunk: list, start: float, result, error) -> None:
        elapsed = time.perf_counter() - start
        self._slots.release()
        if error is None:
            labels = result.as_numpy(self.output_name).argmax(axis=1).astype(np.int32)
        else:  # completed all the same, so that LoadGen ends; counted and reported
            labels = np.full(len(chunk), -1, np.int32)
            name = str(error.status()) if hasattr(error, "status") else type(error).__name__
            with self._lock:
                self.errors[name] = self.errors.get(name, 0) + len(chunk)
            log.warning("request of %d samples failed: %s", len(chunk), error)
        base = labels.ctypes.data
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, base + 4 * i, 4)
                                 for i, s in enumerate(chunk)])
        with self._lock:
            self.latencies_s.extend([elapsed] * len(chunk))
            self.completed += len(chunk)
        if self.on_complete is not None:
            self.on_complete(len(chunk))
