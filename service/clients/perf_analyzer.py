"""Triton's perf_analyzer (a C++ client: never the bottleneck) against a serving target, when it
is installed: on PATH, or named by PERF_ANALYZER (docs/serving.md says how to get it). Used by
`hetserve tune` and the serving benchmark."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def find() -> str | None:
    return os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")


def run(binary: str, model: str, address: str, concurrency: int, seconds: float,
        streaming: bool = False, shared_memory: str = "none") -> dict:
    """One load point: infer/s and latency percentiles as perf_analyzer measured them, averaged
    over its three measurement windows of `seconds` / 3 each. `shared_memory` "system" puts the
    inputs and outputs in regions it registers (the daemon takes them on its unix socket,
    `unix://PATH`, or over TCP with its token)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.csv"
        result = subprocess.run(
            [binary, "-m", model, "-u", address, "-i", "grpc",
             "--concurrency-range", str(concurrency),
             "--measurement-interval", str(max(int(seconds * 1000 / 3), 100)),
             # any spread between windows is accepted: the machine's noise hits every target
             # of one run alike, and the table compares them
             "--stability-percentage", "1000", "-f", str(report),
             "--shared-memory", shared_memory, *(["--streaming"] if streaming else [])],
            capture_output=True, text=True, timeout=120 + 10 * seconds)
        if result.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed ({result.returncode}): "
                               f"{(result.stdout + result.stderr)[-2000:]}")
        return parse_report(report.read_text())


def parse_report(text: str) -> dict:
    """perf_analyzer's CSV report (-f): its one row, latencies in µs."""
    row = next(csv.DictReader(text.splitlines()))
    return {"rps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3}
