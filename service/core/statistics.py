"""Per-model inference statistics in Triton's terms, for the ModelStatistics RPC (perf_analyzer
reads them): request outcomes, and queue and compute time per request and per batch size, as
plain counts; the protocol's are built from them (service.protocol.outputs.statistics)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)


@dataclass
class BatchStatistics:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStatistics:
    success: Duration = field(default_factory=Duration)  # whole request, receipt to reply
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)  # per request, its batch's time
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0  # samples
    execution_count: int = 0  # batches
    last_inference_ms: int = 0
    batches: dict[int, BatchStatistics] = field(
        default_factory=lambda: defaultdict(BatchStatistics))

    def record_batch(self, requests: int, samples: int, input_s: float, infer_s: float,
                     output_s: float) -> None:
        """One batch that ran: Triton counts its compute once per request and once per batch."""
        self.inference_count += samples
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        for per_request, per_batch, seconds in (
                (self.compute_input, "compute_input", input_s),
                (self.compute_infer, "compute_infer", infer_s),
                (self.compute_output, "compute_output", output_s)):
            per_request.add(seconds * requests, requests)
            getattr(self.batches[samples], per_batch).add(seconds)
