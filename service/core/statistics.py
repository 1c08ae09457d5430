"""Per-model inference statistics in Triton's terms, for the ModelStatistics RPC (perf_analyzer
reads them): request outcomes, and queue and compute time per request and per batch size."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2 as pb


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def proto(self) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass
class _Batch:
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
    batches: dict[int, _Batch] = field(default_factory=lambda: defaultdict(_Batch))

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

    def proto(self, name: str, version: int) -> pb.ModelStatistics:
        return pb.ModelStatistics(
            name=name, version=str(version), last_inference=self.last_inference_ms,
            inference_count=self.inference_count, execution_count=self.execution_count,
            inference_stats=pb.InferStatistics(
                success=self.success.proto(), fail=self.fail.proto(), queue=self.queue.proto(),
                compute_input=self.compute_input.proto(),
                compute_infer=self.compute_infer.proto(),
                compute_output=self.compute_output.proto()),
            batch_stats=[pb.InferBatchStatistics(
                batch_size=size, compute_input=b.compute_input.proto(),
                compute_infer=b.compute_infer.proto(), compute_output=b.compute_output.proto())
                for size, b in sorted(self.batches.items())])
