"""ModelStreamInfer through tritonclient's stream API, ModelStatistics, the effective
ModelConfig, and Triton's perf_analyzer against the daemon (when its binary is at hand)."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.daemon import MODEL, image_input
from tests.support.served import assert_served, node_devices


def test_streaming_inference(client, holdout) -> None:
    images = holdout[0][:200]
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        for i in range(len(images)):
            client.async_stream_infer(MODEL, image_input(images[i:i + 1]), request_id=str(i))
        bad = grpcclient.InferInput("image", [1, 28, 28], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 28, 28), np.float32))
        client.async_stream_infer(MODEL, [bad], request_id="bad")
        received = [replies.get(timeout=30) for _ in range(len(images) + 1)]
    finally:
        client.stop_stream()
    errors = [error for _, error in received if error is not None]
    assert len(errors) == 1 and "INVALID_ARGUMENT" in str(errors[0])
    assert "shape [1, 28, 28] received" in str(errors[0])
    for result, error in received:
        if error is None:
            i = int(result.get_response().id)
            assert_served(result.as_numpy("logits"),
                          result.get_response().parameters["device"].string_param,
                          images[i:i + 1])
    assert sorted(int(r.get_response().id) for r, e in received if e is None) == \
        list(range(len(images)))


def test_statistics_count_requests_batches_and_time(client, holdout) -> None:
    assert "statistics" in client.get_server_metadata().extensions
    before = client.get_inference_statistics(MODEL).model_stats[0]
    client.infer(MODEL, image_input(holdout[0][:5]))
    after = client.get_inference_statistics(MODEL).model_stats[0]
    assert (after.name, after.version) == (MODEL, "1")
    assert after.inference_count - before.inference_count == 5
    assert after.execution_count - before.execution_count == 1
    stats, old = after.inference_stats, before.inference_stats
    for field in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(stats, field).count - getattr(old, field).count == 1, field
    assert stats.success.ns - old.success.ns >= stats.compute_infer.ns - old.compute_infer.ns > 0
    assert any(b.batch_size == 5 and b.compute_infer.count >= 1 for b in after.batch_stats)
    everything = client.get_inference_statistics().model_stats
    assert [s.name for s in everything] == [MODEL]


def test_model_config_is_the_effective_configuration(client) -> None:
    config = client.get_model_config(MODEL).config
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 4096
    assert config.parameters["devices"].string_value == ", ".join(
        f"{'opencl' if d.startswith('fpga') else 'onnxruntime'}:{d}" for d in node_devices())
    assert config.parameters["batch_buckets"].string_value == "auto"
    assert config.parameters["policy"].string_value == "prefer"
    assert config.parameters["latency_budget_ms"].string_value == "100"


def _perf_analyzer() -> str | None:
    return os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")


@pytest.mark.skipif(_perf_analyzer() is None,
                    reason="Triton's perf_analyzer is not installed (docs/serving.md says how to "
                           "get it; set PERF_ANALYZER to its path)")
@pytest.mark.parametrize("mode", [[], ["--streaming"], ["--shared-memory", "system"]],
                         ids=["unary", "streaming", "system-shared-memory"])
def test_perf_analyzer_benchmarks_the_daemon_unchanged(daemon, mode) -> None:
    # shared memory over the socket: over TCP the daemon asks for its token first
    url = f"unix://{daemon.socket}" if "--shared-memory" in mode else daemon.url
    result = subprocess.run(
        [_perf_analyzer(), "-m", MODEL, "-u", url, "-i", "grpc",
         "--concurrency-range", "4", "--measurement-interval", "1000",
         # compatibility, not a measurement: any spread between windows is fine here
         "--stability-percentage", "1000", *mode],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout and "infer/sec" in result.stdout
    assert "Server:" in result.stdout  # it read ModelStatistics
