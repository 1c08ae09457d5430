"""stream.py: a real Structured Streaming query over request files, scored through a real
daemon; stopped, restarted and made to replay a batch, its sink holds each request once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spark_jobs.energy import ENERGY_FILE
from spark_jobs.stream import parse_args, start

ROWS_PER_FILE = 40


def _drop(folder: Path, number: int, images: np.ndarray) -> None:
    """One JSON-lines request file, written aside and renamed in, as producers should."""
    ids = range(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE)
    lines = [json.dumps({"id": i, "tensor": images[i].ravel().round(4).tolist()}) for i in ids]
    part = folder / f".{number}.tmp"
    part.write_text("\n".join(lines) + "\n")
    part.rename(folder / f"requests-{number}.json")


def _sink(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def test_stopped_restarted_and_replayed_query_scores_every_request_once(
        spark, daemon, holdout, tmp_path):
    images, labels = holdout
    requests, sink, checkpoint = (tmp_path / n for n in ("requests", "sink", "checkpoint"))
    requests.mkdir()
    common = ["--input", str(requests), "--output", str(sink), "--checkpoint", str(checkpoint),
              "--daemon", daemon.socket_url, "--no-start-daemon", "--max-files-per-trigger", "1",
              "--energy-column"]
    for n in range(3):
        _drop(requests, n, images)

    # A continuous query, stopped after its first micro-batch with files still waiting.
    query = start(spark, parse_args([*common, "--trigger-s", "0.5"]))
    deadline = time.monotonic() + 120
    while not (checkpoint / "commits" / "0").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    first = _sink(sink)
    assert 0 < len(first) < 3 * ROWS_PER_FILE and first["id"].is_unique

    # Restarted with more files: it goes on where it stopped.
    for n in range(3, 5):
        _drop(requests, n, images)
    query = start(spark, parse_args([*common, "--available-now"]))
    query.awaitTermination(180)
    scored = _sink(sink)
    assert sorted(scored["id"]) == list(range(5 * ROWS_PER_FILE))

    # A batch whose output was written but whose commit was lost (a crash between the two)
    # is replayed on restart: it replaces its own folder instead of adding rows.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    replayed = sink / f"batch_id={last}"
    before = replayed.stat().st_mtime_ns
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    query = start(spark, parse_args([*common, "--available-now"]))
    query.awaitTermination(180)
    assert replayed.stat().st_mtime_ns != before, "the batch was not replayed"
    scored = _sink(sink)
    assert sorted(scored["id"]) == list(range(5 * ROWS_PER_FILE))
    scored = scored.sort_values("id")
    assert (scored["label"].to_numpy() == labels[:5 * ROWS_PER_FILE]).mean() >= 0.9
    assert not [p for p in sink.iterdir() if p.name.startswith(".")]  # no staging left

    # Each micro-batch's energy, inside its folder: its rows and their shares of the joules.
    for folder in sink.glob("batch_id=*"):
        rows = pd.read_parquet(folder)
        summary = json.loads((folder / ENERGY_FILE).read_text())
        assert summary["rows"] == len(rows) > 0 and summary["estimate"]
        assert summary["joules"] == pytest.approx(rows["energy_joules"].sum(), rel=1e-9)
        assert summary["joules"] > 0
