"""Concurrent requests share model runs, and each gets its own answer back."""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from tests.conftest import MODEL, MODELS, image_input


def scrape(url: str) -> dict[str, float]:
    """Sums each metric family's samples over their labels, for the model under test."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    sums: dict[str, float] = {}
    for name, value in re.findall(rf'^(\w+)\{{[^}}]*model="{MODEL}"[^}}]*\}} (\S+)$', text,
                                  re.MULTILINE):
        sums[name] = sums.get(name, 0.0) + float(value)
    return sums


def test_concurrent_requests_are_batched_and_answered_in_order(daemon, holdout) -> None:
    images = holdout[0][:256]
    sizes = [1, 3, 1, 2] * 16  # some requests carry several samples
    starts = np.cumsum([0] + sizes[:-1])
    before = scrape(daemon.metrics_url)

    def call(i: int) -> np.ndarray:
        with grpcclient.InferenceServerClient(daemon.url) as c:
            chunk = images[starts[i]:starts[i] + sizes[i]]
            return c.infer(MODEL, image_input(chunk)).as_numpy("logits")

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(call, range(len(sizes))))

    expected = ort.InferenceSession(str(MODELS / MODEL / "1" / "model.onnx")).run(
        ["logits"], {"image": images[:sum(sizes)]})[0]
    for i, reply in enumerate(replies):
        np.testing.assert_allclose(reply, expected[starts[i]:starts[i] + sizes[i]],
                                   rtol=1e-4, atol=1e-4)

    after = scrape(daemon.metrics_url)
    batches = after["hetserve_batch_size_count"] - before.get("hetserve_batch_size_count", 0)
    samples = after["hetserve_batch_size_sum"] - before.get("hetserve_batch_size_sum", 0)
    assert samples == sum(sizes)
    assert samples / batches > 1.0, "concurrent requests should share model runs"
    assert after["hetserve_inferences_total"] - before.get("hetserve_inferences_total", 0) \
        == sum(sizes)
    ok = 'hetserve_requests_total{code="OK",model="mnist_cnn"}'
    assert ok in urllib.request.urlopen(daemon.metrics_url).read().decode()
