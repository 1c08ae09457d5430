"""Every response carries what its request cost, and the parts add up to the model's energy
counter: a real daemon (one process, and front-ends), tritonclient, unary requests of 1-3 rows
batched together and a stream's."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from accelerators.flops import count_flops
from service import contract
from tests.support.daemon import MODEL, ROOT, Daemon, image_input
from tests.support.metrics import scrape, total
from tests.support.served import node_devices

REQUESTS = 600
STREAMED = 20
FLOPS_PER_IMAGE = count_flops(ROOT / "models" / MODEL / "1" / "model.onnx").total


@pytest.mark.parametrize("workers", ["1", "2"])
def test_per_request_joules_add_up_to_the_models_energy(
        tmp_path: Path, holdout: tuple[np.ndarray, np.ndarray], workers: str) -> None:
    device = node_devices()[0]
    daemon = Daemon(tmp_path, ROOT / "models", "--workers", workers, "--power-sources",
                    "cpu=model,gpu=model", "--power-model", f"{device}=20:60")
    images = holdout[0]
    replies: list[grpcclient.InferResult] = []
    errors: list[Exception] = []
    done = threading.Semaphore(0)

    def answered(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        (errors if error else replies).append(error or result)
        done.release()

    client = grpcclient.InferenceServerClient(daemon.url)
    try:
        rows = [1 + i % 3 for i in range(REQUESTS)]
        for i, n in enumerate(rows):  # 16 in flight: the batcher packs them together
            if i >= 16:
                done.acquire()
            client.async_infer(MODEL, image_input(images[i % 100:i % 100 + n]), answered)
        for _ in range(min(16, REQUESTS)):
            done.acquire()
        client.start_stream(answered)  # and through ModelStreamInfer
        for i in range(STREAMED):
            client.async_stream_infer(MODEL, image_input(images[i:i + 1]))
            rows.append(1)
        for _ in range(STREAMED):
            done.acquire()
        client.stop_stream()
        after = scrape(daemon.metrics_url)
    finally:
        client.close()
        assert daemon.stop() == 0
    assert not errors, errors[:3]
    parameters = [r.get_response().parameters for r in replies]
    joules = [p[contract.ENERGY_PARAMETER].double_param for p in parameters]
    assert all(j > 0 for j in joules)
    assert {p[contract.POWER_SOURCE_PARAMETER].string_param for p in parameters} == {"model"}
    assert {p[contract.ENERGY_METHOD_PARAMETER].string_param for p in parameters} == {
        contract.ENERGY_METHOD}
    assert sorted(p[contract.FLOPS_PARAMETER].int64_param for p in parameters) == sorted(
        n * FLOPS_PER_IMAGE for n in rows)
    # Exact by construction: nothing is in flight at the scrape, so no edge to tolerate.
    # Over every device that served (the example model lists two where an FPGA is).
    counter = total(after, "hetserve_model_energy_joules_total", model=MODEL)
    assert sum(joules) == pytest.approx(counter, rel=1e-9)


def test_the_parameters_can_be_left_out(tmp_path: Path,
                                        holdout: tuple[np.ndarray, np.ndarray]) -> None:
    daemon = Daemon(tmp_path, ROOT / "models", "--response-energy", "off")
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            reply = client.infer(MODEL, image_input(holdout[0][:1]))
    finally:
        assert daemon.stop() == 0
    assert set(reply.get_response().parameters) == {contract.DEVICE_PARAMETER}
