"""Concurrent requests share model runs, and each gets its own answer back."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

from tests.conftest import MODEL, image_input
from tests.service.conftest import assert_served, scrape, total


def test_concurrent_requests_are_batched_and_answered_in_order(daemon, holdout) -> None:
    images = holdout[0][:256]
    sizes = [1, 3, 1, 2] * 16  # some requests carry several samples
    starts = np.cumsum([0] + sizes[:-1])
    before = scrape(daemon.metrics_url)

    def call(i: int) -> tuple[np.ndarray, str]:
        with grpcclient.InferenceServerClient(daemon.url) as c:
            chunk = images[starts[i]:starts[i] + sizes[i]]
            result = c.infer(MODEL, image_input(chunk))
            device = result.get_response().parameters["device"].string_param
            return result.as_numpy("logits"), device

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(call, range(len(sizes))))

    for i, (reply, device) in enumerate(replies):
        assert_served(reply, device, images[starts[i]:starts[i] + sizes[i]])

    after = scrape(daemon.metrics_url)

    def grew(name: str) -> float:
        return total(after, name, model=MODEL) - total(before, name, model=MODEL)
    samples = grew("hetserve_batch_size_sum")
    assert samples == sum(sizes)
    assert samples / grew("hetserve_batch_size_count") > 1.0, \
        "concurrent requests should share model runs"
    assert grew("hetserve_inferences_total") == sum(sizes)
    ok = 'hetserve_requests_total{code="OK",model="mnist_cnn"}'
    assert ok in urllib.request.urlopen(daemon.metrics_url).read().decode()
