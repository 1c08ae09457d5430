"""`python -m bench run` end to end, kept to seconds: a LoadGen Server run against a daemon it
starts, the batch table for one model on the CPU in-process and through a daemon, the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_run_writes_report_and_json(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = bench("run", "--out", str(out), "--json",
                 "--scenarios", "Server", "--loadgen-seconds", "1", "--server-qps", "100",
                 "--models", "mnist_cnn", "--devices", "onnxruntime:cpu0", "--batches", "1", "4",
                 "--seconds", "0.2")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert [r["scenario"] for r in results["loadgen"]] == ["Server"]
    table = results["batch_table"]
    assert {(p["path"], p["batch"]) for p in table} == {
        (path, b) for path in ("in-process", "daemon") for b in (1, 4)}
    assert all(p["images_per_s"] > 0 and p["power_source"] for p in table)
    assert (out / "loadgen" / "Server" / "mlperf_log_summary.txt").exists()
    text = (out / "report.md").read_text()
    assert "## MLPerf LoadGen scenarios" in text and "## Images/s by batch size" in text
    for png in ("latency_cdf.png", "throughput.png", "efficiency.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_flags_are_refused_before_anything_runs(tmp_path: Path) -> None:
    done = bench("table", "--out", str(tmp_path), "--devices", "cuda:0", timeout=60)
    assert done.returncode == 2
    assert "--devices: device 'cuda:0': engine 'cuda' is unknown" in done.stderr
    done = bench("loadgen", "--out", str(tmp_path), "--server-qps", "0", timeout=60)
    assert done.returncode == 2 and "--server-qps: '0' is not a positive number" in done.stderr
    assert not any(tmp_path.iterdir())
