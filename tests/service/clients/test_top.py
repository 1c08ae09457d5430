"""`hetserve top` against a real daemon under load, and its histogram quantiles."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from service.clients.top import Snapshot, quantile, render
from tests.support.daemon import ROOT, Daemon
from tests.support.prometheus_stack import Load
from tests.support.served import node_devices


def test_quantile_interpolates_within_buckets_like_prometheus() -> None:
    buckets = {0.1: 10.0, 0.2: 30.0, math.inf: 40.0}
    assert quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: half-way through (0.1, 0.2]
    assert quantile(0.125, buckets) == pytest.approx(0.05)  # rank 5: half-way through (0, 0.1]
    assert quantile(0.9, buckets) == 0.2  # in +Inf: the highest finite bound
    assert math.isnan(quantile(0.5, {0.1: 0.0, math.inf: 0.0}))


def test_top_shows_the_node_under_load(daemon: Daemon,
                                       holdout: tuple[np.ndarray, np.ndarray]) -> None:
    load = Load(daemon.url, holdout[0])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service", "top", "--url", daemon.metrics_url,
             "--interval", "1", "--once"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        load.stop()
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    model = next(r for r in rows if r[:1] == ["mnist_cnn"] and len(r) == 6)
    assert float(model[1].replace(",", "")) > 0  # requests/s
    # The device of the example model's on this node that took most of the load: `prefer`
    # spills past the emulated fpga0 (its pipeline runs at an emulator's speed) to the next.
    # Its kind column says `fpga-emulator` for the emulator.
    devices = [r for r in rows if r[:1] and r[0] in node_devices() and len(r) == 9
               and r[1].startswith(r[0].rstrip("0123456789"))]
    device = max(devices, key=lambda r: float(r[6].replace(",", "")))
    served = device[0]
    source, up, watts = device[2], device[3], float(device[5].replace(",", ""))
    assert up == "1" and watts > 0
    assert float(device[8]) > 0  # GFLOP/s per watt
    if source == "model*":  # no sensor here: the figure is marked as an estimate
        assert "model* and model (est.): an estimate" in done.stdout
    per_inference = next(r for r in rows if r[:2] == ["mnist_cnn", served])
    assert float(per_inference[3]) > 0 and float(per_inference[4]) >= float(per_inference[3])
    if source == "model*":
        assert per_inference[5:] == ["model", "(est.)"]


def _snapshot(at: float, joules: float, inferences: float, ok: float, failed: float
              ) -> Snapshot:
    def labels(**pairs: str) -> frozenset:
        return frozenset(pairs.items())

    return Snapshot(at, {
        ("hetserve_model_energy_joules_total", labels(model="m", device="cpu0", kind="cpu",
                                                      source="model")): joules,
        ("hetserve_model_energy_joules_total", labels(model="m", device="fpga0", kind="fpga",
                                                      source="xrt")): joules / 4,
        ("hetserve_inferences_total", labels(model="m", device="cpu0")): inferences,
        ("hetserve_inferences_total", labels(model="m", device="fpga0")): inferences,
        ("hetserve_requests_total", labels(model="m", code="OK")): ok,
        ("hetserve_requests_total", labels(model="m", code="RESOURCE_EXHAUSTED")): failed,
        ("hetserve_requests_total", labels(model="", code="NOT_FOUND")): failed})


def test_joules_per_request_are_per_inference_times_the_models_rows_per_request() -> None:
    # Over 2 s: cpu0 2 J and fpga0 0.5 J for 100 rows each; 25 requests answered, 5 refused.
    frame = render(_snapshot(10.0, 1.0, 50, 10, 0), _snapshot(12.0, 3.0, 150, 35, 5), "url")
    rows = {r[1]: r for r in (line.split() for line in frame.splitlines())
            if r[:1] == ["m"] and len(r) > 4}
    assert rows["cpu0"][2:] == ["50.0", "20.000", "160.000", "model", "(est.)"]  # 8 rows/request
    assert rows["fpga0"][2:] == ["50.0", "5.000", "40.000", "xrt"]
    assert "model* and model (est.): an estimate" in frame
    assert "mJ/INFERENCE" in frame and "mJ/REQUEST" in frame  # milli, not mega
    assert next(line for line in frame.splitlines() if line.startswith("(no model)")).split()[
        2:4] == ["2.5", "2.5"]  # requests naming no served model: 5 in 2 s, all failed


def test_top_reports_an_unreachable_daemon() -> None:
    done = subprocess.run([sys.executable, "-m", "service", "top", "--url",
                           "http://127.0.0.1:1/metrics", "--once"], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "cannot read http://127.0.0.1:1/metrics" in done.stderr
