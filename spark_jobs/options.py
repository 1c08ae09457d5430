"""What a scoring job asks for, made once on the driver and shipped to every task: the node's
daemon, the model's interface, request sizes and priority, and the output's form."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark import Accumulator

from spark_jobs.client import RetryPolicy
from spark_jobs.credentials import NO_CREDENTIALS, Credentials
from spark_jobs.daemon import NodeDaemon
from spark_jobs.interface import ModelInterface

OUTPUT_MODES = ("labels", "raw")


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
