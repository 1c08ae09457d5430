"""The report writer: given results, Markdown that shows every figure and PNGs that exist and
decode; watts labelled with their source."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from bench.batch_table import Point
from bench.plots import pareto_front
from bench.report import write_report


def points() -> list[dict]:
    out = []
    for path, scale in (("in-process", 1.0), ("daemon", 0.8)):
        for batch, rate in ((1, 1000.0), (8, 2000.0)):
            out.append(Point("mnist_cnn", "cpu0", "onnxruntime", path, batch, 24_000_000,
                             rate * scale, 65.0, "model"))
        out.append(Point("resnet50", "cpu0", "opencl", path, 1, 8_000_000_000, 5.0 * scale,
                         40.0, "rapl"))
        out.append(Point("resnet50", "cpu0", "opencl", path, 256, 8_000_000_000,
                         note="skipped: about 50 s per batch (over --max-batch-s)"))
    return [p.as_dict() for p in out]


def loadgen_runs() -> list[dict]:
    common = {"model": "mnist_cnn", "log_dir": "/x/Server", "errors": {}, "constraints": {
        "Min duration satisfied": "Yes", "Early stopping satisfied": "NO"}}
    return [
        {**common, "scenario": "Server", "mode": "PerformanceOnly", "valid": False,
         "result": 149.5, "result_unit": "samples/s", "target_qps": 150,
         "target_latency_ms": 15, "latency_ms": {"p50": 3.1, "p90": 4.0, "p99": 9.2},
         "samples": 1500, "sut_latency_ms": [1.0, 2.0, 3.0, 9.0]},
        {**common, "scenario": "Offline", "mode": "PerformanceOnly", "valid": True,
         "result": 3000.0, "result_unit": "samples/s", "log_dir": "/x/Offline",
         "latency_ms": {"p50": 900.0, "p99": 3000.0}, "samples": 33000,
         "sut_latency_ms": [100.0, 150.0]},
        {**common, "scenario": "Offline", "mode": "AccuracyOnly", "valid": False,
         "result": None, "result_unit": "", "accuracy": 0.979, "accuracy_samples": 1000,
         "log_dir": "/x/Offline-accuracy", "samples": 1000, "sut_latency_ms": [5.0]},
    ]


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 200 and image.height > 200
        image.verify()


def test_report_shows_tables_and_valid_pngs(tmp_path: Path) -> None:
    results = {"meta": {"command": "python -m bench run"}, "loadgen": loadgen_runs(),
               "batch_table": points()}
    report = write_report(results, tmp_path)
    text = report.read_text()
    for name in ("latency_cdf.png", "throughput.png", "efficiency.png", "tradeoff.png"):
        assert f"]({name})" in text
        assert_png(tmp_path / name)
    assert "| Server | MNIST CNN | INVALID (Early stopping) | 149.5 samples/s" in text
    assert "| 0.05 |" in text  # Server over Offline samples/s, same run
    assert "accuracy 97.9% of 1000" in text
    assert "| MNIST CNN | onnxruntime:cpu0 daemon | 800 (0.80×) | 1,600 (0.80×) | - |" in text
    assert "| ResNet-50 | opencl:cpu0 in-process | 5.0 | - | - |" in text  # 256 skipped
    assert "| MNIST CNN | onnxruntime:cpu0 in-process | 8 | 2,000.0 | 65.0 (model estimate) " \
           "| 48.0 | 0.738 | 0.0325 |" in text  # the most efficient batch
    assert "40.0 (rapl)" in text
    # One model and device: the faster batch is also the more efficient, the front one point.
    assert "| MNIST CNN | daemon | onnxruntime:cpu0, 8 (1,600.0, 0.591) |" in text
    assert json.loads((tmp_path / "results.json").read_text())["loadgen"][0]["result"] == 149.5


def test_report_without_watts_has_no_efficiency_figure(tmp_path: Path) -> None:
    rows = [Point("alexnet", "gpu0", "opencl", "in-process", b, 10**9, 100.0 * b).as_dict()
            for b in (1, 8)]
    text = write_report({"batch_table": rows}, tmp_path).read_text()
    assert_png(tmp_path / "throughput.png")
    assert not (tmp_path / "efficiency.png").exists() and "efficiency.png" not in text
    assert not (tmp_path / "tradeoff.png").exists() and "Pareto" not in text
    assert "| AlexNet | opencl:gpu0 in-process | 100 | 800 |" in text


def test_the_pareto_front_keeps_the_points_nothing_beats_on_both_axes() -> None:
    def point(device: str, batch: int, rate: float, watts: float) -> dict:
        return Point("resnet50", device, "opencl", "daemon", batch, 10**9, rate, watts,
                     "xrt").as_dict()

    fpga = [point("fpga0", 1, 100.0, 20.0), point("fpga0", 8, 300.0, 25.0)]  # 5, 12 GFLOP/s/W
    gpu = [point("gpu0", 1, 200.0, 100.0), point("gpu0", 64, 2000.0, 250.0)]  # 2, 8
    cpu = [point("cpu0", 8, 250.0, 65.0), point("cpu0", 16, 300.0, 70.0)]  # dominated by fpga0 8
    front = pareto_front(fpga + gpu + cpu)
    assert [(p["device"], p["batch"]) for p in front] == [("fpga0", 8), ("gpu0", 64)]
    assert pareto_front([point("cpu0", 1, 10.0, 10.0)] * 2)[0]["batch"] == 1  # ties: one point
    assert pareto_front([]) == []
