"""spark_jobs.interface: what a job reads of a served model, and the request sizes and priority
it derives from it."""

from __future__ import annotations

from spark_jobs.interface import ModelInterface


def test_batch_work_asks_for_the_models_lowest_priority(daemon):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    assert model.priority_levels == 0 and model.lowest_priority == 0  # none configured
    assert ModelInterface("m", "x", "FP32", (1,), "y", 8, priority_levels=3).lowest_priority == 3


def test_requests_fill_the_daemons_batch_buckets():
    powers = ModelInterface("m", "x", "FP32", (1,), "y", 100)
    assert powers.batch_buckets == (1, 2, 4, 8, 16, 32, 64, 100)
    assert powers.request_batch() == 100 and powers.request_batch(90) == 64
    preferred = ModelInterface("m", "x", "FP32", (1,), "y", 128, preferred_batch_sizes=(48, 16))
    assert preferred.batch_buckets == (16, 48) and preferred.request_batch() == 48
    assert preferred.request_batch(8) == 8  # below every bucket: as asked, padded there
