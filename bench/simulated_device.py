"""Can the daemon feed a GPU? It serves a ResNet-50-shaped model on a simulated device that takes
each batch for as long as an H200 took (bench/curves/h200_resnet50.curve; any curve with
--curve), so that the scheduler is held to a GPU's speed on any machine. Batch-1 requests in
closed loops come from several client processes over the daemon's unix socket, their 602 KB
inputs in one system shared-memory region registered once (so the bytes never travel in the
messages), at each concurrency. Each point's bound is the lower of the curve's best rate at
that concurrency (batches of at most min(concurrency, max_batch_size)) and the echo server's
rate with the same requests (bench/echo_server.py: the transport alone); the figure is the
daemon's req/s as a share of that bound (target: >= 0.8 at concurrency 64; docs/BENCHMARKS.md).
Each side's CPU per answered request (the server's processes, the load clients) says what bounds
the figure where the machine's cores, not the device, are the limit; the daemon's main process is
its device owner where front-end processes serve gRPC (--workers 2 or more), and all of it else.
With --uint8 the images travel as uint8 (150 KB) and are normalised where the model runs
(accelerators/input_normalization.py).

    .venv/bin/python -m bench.simulated_device [--concurrency 1,16,64] [--seconds 5]
        [--clients 2] [--workers N] [--uint8] [--curve bench/curves/h200_resnet50.curve]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accelerators import safe_files
from accelerators.onnx_models import make_model
from accelerators.simulated_engine import BatchCurve
from bench import ROOT
from bench.serving import metered
from bench.shared_inputs import shared_request
from service.clients.load_client import ClientPool
from service.clients.top import fetch
from service.local_daemon import DaemonProcess, free_port, wait_ready

MODEL, DIMS, CLASSES, MAX_BATCH = "resnet50_sim", (3, 224, 224), 1000, 64
CURVE = ROOT / "bench" / "curves" / "h200_resnet50.curve"


def repository(folder: Path, curve: Path, uint8: bool) -> Path:
    """A model with ResNet-50's signature (its graph is a stand-in: the device computes nothing)
    served on `simulated:gpu0` with `curve`, one instance (one GPU's stream); with `uint8` its
    input is uint8, normalised on the device."""
    model = folder / MODEL
    (model / "1").mkdir(parents=True)
    weights = numpy_helper.from_array(np.zeros((DIMS[0], CLASSES), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])], "stand_in",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *DIMS])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [weights])
    onnx.save(make_model(graph, 17), str(model / "1" / "model.onnx"))
    shutil.copyfile(curve, model / curve.name)
    safe_files.write_file(model / "config.pbtxt", (
        f'name: "{MODEL}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [ {{ name: "image" data_type: {"TYPE_UINT8" if uint8 else "TYPE_FP32"} '
        f'dims: {list(DIMS)} }} ]\n'
        f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {CLASSES} ] }} ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
        "instance_group [ { kind: KIND_GPU count: 1 } ]\n"
        'parameters { key: "devices" value: { string_value: "simulated:gpu0" } }\n'
        f'parameters {{ key: "simulated_curve" value: {{ string_value: "{curve.name}" }} }}\n'
        'parameters { key: "latency_budget_ms" value: { string_value: "1000" } }\n'
        + ('parameters { key: "uint8_inputs" value: { string_value: "image" } }\n' if uint8
           else "")), flag=None)
    return folder


def curve_rate(curve: BatchCurve, concurrency: int) -> float:
    """The most img/s the curve allows with `concurrency` requests in flight."""
    return max(size / curve.seconds_for(size)
               for size in range(1, min(concurrency, MAX_BATCH) + 1))


def _batches(metrics_url: str) -> tuple[float, float]:
    snapshot = fetch(metrics_url)
    return (sum(snapshot.series("hetserve_batch_size_sum").values()),
            sum(snapshot.series("hetserve_batch_size_count").values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--curve", type=Path, default=CURVE)
    parser.add_argument("--workers", type=int, default=0,
                        help="the daemon's front-end processes (0: its default)")
    parser.add_argument("--uint8", action="store_true", help="uint8 images, normalised there")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    curve = BatchCurve.read(args.curve.resolve().parent, args.curve.name)
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-simulated-"))
    repo = repository(tmp / "models", args.curve, args.uint8)
    socket, echo_socket = tmp / "daemon.sock", tmp / "echo.sock"
    port, echo_port, metrics_port = free_port(), free_port(), free_port()
    daemon = DaemonProcess(["--models", str(repo), "--port", str(port), "--socket", str(socket),
                            "--metrics-port", str(metrics_port), "--log-level", "WARNING",
                            *(["--workers", str(args.workers)] if args.workers else [])],
                           f"127.0.0.1:{port}", tmp / "daemon.log")
    echo_log = safe_files.open_log(tmp / "echo.log", flag=None)
    echo = subprocess.Popen([sys.executable, "-m", "bench.echo_server", str(echo_port),
                             str(echo_socket)], cwd=ROOT, stdout=echo_log, stderr=echo_log)
    image = np.random.default_rng(0).random((1, *DIMS), np.float32)
    if args.uint8:
        image = np.round(image * 255).astype(np.uint8)
    results: dict = {"curve": str(args.curve), "uint8": args.uint8, "workers": args.workers,
                     "points": {}}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: (daemon.stop(), echo.terminate(), echo.wait()))
        daemon.wait_ready(timeout_s=300)
        wait_ready(f"127.0.0.1:{echo_port}", echo, tmp / "echo.log", 60)
        request = cleanup.enter_context(shared_request(f"unix:{socket}", MODEL, "image", image))
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        for concurrency in map(int, args.concurrency.split(",")):
            pool = ClientPool(min(args.clients, concurrency),
                              {"daemon": f"unix:{socket}", "echo": f"unix:{echo_socket}"},
                              request)
            try:
                pool.wait_ready()
                echoed = metered(echo.pid, lambda: pool.run("echo", "closed", concurrency,
                                                            args.seconds))
                before = _batches(metrics_url)
                served = metered(daemon.pid, lambda: pool.run("daemon", "closed", concurrency,
                                                              args.seconds))
                after = _batches(metrics_url)
            finally:
                pool.close()
            bound = min(curve_rate(curve, concurrency), echoed["rps"])
            samples, batches = after[0] - before[0], after[1] - before[1]
            results["points"][concurrency] = {
                "daemon": served, "echo": echoed, "curve_rate": curve_rate(curve, concurrency),
                "bound": bound, "share": served["rps"] / bound,
                "mean_batch": samples / max(batches, 1)}
    print(f"{MODEL} on a simulated device ({args.curve.name}); batch-1 {image.dtype} requests "
          f"through system shared memory, {args.clients} client processes, --workers "
          f"{args.workers or 'default'}, {args.seconds:g} s per point")
    print("| concurrency | daemon req/s | p50 ms | p99 ms | mean batch | echo req/s "
          "| curve's best | bound | daemon / bound | CPU µs/req, daemon (its main process) "
          "+ its clients | echo + its clients |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, r in results["points"].items():
        d, e = r["daemon"], r["echo"]
        print(f"| {c} | {d['rps']:,.0f} | {d['p50_ms']:.1f} | {d['p99_ms']:.1f} "
              f"| {r['mean_batch']:.1f} | {e['rps']:,.0f} | {r['curve_rate']:,.0f} "
              f"| {r['bound']:,.0f} | **{r['share']:.2f}** "
              f"| {d['server_cpu_us']:.0f} ({d['main_cpu_us']:.0f}) + {d['client_cpu_us']:.0f} "
              f"| {e['server_cpu_us']:.0f} + {e['client_cpu_us']:.0f} |")
    if args.json:
        safe_files.write_file(args.json, json.dumps(results, indent=1), flag=None)


if __name__ == "__main__":
    main()
