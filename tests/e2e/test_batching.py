"""Concurrent requests share model runs, and each gets its own answer back; batches grow with
concurrency on a device of a few ms per batch after an idle period."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.daemon import MODEL, Daemon, image_input
from tests.support.metrics import scrape, total
from tests.support.served import assert_served, write_model


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
    ok = 'hetserve_requests_total{code="OK",model="mnist_cnn",version="1"}'
    assert ok in urllib.request.urlopen(daemon.metrics_url).read().decode()


def test_batches_grow_with_concurrency_after_an_idle_period(tmp_path, holdout) -> None:
    """A simulated device of 3-4 ms per batch: one client (batches of one), then 16 clients,
    whose requests queue while a batch runs on the device's thread."""
    repo = write_model(tmp_path / "models", 64, "max_queue_delay_microseconds: 500",
                       {"devices": "simulated:gpu0", "simulated_curve": "few_ms.curve"})
    (repo / MODEL / "few_ms.curve").write_text("1 0.003\n64 0.004\n")
    # The config names the simulated device in place of the example's list.
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace(
        'parameters { key: "devices" value: { string_value: "opencl:fpga0, onnxruntime" } }\n',
        ""))
    served = Daemon(tmp_path, repo)
    image = image_input(holdout[0][:1])

    def client(requests: int) -> None:
        with grpcclient.InferenceServerClient(served.url) as c:
            for _ in range(requests):
                c.infer(MODEL, image)

    def batches() -> tuple[int, int]:
        with grpcclient.InferenceServerClient(served.url) as c:
            stats = c.get_inference_statistics(MODEL).model_stats[0]
            return stats.inference_count, stats.execution_count

    try:
        client(30)
        alone = batches()
        clients = [threading.Thread(target=client, args=(40,)) for _ in range(16)]
        for thread in clients:
            thread.start()
        pending = []  # the gauge while the clients run, then once they have their answers
        while any(thread.is_alive() for thread in clients):
            pending.append(total(scrape(served.metrics_url), "hetserve_pending_requests",
                                 model=MODEL, version="1"))
            time.sleep(0.02)  # the clients' threads share this process's GIL: leave it to them
        for thread in clients:
            thread.join()
        together = batches()
        after = total(scrape(served.metrics_url), "hetserve_pending_requests", model=MODEL,
                      version="1")
    finally:
        assert served.stop() == 0
    assert alone == (30, 30)
    samples, runs = together[0] - alone[0], together[1] - alone[1]
    assert samples == 16 * 40
    assert samples / runs > 4, f"{samples} samples in {runs} batches at concurrency 16"
    assert 0 < max(pending) <= 16 and after == 0, (pending, after)
