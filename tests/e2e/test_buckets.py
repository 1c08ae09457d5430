"""Batch buckets end to end: a daemon warms each bucket and its engines see only those shapes;
replies are unpadded."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.metrics import scrape, total
from tests.support.recording_engine import RECORD_ENV, records
from tests.support.served import write_model


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
