"""One Spark task's scoring through its node's daemon: locate the daemon (once per task, from
the task's thread), infer batches of samples there, and account for what each call cost."""

from __future__ import annotations

import logging

import numpy as np

from spark_jobs.client import Inference, infer
from spark_jobs.energy import tally
from spark_jobs.options import ScoreOptions
from spark_jobs.resources import task_resources

log = logging.getLogger(__name__)


class Scorer:
    """Made in the task from the job's options; its daemon is found on the first call of
    locate, so that a task without rows finds (or starts) none."""

    def __init__(self, options: ScoreOptions) -> None:
        self.options = options
        self._address: str | None = None

    def locate(self) -> str:
        """This task's daemon (NodeDaemon.locate), logged with the accelerators the task
        holds; call it from the task's thread before infer runs elsewhere."""
        if self._address is None:
            self._address = self._find()
            log.info("a task holding %s scores through the daemon at %s",
                     task_resources() or "no accelerator", self._address)
        return self._address

    def _find(self) -> str:
        return self.options.daemon.locate(self.options.credentials)

    def infer(self, samples: np.ndarray) -> Inference:
        """`samples` (N, *dims) through the located daemon, at the options' priority (default:
        the model's lowest level). A retry of an UNAVAILABLE request asks the node for its
        daemon again, unless the job may not start daemons: then it keeps the one it has."""
        o = self.options
        return infer(self.locate(), o.model, samples, o.batch_size, o.inflight,
                     o.model.level(o.priority), o.retry,
                     self._find if o.daemon.model_repository else None, o.credentials,
                     every_output=o.raw)

    def account(self, result: Inference) -> None:
        """Adds what a call cost to the job's energy; from the task's own thread (an
        accumulator is not thread-safe)."""
        if self.options.energy is not None:
            self.options.energy.add(tally(result.costs))
