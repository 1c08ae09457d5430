"""What every Spark scoring path shares (spark_jobs.arrow_scoring for mapInArrow, the default,
and spark_jobs.pandas_scoring for mapInPandas): the options, finding the node's daemon, the
output schema, and the top-k classes by softmax score, or, in the raw output mode, every output
tensor as it came (detectors, OCR and segmentation models have no label)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pyspark import Accumulator

from spark_jobs.client import (
    NO_CREDENTIALS,
    Credentials,
    Inference,
    ModelInterface,
    RetryPolicy,
    infer,
)
from spark_jobs.daemon import NodeDaemon
from spark_jobs.energy import tally
from spark_jobs.resources import task_resources

log = logging.getLogger(__name__)
ENERGY_COLUMN = "energy_joules"  # a row's share of the joules its request cost
OUTPUT_MODES = ("labels", "raw")
# A raw output column's element type (Spark's, numpy's) by the tensor's datatype; any other
# (FP32, FP16, BF16, unsigned wider than 8 bits) is stored as float.
_RAW_TYPES = {"FP64": ("double", "float64"), "INT64": ("bigint", "int64"),
              "INT32": ("int", "int32"), "INT16": ("smallint", "int16"),
              "INT8": ("tinyint", "int8"), "UINT8": ("smallint", "int16"),
              "BOOL": ("boolean", "bool")}
_FLOAT = ("float", "float32")


def raw_columns(model: ModelInterface) -> list[tuple[str, str]]:
    """(column, Spark element type) of each output in the raw output mode: one flat array
    per row, in the output's row-major order (its shape is the config's dims)."""
    return [(name, _RAW_TYPES.get(datatype, _FLOAT)[0]) for name, datatype, _ in model.outputs]


def output_schema(id_type: str, keep_errors: bool = False, energy_column: bool = False,
                  raw: list[tuple[str, str]] | None = None) -> str:
    """The output rows, keeping the input's id type (a long, or an image's path): the label
    and top-k classes, or with `raw` (raw_columns) every output tensor."""
    scores = ", ".join(f"`{name}` array<{kind}>" for name, kind in raw) if raw else \
        "label int, top_labels array<int>, top_scores array<float>"
    return (f"id {id_type}, {scores}, device string, model_version string"
            + (f", {ENERGY_COLUMN} double" if energy_column else "")
            + (", error string" if keep_errors else ""))


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
    energy: Accumulator | None = None  # sums what the replies say they cost (energy.meter)
    energy_column: bool = False  # each row's share of its request's joules, ENERGY_COLUMN
    output_mode: str = "labels"  # or "raw": every output tensor as an array column

    def __post_init__(self) -> None:
        if self.output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode {self.output_mode!r}: expected one of "
                             f"{list(OUTPUT_MODES)}")

    @property
    def raw(self) -> bool:
        return self.output_mode == "raw"

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
                     self.retry, self.recover(), self.credentials, every_output=self.raw)

    def account(self, result: Inference) -> None:
        """Adds what a call cost to the job's energy; from the task's own thread (an
        accumulator is not thread-safe)."""
        if self.energy is not None:
            self.energy.add(tally(result.costs))


def locate(daemon: NodeDaemon, credentials: Credentials = NO_CREDENTIALS) -> str:
    """This node's daemon. One reached with TLS is used as it is: the job starts daemons only
    on a unix socket or a loopback port of its own, which need no credentials."""
    address = daemon.resolve()
    return address if credentials.applies_to(address) else daemon.ensure()


def raw_values(result: Inference, name: str, datatype: str) -> np.ndarray:
    """Output `name` of a call as (samples, values per sample), of its column's type."""
    rows = len(result.devices)
    flat = result.outputs[name].reshape(rows, -1) if rows else np.zeros((0, 0))
    return flat.astype(_RAW_TYPES.get(datatype, _FLOAT)[1], copy=False)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def top_k(result: Inference, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best classes (int32, best first) and their softmax scores, per row."""
    # No valid row (all went to the error output) leaves no logits, hence no class axis.
    logits = result.logits.astype(np.float32).reshape(rows, -1) if rows \
        else np.zeros((0, 1), np.float32)
    scores = softmax(logits)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :max(1, k)]
    return top.astype(np.int32), np.take_along_axis(scores, top, axis=1)
