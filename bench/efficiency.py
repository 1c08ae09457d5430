"""Efficiency figures of the daemon, each next to a reference measured in the same run.

For each batch size: GFLOP/s through the daemon over GFLOP/s of in-process ONNX Runtime on the
same model (the ceiling; the two alternate in short slices so both see the same machine load),
then a steady run of the daemon alone for watts and their source, GFLOP/s per watt and joules per
inference from the daemon's own counters, and the FLOP counter checked against inferences × FLOPs
per sample. Then the request-path cost of metering (one FLOP counter increment and one busy-time
report per batch) as a fraction of a batch's compute time.

    .venv/bin/python -m bench.efficiency [--seconds 5] [--batches 1,8,64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from accelerators.engine import Device
from accelerators.flops import count_flops
from accelerators.power.meter import DeviceMeter
from accelerators.power.model import ModelEstimate
from service.clients.top import fetch
from service.local_daemon import DaemonProcess, free_port

ROOT = Path(__file__).resolve().parent.parent

MODEL = "mnist_cnn"
ONNX = ROOT / "models" / MODEL / "1" / "model.onnx"


def timed(run, seconds: float) -> list[float]:
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def throughput_ratio(client, tensor, images: np.ndarray, seconds: float,
                     slices: int = 4) -> tuple[float, float]:
    """Daemon samples/s over in-process ONNX Runtime samples/s, alternating slices; and the
    median in-process seconds per batch."""
    session = ort.InferenceSession(str(ONNX), providers=["CPUExecutionProvider"])
    ref, daemon = [], []
    for _ in range(slices):
        ref += timed(lambda: session.run(None, {"image": images}), seconds / slices)
        daemon += timed(lambda: client.infer(MODEL, [tensor]), seconds / slices)
    return (len(daemon) / sum(daemon)) / (len(ref) / sum(ref)), float(np.median(ref))


def through_daemon(client, tensor, metrics_url: str, seconds: float) -> dict:
    time.sleep(1.1)  # a power sample between runs
    before, end = fetch(metrics_url), time.monotonic() + seconds
    while time.monotonic() < end:
        client.infer(MODEL, [tensor])
    time.sleep(1.1)  # the power monitor's next sample covers the end of the run
    after = fetch(metrics_url)
    d = {n: after.total(n) - before.total(n) for n in (
        "hetserve_inferences_total", "hetserve_flops_total",
        "hetserve_device_energy_joules_total", "hetserve_model_energy_joules_total")}
    d["elapsed"] = after.time - before.time - 1.1
    d["source"] = next(iter(dict(k)["source"] for k in
                            after.series("hetserve_device_energy_joules_total")))
    return d


def metering_cost_s(repeats: int = 200_000) -> float:
    from prometheus_client import CollectorRegistry, Counter
    counter = Counter("x", "x", ["model"], registry=CollectorRegistry()).labels(model="m")
    meter = DeviceMeter(Device("cpu0", "cpu", "onnxruntime"), ModelEstimate(10, 65))
    start = time.perf_counter()
    for _ in range(repeats):
        counter.inc(24_140_586)
        meter.charge("m", 0.001)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", default="1,8,64")
    args = parser.parse_args()
    from tools import mnist_digits
    digits = mnist_digits.holdout_split()[0]
    per_sample = count_flops(ONNX).total
    port, metrics_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-bench-"))
    daemon = DaemonProcess(["--models", str(ROOT / "models"), "--port", str(port),
                            "--socket", str(tmp / "grpc.sock"), "--metrics-port",
                            str(metrics_port)], f"127.0.0.1:{port}", tmp / "daemon.log")
    daemon.wait_ready()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    print(f"FLOPs per sample: {per_sample:,} ({per_sample / 1e6:.2f} MFLOP)\n")
    print("| batch | daemon GFLOP/s | / in-process ORT | watts (source) | GFLOP/s per W "
          "| mJ per inference | FLOP counter / (inferences × FLOPs) |")
    print("|---|---|---|---|---|---|---|")
    median_batch_s = None
    try:
        for size in map(int, args.batches.split(",")):
            images = np.ascontiguousarray(np.resize(digits, (size, 1, 28, 28)), np.float32)
            tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
            tensor.set_data_from_numpy(images)
            ratio, median = throughput_ratio(client, tensor, images, args.seconds)
            median_batch_s = median_batch_s or median
            d = through_daemon(client, tensor, f"http://127.0.0.1:{metrics_port}/metrics",
                               args.seconds)
            gflops = d["hetserve_flops_total"] / d["elapsed"] / 1e9
            watts = d["hetserve_device_energy_joules_total"] / d["elapsed"]
            inferences = d["hetserve_inferences_total"]
            print(f"| {size} | {gflops:.1f} | {ratio:.2f} "
                  f"| {watts:.1f} ({'model estimate' if d['source'] == 'model' else d['source']}) "
                  f"| {gflops / watts:.3f} "
                  f"| {1e3 * d['hetserve_model_energy_joules_total'] / inferences:.2f} "
                  f"| {d['hetserve_flops_total'] / (inferences * per_sample):.6f} |")
    finally:
        client.close()
        daemon.stop()
    cost = metering_cost_s()
    print(f"\nmetering on the request path: {cost * 1e6:.2f} µs per batch = "
          f"{cost / median_batch_s:.4f} of one batch-{args.batches.split(',')[0]} inference "
          f"({median_batch_s * 1e6:.0f} µs in-process)")


if __name__ == "__main__":
    main()
