"""What every Spark entry point shares: the options, the output schema and the top-k of softmax
scores; and scoring over pandas batches (mapInPandas): decode the tensor or image column, infer
through the node-local daemon, and return id, label, top-k classes and scores, the device that
ran each row and the model version. spark_jobs.arrow_scoring does the same on Arrow batches."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from service import tensors
from spark_jobs.client import (NO_CREDENTIALS, Credentials, Inference, ModelInterface,
                               RetryPolicy, infer)
from spark_jobs.daemon import NodeDaemon
from spark_jobs.images import decode_image
from spark_jobs.resources import task_resources

log = logging.getLogger(__name__)


def output_schema(id_type: str, keep_errors: bool = False) -> str:
    """The output rows, keeping the input's id type (a long, or an image's path)."""
    return (f"id {id_type}, label int, top_labels array<int>, top_scores array<float>, "
            f"device string, model_version string" + (", error string" if keep_errors else ""))


@dataclass(frozen=True)
class ScoreOptions:
    daemon: NodeDaemon
    model: ModelInterface
    batch_size: int | None = None  # samples per request; None: the daemon's largest bucket
    inflight: int = 2  # requests in flight per task
    priority: int | None = None  # None: the model's lowest level (batch work yields)
    top_k: int = 5
    keep_errors: bool = False  # a malformed row becomes an error row instead of failing
    images: bool = False  # rows come from Spark's `image` source
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    credentials: Credentials = NO_CREDENTIALS  # for a daemon reached over TCP with TLS

    @property
    def level(self) -> int:
        return self.model.lowest_priority if self.priority is None else self.priority

    def locate(self) -> str:
        """This task's daemon (see locate), logged with the accelerators the task holds."""
        address = locate(self.daemon, self.credentials)
        log.info("a task holding %s scores through the daemon at %s",
                 task_resources() or "no accelerator", address)
        return address

    def recover(self) -> Callable[[], str] | None:
        """What a retry of an UNAVAILABLE request asks for the node's daemon: a job that may
        not start daemons keeps retrying the one it was given."""
        return self.locate if self.daemon.model_repository else None

    def infer(self, address: str, samples: np.ndarray) -> Inference:
        return infer(address, self.model, samples, self.batch_size, self.inflight, self.level,
                     self.retry, self.recover(), self.credentials)


def locate(daemon: NodeDaemon, credentials: Credentials = NO_CREDENTIALS) -> str:
    """This node's daemon. One reached with TLS is used as it is: the job starts daemons only
    on a unix socket or a loopback port of its own, which need no credentials."""
    address = daemon.resolve()
    return address if credentials.applies_to(address) else daemon.ensure()


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def _tensor(value: object, dtype: np.dtype) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return np.frombuffer(value, dtype)
    return np.asarray(value, dtype)


def decode(frame: pd.DataFrame, options: ScoreOptions) -> tuple[np.ndarray, dict[int, str]]:
    """The rows as one (N, *dims) array, and a message per malformed row (by position);
    a malformed row's slot holds zeros."""
    model = options.model
    dtype = tensors.numpy_dtype(model.input_datatype)
    samples = np.zeros((len(frame), *model.input_dims), dtype)
    errors: dict[int, str] = {}
    if options.images:
        rows = zip(frame["id"], frame["height"], frame["width"], frame["nChannels"],
                   frame["data"])
        for i, (origin, h, w, c, data) in enumerate(rows):
            try:
                samples[i] = decode_image(data, h, w, c, model)
            except ValueError as e:
                errors[i] = f"image {origin}: {e}"
        return samples, errors
    size = int(np.prod(model.input_dims))
    for i, (row_id, value) in enumerate(zip(frame["id"], frame["tensor"])):
        row = None if value is None else _tensor(value, dtype)
        if row is None or row.size != size:
            held = "no tensor" if row is None else f"{row.size} values"
            errors[i] = (f"row id {row_id!r}: tensor holds {held}, {size} expected for "
                         f"{model.input_name} {list(model.input_dims)}")
        else:
            samples[i] = row.reshape(model.input_dims)
    return samples, errors


def score_frame(frame: pd.DataFrame, options: ScoreOptions, address: str) -> pd.DataFrame:
    samples, errors = decode(frame, options)
    if errors and not options.keep_errors:
        raise ValueError(next(iter(errors.values())))
    good = np.ones(len(frame), bool)
    good[list(errors)] = False
    result = options.infer(address, samples[good])
    top, top_scores = top_k(result, int(good.sum()), options.top_k)
    return pd.DataFrame({
        "id": frame["id"].to_numpy(),
        "label": pd.array(_spread(top[:, 0].tolist(), good), dtype="Int32"),
        "top_labels": _spread(list(top), good),
        "top_scores": _spread(list(top_scores), good),
        "device": _spread(result.devices, good),
        "model_version": result.model_version or None,
        **({"error": [errors.get(i) for i in range(len(frame))]}
           if options.keep_errors else {})})


def top_k(result: Inference, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best classes (int32, best first) and their softmax scores, per row."""
    # No valid row (all went to the error output) leaves no logits, hence no class axis.
    logits = result.logits.astype(np.float32).reshape(rows, -1) if rows \
        else np.zeros((0, 1), np.float32)
    scores = softmax(logits)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :max(1, k)]
    return top.astype(np.int32), np.take_along_axis(scores, top, axis=1)


def _spread(values: list, good: np.ndarray) -> list:
    """Values for the good rows, in order, with None in the malformed rows' places."""
    it = iter(values)
    return [next(it) if g else None for g in good]


def score_frames(frames: Iterator[pd.DataFrame], options: ScoreOptions
                 ) -> Iterator[pd.DataFrame]:
    """For mapInPandas: scores each batch through this node's daemon."""
    address = None
    for frame in frames:
        if frame.empty:
            continue
        address = address or options.locate()
        yield score_frame(frame, options, address)
