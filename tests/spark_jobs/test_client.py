"""The executor-side client against real daemons: RESOURCE_EXHAUSTED is retried with backoff,
UNAVAILABLE retries are bounded and consult the node's daemon, priorities follow the model."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from spark_jobs.client import ModelInterface, RetryPolicy, infer
from tests.conftest import MODELS, Daemon


def test_a_full_queue_is_retried_until_every_sample_is_answered(holdout, tmp_path, caplog):
    busy = Daemon(tmp_path, MODELS, "--max-queue-size", "128")
    try:
        model = ModelInterface.fetch(busy.url, "mnist_cnn")
        images = np.tile(holdout[0], (2, 1, 1, 1))
        with caplog.at_level(logging.WARNING, "spark_jobs.client"):
            result = infer(busy.socket_url, model, images, 128, 8, retry=RetryPolicy(
                attempts=50, first_delay_s=0.01, max_delay_s=0.1))
        assert "answered StatusCode.RESOURCE_EXHAUSTED" in caplog.text
        assert result.logits.shape == (2000, 10) and result.model_version == "1"
        assert (result.logits.argmax(1) == np.tile(holdout[1], 2)).mean() >= 0.95
    finally:
        assert busy.stop() == 0


def test_unavailable_retries_are_bounded_and_ask_for_the_nodes_daemon(daemon, tmp_path):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    asked = []

    def recover() -> str:
        asked.append(True)
        return f"unix:{tmp_path / 'still-nobody.sock'}"

    with pytest.raises(InferenceServerException) as failed:
        infer(f"unix:{tmp_path / 'nobody.sock'}", model, np.zeros((4, 1, 28, 28), np.float32),
              128, 1, retry=RetryPolicy(attempts=3, first_delay_s=0.01), recover=recover)
    assert failed.value.status() == "StatusCode.UNAVAILABLE" and len(asked) == 2


def test_batch_work_asks_for_the_models_lowest_priority(daemon):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    assert model.priority_levels == 0 and model.lowest_priority == 0  # none configured
    assert ModelInterface("m", "x", "FP32", (1,), "y", 8, priority_levels=3).lowest_priority == 3
