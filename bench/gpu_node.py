"""GPU-node serving benchmark: MNIST and ResNet-50 (tools/cnn_architectures.py) through the daemon
on the node's best device (`devices: onnxruntime`: every GPU where onnxruntime-gpu finds one,
else the CPU), batch-1 requests in closed loops at several concurrencies from several client
processes (so the client is not the bottleneck), next to the same engine in this process at each
bucket size, in one run. Per load point: req/s, p50/p99, the daemon's mean batch, mean compute
per batch next to the in-process time of the bucket that holds the mean batch with its padding
(the per-batch overhead on the device), padding rows; the ratio to in-process at batch 32 is the
throughput target (ResNet-50 at concurrency 64 >= 0.8x; docs/BENCHMARKS.md, GPU nodes). First,
the MNIST hold-out accuracy of each precision the engine offers on that device (FP32, TF32 on
GPUs, FP16). Runs on a CPU-only machine too (then the CPU serves).

With --shared-memory system the clients talk to the daemon's unix socket and each request names
one registered region that holds its image (bench/shared_inputs.py): the bytes never cross the
messages, so the client is not what limits the daemon. With --client perf_analyzer, Triton's
C++ client drives the load points instead of the Python processes (its own regions with
--shared-memory system; found on PATH or by $PERF_ANALYZER, docs/serving.md says how to get it),
and the table names the client.

    .venv/bin/python -m bench.gpu_node [--models mnist,resnet50] [--concurrency 1,16,64,256]
        [--seconds 10] [--clients 4] [--buckets auto] [--devices onnxruntime]
        [--instances N] [--shared-memory none|system] [--client python|perf_analyzer]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from accelerators import safe_files
from accelerators.engine_options import EngineOptions
from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from bench.shared_inputs import shared_request
from service.clients import perf_analyzer
from service.clients.load_client import ClientPool, infer_request
from service.clients.top import fetch
from service.local_daemon import DaemonProcess, free_port

ROOT = Path(__file__).resolve().parent.parent

MAX_BATCH = 64
SHAPES = {"mnist": ("image", (1, 28, 28), "logits", 10),
          "resnet50": ("image", (3, 224, 224), "logits", 1000)}


def repository(folder: Path, models: list[str], buckets: str, devices: str,
               instances: int = 0) -> Path:
    import onnx

    from tools import cnn_architectures

    for name in models:
        (folder / name / "1").mkdir(parents=True)
        path = folder / name / "1" / "model.onnx"
        if name == "mnist":
            shutil.copy(ROOT / "models" / "mnist_cnn" / "1" / "model.onnx", path)
        else:
            onnx.save(cnn_architectures.resnet50(), str(path))
        inp, dims, out, classes = SHAPES[name]
        config = (
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH}\n'
            f'input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: {list(dims)} }} ]\n'
            f'output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ {classes} ] }} ]\n'
            "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
            f'parameters {{ key: "batch_buckets" value: {{ string_value: "{buckets}" }} }}\n'
            f'parameters {{ key: "devices" value: {{ string_value: "{devices}" }} }}\n'
            + (f"instance_group [ {{ kind: KIND_GPU count: {instances} }} ]\n"
               if instances else ""))
        safe_files.write_file(folder / name / "config.pbtxt", config, flag=None)
    return folder


# --- the client processes ---------------------------------------------------------------------

def load(url: str, model: str, concurrency: int, seconds: float, clients: int,
         socket_url: str = "", analyzer: str | None = None) -> dict:
    """Batch-1 closed loops from `clients` processes (service/clients/load_client.py), or from
    perf_analyzer (`analyzer`, its binary); with `socket_url`, over the daemon's unix socket with
    the image in shared memory."""
    if analyzer:
        return perf_analyzer.run(
            analyzer, model, "unix://" + socket_url.removeprefix("unix:") if socket_url else url,
            concurrency, seconds, shared_memory="system" if socket_url else "none")
    inp, dims, _, _ = SHAPES[model]
    image = np.random.default_rng(0).random((1, *dims), np.float32)
    with contextlib.ExitStack() as stack:
        if socket_url:
            request = stack.enter_context(shared_request(socket_url, model, inp, image))
        else:
            request = infer_request(model, {inp: image})
        pool = ClientPool(min(clients, concurrency), {"daemon": socket_url or url}, request)
        try:
            pool.wait_ready()
            return pool.run("daemon", "closed", concurrency, seconds)
        finally:
            pool.close()


def _sum(snapshot, name: str, model: str) -> float:
    return sum(v for k, v in snapshot.series(name).items() if dict(k).get("model") == model)


def through_daemon(url: str, metrics_url: str, model: str, concurrency: int, seconds: float,
                   clients: int, socket_url: str = "", analyzer: str | None = None) -> dict:
    before = fetch(metrics_url)
    result = load(url, model, concurrency, seconds, clients, socket_url, analyzer)
    after = fetch(metrics_url)
    d = {n: _sum(after, n, model) - _sum(before, n, model) for n in (
        "hetserve_batch_size_sum", "hetserve_batch_size_count",
        "hetserve_compute_duration_seconds_sum", "hetserve_padding_samples_total")}
    batches = d["hetserve_batch_size_count"] or 1
    return result | {"mean_batch": d["hetserve_batch_size_sum"] / batches,
                     "compute_ms_per_batch": 1e3 * d["hetserve_compute_duration_seconds_sum"]
                     / batches,
                     "padding_share": d["hetserve_padding_samples_total"]
                     / max(1.0, d["hetserve_batch_size_sum"])}


# --- in-process reference ---------------------------------------------------------------------

def in_process(path: Path, model: str, sizes: list[int], seconds: float) -> dict[int, dict]:
    """The daemon's engine (a session per bucket on GPUs) in this process, at each size."""
    engine = OnnxRuntimeEngine(path, use_gpu=True)
    if engine.device.kind == "gpu":
        engine.fix_batch_sizes(tuple(sizes))
    inp, dims, out, _ = SHAPES[model]
    out_of = {}
    for size in sizes:
        x = {inp: np.random.default_rng(0).random((size, *dims), np.float32)}
        engine.run(x, [out])  # warm
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or runs < 3:
            engine.run(x, [out])
            runs += 1
        out_of[size] = {"img_s": runs * size / elapsed, "ms_per_run": 1e3 * elapsed / runs}
    return {"device": engine.device.name, "sizes": out_of}


def accuracy() -> dict[str, float]:
    """MNIST hold-out accuracy per precision, with the engine the daemon uses."""
    from tools import mnist_digits

    images, labels = mnist_digits.holdout_split()
    path = ROOT / "models" / "mnist_cnn" / "1" / "model.onnx"
    out = {}
    for name, options in (("fp32", EngineOptions(tf32=False)), ("tf32", EngineOptions(tf32=True)),
                          ("fp16", EngineOptions(fp16=True))):
        engine = OnnxRuntimeEngine(path, use_gpu=True, options=options)
        if name == "tf32" and engine.device.kind != "gpu":
            continue  # TF32 is the CUDA provider's
        logits = engine.run({"image": images.astype(np.float32)}, ["logits"])["logits"]
        out[f"{name} on {engine.device.name}"] = float((logits.argmax(1) == labels).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mnist,resnet50")
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64",
                        help="in-process batch sizes (the daemon's buckets by default)")
    parser.add_argument("--buckets", default="auto", help="the models' batch_buckets")
    parser.add_argument("--devices", default="onnxruntime",
                        help="the models' devices (onnxruntime: every GPU; onnxruntime:gpu0 "
                             "compares one GPU with the in-process engine, which runs on gpu0)")
    parser.add_argument("--instances", type=int, default=0,
                        help="engine instances per GPU (instance_group count; 0: the default, 1)")
    parser.add_argument("--shared-memory", choices=("none", "system"), default="none",
                        help="where the requests' images travel: in the messages, or in a "
                             "system shared-memory region over the daemon's unix socket")
    parser.add_argument("--client", choices=("python", "perf_analyzer"), default="python",
                        help="what drives the load points: the Python client processes, or "
                             "Triton's perf_analyzer")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    analyzer = perf_analyzer.find() if args.client == "perf_analyzer" else None
    if args.client == "perf_analyzer" and analyzer is None:
        parser.error("--client perf_analyzer: not on PATH and $PERF_ANALYZER is not set "
                     "(docs/serving.md says how to get it)")
    models = args.models.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-gpu-bench-"))
    repo = repository(tmp / "models", models, args.buckets, args.devices, args.instances)
    port, metrics_port = free_port(), free_port()
    socket = tmp / "daemon.sock"
    socket_url = f"unix:{socket}" if args.shared_memory == "system" else ""
    daemon = DaemonProcess(["--models", str(repo), "--port", str(port), "--socket", str(socket),
                            "--metrics-port", str(metrics_port), "--log-level", "WARNING"],
                           f"127.0.0.1:{port}", tmp / "daemon.log")
    started = time.perf_counter()
    daemon.wait_ready(timeout_s=600)
    results: dict = {"load_and_warmup_s": time.perf_counter() - started, "models": {},
                     "mnist_holdout_accuracy": accuracy()}
    url, metrics_url = f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        for model in models:
            ref = in_process(repo / model / "1" / "model.onnx", model, sizes, args.seconds / 4)
            served = {c: through_daemon(url, metrics_url, model, c, args.seconds, args.clients,
                                        socket_url, analyzer)
                      for c in map(int, args.concurrency.split(","))}
            results["models"][model] = {"in_process": ref, "daemon": served}
    finally:
        daemon.stop()
    print(f"daemon load + warm-up of {models}: {results['load_and_warmup_s']:.1f} s; "
          f"batch_buckets {args.buckets}; images in "
          + ("system shared memory" if socket_url else "the messages")
          + ("; client: perf_analyzer" if analyzer else
             f"; client: {args.clients} Python processes"))
    print("MNIST hold-out accuracy: " + ", ".join(
        f"{k} {v:.3f}" for k, v in results["mnist_holdout_accuracy"].items()))
    for model, r in results["models"].items():
        ref = r["in_process"]["sizes"]
        at = 32 if 32 in ref else max(ref)
        top = ref[at]["img_s"]
        print(f"\n{model} on {r['in_process']['device']}: in-process "
              + ", ".join(f"batch {s}: {v['img_s']:,.0f} img/s ({v['ms_per_run']:.2f} ms)"
                          for s, v in ref.items()))
        print(f"| concurrency | req/s | / in-process at batch {at} | p50 ms | p99 ms "
              "| mean batch | compute ms per batch | / in-process at its bucket | padding share |")
        print("|---|---|---|---|---|---|---|---|---|")
        for c, d in r["daemon"].items():
            rows = d["mean_batch"] * (1 + d["padding_share"])  # rows computed per batch
            bucket = min((size for size in ref if size >= rows - 1e-9), default=max(ref))
            print(f"| {c} | {d['rps']:,.0f} | {d['rps'] / top:.2f} | {d['p50_ms']:.1f} "
                  f"| {d['p99_ms']:.1f} | {d['mean_batch']:.1f} "
                  f"| {d['compute_ms_per_batch']:.2f} "
                  f"| {d['compute_ms_per_batch'] / ref[bucket]['ms_per_run']:.2f} (batch {bucket}) "
                  f"| {d['padding_share']:.2f} |")
    if args.json:
        safe_files.write_file(args.json, json.dumps(results, indent=1), flag=None)


if __name__ == "__main__":
    main()
