"""Batch buckets: fixed batch sizes from config.pbtxt, padding that never reaches a reply, and a
daemon whose engines see only bucket shapes after READY, each bucket warmed on every instance
first (a recording engine, computing with real ONNX Runtime, stands in for a GPU)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from service.core.buckets import Buckets
from service.core.model_settings import parse_buckets
from service.errors import ConfigError
from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.metrics import scrape, total
from tests.support.recording_engine import RECORD_ENV, records
from tests.support.served import write_model


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, model_config_pb2.ModelConfig())


def test_buckets_are_the_preferred_sizes_else_powers_of_two_and_the_maximum() -> None:
    # max_batch_size itself too: a client's full request of 20 rows is one unpadded run.
    assert parse_buckets(_config("max_batch_size: 20")).sizes == (1, 2, 4, 8, 16, 20)
    assert parse_buckets(_config(
        "max_batch_size: 64 dynamic_batching { preferred_batch_size: [8, 2] }")).sizes == (2, 8)
    assert parse_buckets(_config("max_batch_size: 0")) is None


def test_a_preferred_size_above_max_batch_size_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"preferred_batch_size 16 .* accepted values are "
                                          r"1 to 8"):
        parse_buckets(_config(
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [4, 16] }"))


def test_batches_are_padded_up_and_split_and_replies_lose_the_padding() -> None:
    buckets = Buckets((2, 4))
    assert buckets.plan(1) == [(1, 2)]
    assert buckets.plan(4) == [(4, 4)]
    assert buckets.plan(11) == [(4, 4), (4, 4), (3, 4)]
    seen = []

    def run(inputs, outputs):
        seen.append(inputs["x"].shape)
        return {"y": inputs["x"] * 2}

    x = np.arange(11 * 3, dtype=np.float32).reshape(11, 3) + 1
    result, padding = buckets.run(run, {"x": x}, ["y"], 11)
    assert seen == [(4, 3)] * 3 and padding == 1
    np.testing.assert_array_equal(result["y"], x * 2)

    given = []
    Buckets((4,)).run(lambda inputs, outputs: given.append(inputs["x"].copy()) or inputs,
                      {"x": x[:2]}, ["x"], 2)
    np.testing.assert_array_equal(given[0], np.concatenate([x[:2], np.zeros((2, 3))]))


def _repository(root: Path) -> Path:
    """The example model bucketed as [1, 2, 4] on two instances, and a model whose preferred
    batch size exceeds its max_batch_size."""
    write_model(root, 8, "max_queue_delay_microseconds: 20000 preferred_batch_size: [1, 2, 4]",
                {"devices": "recording:gpu0"}, instances=2)
    bad = root / "bad_buckets"
    (bad / "1").mkdir(parents=True)
    shutil.copy(MODELS / MODEL / "1" / "model.onnx", bad / "1")
    shutil.copy(MODELS / MODEL / "labels.txt", bad)
    (bad / "config.pbtxt").write_text(
        (root / MODEL / "config.pbtxt").read_text().replace(MODEL, "bad_buckets")
        .replace("preferred_batch_size: [1, 2, 4]", "preferred_batch_size: [4, 16]"))
    return root


def test_engines_see_only_warmed_bucket_shapes_and_replies_are_unpadded(
        tmp_path, monkeypatch, holdout) -> None:
    record = tmp_path / "shapes.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(record))
    daemon = Daemon(tmp_path, _repository(tmp_path / "models"), "--engine-modules",
                    "tests.support.recording_engine")
    try:
        warmup = records(record)
        engines = {r["engine"] for r in warmup}
        assert len(engines) == 2  # both instances
        for engine in engines:
            assert sorted(r["rows"] for r in warmup if r["engine"] == engine) == [1, 1, 2, 2,
                                                                                  4, 4]

        images = holdout[0][:40]
        sizes = [1, 3, 5, 7, 2, 8, 1, 6, 4, 3]
        starts = np.cumsum([0, *sizes[:-1]])

        def call(i: int) -> np.ndarray:
            with grpcclient.InferenceServerClient(daemon.url) as c:
                return c.infer(MODEL, image_input(images[starts[i]:starts[i] + sizes[i]])
                               ).as_numpy("logits")

        with ThreadPoolExecutor(len(sizes)) as pool:
            replies = list(pool.map(call, range(len(sizes) - 1)))
        replies.append(call(len(sizes) - 1))  # 3 rows alone: padded to 4 whatever came before
        served = records(record)[len(warmup):]
        assert served and {r["rows"] for r in served} <= {1, 2, 4}
        reference = OnnxRuntimeEngine(MODELS / MODEL / "1" / "model.onnx", 1, use_gpu=False)
        for i, reply in enumerate(replies):
            rows = images[starts[i]:starts[i] + sizes[i]]
            assert reply.shape == (sizes[i], 10)
            expected = reference.run({"image": rows}, ["logits"])["logits"]
            np.testing.assert_allclose(reply, expected, rtol=reference.tolerance, atol=1e-5)
        samples = scrape(daemon.metrics_url)
        padded = sum(r["rows"] for r in served) - sum(sizes)
        assert padded > 0
        assert total(samples, "hetserve_padding_samples_total", model=MODEL) == padded
        assert total(samples, "hetserve_model_warmup_seconds", model=MODEL) > 0

        with grpcclient.InferenceServerClient(daemon.url) as c:
            assert c.is_model_ready(MODEL) and not c.is_model_ready("bad_buckets")
            index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
        assert "preferred_batch_size 16" in index["bad_buckets"]["reason"]
        assert "1 to 8" in index["bad_buckets"]["reason"]
    finally:
        assert daemon.stop() == 0
