"""The Arrow executor path without Spark: every layout of the tensor column that Spark can hand
over (raw bytes, large bytes, fixed-size bytes, arrays, sliced batches) is read as the same
samples, malformed rows are named or kept as error rows, and a batch's output lines up with it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from pyspark import Accumulator

from spark_jobs.arrow_scoring import score_batches
from spark_jobs.daemon import NoDaemonError, NodeDaemon
from spark_jobs.energy import TallyParam
from spark_jobs.interface import ModelInterface
from spark_jobs.options import ScoreOptions
from spark_jobs.results import ENERGY_COLUMN
from tests.support.served import reply_devices


@pytest.fixture(scope="module")
def options(daemon) -> ScoreOptions:
    return ScoreOptions(NodeDaemon(daemon.socket_url, None, "test"),
                        ModelInterface.fetch(daemon.url, "mnist_cnn"), top_k=3)


def _layouts(images: np.ndarray) -> dict[str, pa.Array]:
    raw = [x.tobytes() for x in images]
    return {"binary": pa.array(raw, pa.binary()),
            "large_binary": pa.array(raw, pa.large_binary()),
            "fixed_size_binary": pa.array(raw, pa.binary(images[0].nbytes)),
            "array<float>": pa.array([x.ravel() for x in images], pa.list_(pa.float32())),
            "array<double>": pa.array([x.ravel().astype(np.float64) for x in images],
                                      pa.list_(pa.float64()))}


def _score(options: ScoreOptions, *batches: pa.RecordBatch) -> list[pa.RecordBatch]:
    return list(score_batches(iter(batches), options))


def test_every_tensor_layout_and_slice_scores_alike(options, holdout):
    images, labels = holdout[0][:300], holdout[1][:300]
    expected = None
    for name, column in _layouts(images).items():
        batch = pa.RecordBatch.from_pydict({"id": pa.array(range(300), pa.int64()),
                                            "tensor": column})
        out = _score(options, batch.slice(0, 130), pa.RecordBatch.from_pydict(
            {"id": pa.array([], pa.int64()), "tensor": column.slice(0, 0)}), batch.slice(130))
        assert [b.num_rows for b in out] == [130, 170], name  # empty batches are skipped
        scored = pa.Table.from_batches(out)
        assert scored.column("id").to_pylist() == list(range(300))
        label = np.asarray(scored.column("label"))
        assert scored.schema.field("label").type == pa.int32()
        assert (label == labels).mean() >= 0.95, name
        top = np.stack(scored.column("top_labels").to_numpy(zero_copy_only=False))
        assert top.shape == (300, 3) and (top[:, 0] == label).all()
        if expected is None:
            expected = scored.column("top_scores").to_pylist()
        # Each batch on whichever device served it: OpenCL and ONNX Runtime agree to ~1e-5.
        np.testing.assert_allclose(scored.column("top_scores").to_pylist(), expected,
                                   rtol=1e-4, atol=1e-7, err_msg=name)
        assert set(scored.column("device").to_pylist()) <= set(reply_devices())
        assert set(scored.column("model_version").to_pylist()) == {"1"}


def test_malformed_rows_are_named_or_kept_as_error_rows(options, holdout):
    good = holdout[0][0].tobytes()
    batch = pa.RecordBatch.from_pydict({
        "id": pa.array([7, 8, 9, 10], pa.int64()),
        "tensor": pa.array([good, good[:2800], None, good[:2801]], pa.binary())})
    with pytest.raises(ValueError, match=r"row id 8: tensor holds 700 values, 784 expected "
                                         r"for image \[1, 28, 28\]"):
        _score(options, batch)
    kept = pa.Table.from_batches(_score(ScoreOptions(
        options.daemon, options.model, keep_errors=True), batch)).to_pydict()
    assert kept["id"] == [7, 8, 9, 10]
    assert kept["label"][0] == holdout[1][0] and kept["label"][1:] == [None] * 3
    assert kept["top_labels"][1:] == kept["device"][1:] == [None] * 3
    assert kept["error"][0] is None
    assert "holds no tensor" in kept["error"][2] and "holds 2801 bytes" in kept["error"][3]
    with pytest.raises(ValueError, match="column tensor is string"):
        _score(options, pa.RecordBatch.from_pydict({"id": [1], "tensor": ["x"]}))


def test_a_task_whose_node_has_no_daemon_and_may_not_start_one_fails_naming_it(options,
                                                                               holdout,
                                                                               tmp_path):
    nobody = f"unix:{tmp_path / 'nobody.sock'}"
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()),
                                        "tensor": pa.array([holdout[0][0].tobytes()])})
    with pytest.raises(NoDaemonError, match=f"no hetserve daemon answers at {nobody}, and "
                                            "this job starts none"):
        _score(ScoreOptions(NodeDaemon(nobody, None, "test"), options.model), batch)


def test_energy_is_tallied_by_device_and_source_and_spread_over_the_rows(options, holdout):
    images = holdout[0][:300]
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(300), pa.int64()),
                                        "tensor": pa.array([x.tobytes() for x in images])})
    used = Accumulator(-1, {}, TallyParam())  # a driver-side accumulator, without Spark
    scored = pa.Table.from_batches(_score(dataclasses.replace(
        options, energy=used, energy_column=True, batch_size=64), batch.slice(0, 100),
        batch.slice(100)))
    joules = np.asarray(scored.column(ENERGY_COLUMN))
    assert scored.schema.field(ENERGY_COLUMN).type == pa.float64()
    assert (joules > 0).all()
    # By the devices that served (the example model lists two where an FPGA is).
    assert {device for device, _ in used.value} <= set(reply_devices())
    assert {source for _, source in used.value} == {"model"}  # no sensor here: an estimate
    rows, total, flops = (sum(v[i] for v in used.value.values()) for i in range(3))
    assert rows == 300 and total == pytest.approx(joules.sum(), rel=1e-9)
    assert flops == 300 * 24_140_586  # the example model's FLOPs per sample
    without = _score(options, batch)[0]
    assert ENERGY_COLUMN not in without.schema.names
