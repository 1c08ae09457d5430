"""Policy `efficiency` with two engines on one device: a fast, frugal one (the recording engine)
and a slow one (the faulty engine slowed down) share `gpu0` and its energy series; the router
sends nearly all work to the first, and each engine's share of the device's energy is exported."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import tritonclient.grpc as grpcclient

from tests.support.daemon import MODEL, Daemon, image_input
from tests.support.faulty_engine import CONTROL_ENV
from tests.support.metrics import scrape, total
from tests.support.recording_engine import RECORD_ENV
from tests.support.served import ENGINE_MODULE, assert_served, write_model

SLOW_S = 0.05  # added to each batch of the slow engine


def test_efficiency_sends_the_work_to_the_engine_with_fewer_joules(
        tmp_path, monkeypatch, holdout) -> None:
    control = tmp_path / "control.json"
    control.write_text(f'{{"delay_s": {SLOW_S}}}')
    monkeypatch.setenv(CONTROL_ENV, str(control))
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "shapes.jsonl"))
    models = write_model(tmp_path / "models", 8, "max_queue_delay_microseconds: 1000",
                         {"devices": "faulty:gpu0, recording:gpu0", "policy": "efficiency",
                          "latency_budget_ms": "10000"})
    daemon = Daemon(tmp_path, models, "--engine-modules",
                    f"{ENGINE_MODULE},tests.support.recording_engine",
                    "--power-sources", "gpu=model")
    try:
        images = holdout[0][:200]

        def call(i: int) -> None:
            with grpcclient.InferenceServerClient(daemon.url) as c:
                result = c.infer(MODEL, image_input(images[i:i + 1]))
                assert_served(result.as_numpy("logits"), "onnxruntime:cpu0", images[i:i + 1])

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(call, range(len(images))))
        time.sleep(2.5)  # two power samples: every batch's energy is attributed
        m = scrape(daemon.metrics_url)
    finally:
        assert daemon.stop() == 0
    fast = total(m, "hetserve_inferences_total", engine="recording")
    slow = total(m, "hetserve_inferences_total", engine="faulty")
    assert fast + slow == len(images) and fast >= 0.9 * len(images), (fast, slow)
    joules = {engine: total(m, "hetserve_engine_energy_joules_total", engine=engine,
                            device="gpu0", source="model") for engine in ("recording", "faulty")}
    assert joules["faulty"] > 0 and joules["recording"] > 0, joules
    assert joules["recording"] / fast < joules["faulty"] / slow, (joules, fast, slow)
