"""Prometheus metrics of one daemon, in their own registry (base units, `_total` counters)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from accelerators.power.meter import PowerMonitor
from service.core.power_metrics import PowerCollector

# Request latencies from 100 µs to 10 s.
_LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self, power: PowerMonitor | None = None) -> None:
        self.registry = CollectorRegistry()
        self.power = power or PowerMonitor()
        self.registry.register(PowerCollector(self.power))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        # `version` (the model version served, "" for a request naming no served model) where
        # Triton's per-model series have one: deploy/prometheus/triton.yml maps them.
        self.requests = Counter(
            "hetserve_requests", "Inference requests by outcome (a gRPC status code name)",
            ["model", "version", "code"], registry=r)
        self.request_duration = Histogram(
            "hetserve_request_duration_seconds",
            "Time from receiving an inference request to its reply",
            ["model", "version"], buckets=_LATENCY_BUCKETS, registry=r)
        # Front-ends with --workers: the sum over the live ones (service/workers/frontends.py).
        self.pending = Gauge(
            "hetserve_pending_requests",
            "Inference requests received and not yet answered (queued or running)",
            ["model", "version"], multiprocess_mode="livesum", registry=r)
        self.queue_duration = Histogram(
            "hetserve_queue_duration_seconds", "Time a request waited in its model's queue",
            ["model", "version"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute_duration = Histogram(
            "hetserve_compute_duration_seconds", "Time one batch ran on a device",
            ["model", "version", "device", "kind", "engine"], buckets=_LATENCY_BUCKETS,
            registry=r)
        self.batch_size = Histogram(
            "hetserve_batch_size", "Samples per batch run on a device",
            ["model", "version", "device", "kind", "engine"], buckets=_BATCH_BUCKETS,
            registry=r)
        self.inferences = Counter(
            "hetserve_inferences", "Samples inferred, by device",
            ["model", "version", "device", "kind", "engine"], registry=r)
        self.flops = Counter(
            "hetserve_flops", "Floating-point operations executed, counted from the ONNX graph "
            "(a multiply-add is 2); count=\"partial\" where the graph has ops the counter does "
            "not know: a lower bound", ["model", "device", "kind", "engine", "count"],
            registry=r)
        self.failovers = Counter(
            "hetserve_failovers",
            "Batches re-run on another device after `device` failed them",
            ["model", "device"], registry=r)
        self.device_healthy = Gauge(
            "hetserve_device_healthy",
            "1 while a device runner takes batches, 0 while it backs off",
            ["model", "device", "kind", "engine"], registry=r)
        self.device_demoted = Gauge(
            "hetserve_device_demoted",
            "1 while `prefer` ranks a device after the others as much slower on this model",
            ["model", "device", "engine"], registry=r)
        self.padding = Counter(
            "hetserve_padding_samples",
            "Zero rows a device computed to fill batches up to a bucket size (never replied)",
            ["model", "device", "kind", "engine"], registry=r)
        self.opencl_plans = Counter(
            "hetserve_opencl_plans",
            "Launch plans the OpenCL engine compiled (event=\"built\": one per batch size and "
            "request shape) and dropped from its bounded cache of request shapes "
            "(event=\"evicted\"); evictions that keep rising mean more distinct shapes than "
            "the cache holds", ["model", "device", "kind", "engine", "event"], registry=r)
        self.warmup_duration = Gauge(
            "hetserve_model_warmup_seconds",
            "Time a model version's warm-up took at load, before it was READY",
            ["model", "version"], registry=r)
        self.expired = Counter(
            "hetserve_requests_expired",
            "Requests answered DEADLINE_EXCEEDED in the queue, before reaching a device",
            ["model", "version"], registry=r)
        # REST by route name (service/http/transport.py), never by path: clients choose paths.
        self.http_requests = Counter(
            "hetserve_http_requests",
            "REST requests by endpoint (the route's name; \"none\" where no route matched) and "
            "HTTP status code", ["endpoint", "status"], registry=r)
        self.http_request_duration = Histogram(
            "hetserve_http_request_duration_seconds",
            "Time from a REST request's headers to its reply, its body's arrival included",
            ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        # What front-ends observe (each front-end process's own, with --workers).
        self.front_end = (self.requests, self.request_duration, self.pending,
                          self.http_requests, self.http_request_duration)

    def serve(self, host: str, port: int) -> None:
        """Exposes /metrics over HTTP on its own thread."""
        start_http_server(port, addr=host, registry=self.registry)
