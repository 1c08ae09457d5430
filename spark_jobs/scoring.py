"""What every Spark scoring path shares (spark_jobs.arrow_scoring for mapInArrow, the default,
and spark_jobs.pandas_scoring for mapInPandas): the options, finding the node's daemon, the
output schema, and the top-k classes by softmax score."""

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


def output_schema(id_type: str, keep_errors: bool = False, energy_column: bool = False) -> str:
    """The output rows, keeping the input's id type (a long, or an image's path)."""
    return (f"id {id_type}, label int, top_labels array<int>, top_scores array<float>, "
            f"device string, model_version string"
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
