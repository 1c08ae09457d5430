"""`make demo`: the daemon on this machine, the 1,000 held-out digits scored by the Spark job
through it and what that cost (the job's energy summary), the daemon's own metrics, then one
online request with tritonclient and one over REST in plain JSON (the top classes, by label)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from service.local_daemon import DaemonProcess, DaemonStartError, free_port, is_ready
from service.settings import Settings
from spark_jobs import energy
from spark_jobs.cost import Cost
from spark_jobs.results import softmax
from tools import mnist_digits

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-output"
MODEL = "mnist_cnn"


def main() -> None:
    settings = Settings.from_env()
    address = f"unix:{settings.unix_socket}"
    daemon, http_port = None, settings.http_port
    if is_ready(address):
        print(f"using the daemon already serving at {address}")
    else:
        OUT.mkdir(exist_ok=True)
        (OUT / "daemon.log").unlink(missing_ok=True)  # this run's log alone
        http_port = http_port or free_port()
        grpc_port = _port(settings.grpc_host, settings.grpc_port, "gRPC", "HETSERVE_GRPC_PORT")
        metrics_port = _port(settings.metrics_host, settings.metrics_port, "metrics",
                             "HETSERVE_METRICS_PORT")
        settings = dataclasses.replace(settings, grpc_port=grpc_port, metrics_port=metrics_port)
        daemon = DaemonProcess(["--models", str(ROOT / "models"), "--http-port", str(http_port),
                                "--port", str(grpc_port), "--metrics-port", str(metrics_port)],
                               address, OUT / "daemon.log")
        try:
            daemon.wait_ready()
        except DaemonStartError as e:
            sys.exit(f"the daemon did not start: {str(e).splitlines()[0]} (its log: "
                     f"{daemon.log_path})")
        print(f"started the daemon: gRPC {settings.grpc_host}:{settings.grpc_port} and "
              f"{address}, REST :{http_port}, metrics :{settings.metrics_port} "
              f"(log: {daemon.log_path})")
    try:
        score_with_spark(address)
        summarize_metrics(f"http://{settings.metrics_host}:{settings.metrics_port}/metrics")
        online_request(address)
        if http_port:
            rest_request(f"http://{settings.grpc_host}:{http_port}")
    finally:
        if daemon is not None:
            daemon.stop()


def _port(host: str, port: int, what: str, variable: str) -> int:
    """`port` where it is free, else a free one (another daemon on the default, say)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
            return port
        except OSError:
            chosen = free_port()
            print(f"the {what} port {port} is taken: using {chosen} ({variable} sets it)")
            return chosen


def score_with_spark(address: str) -> None:
    images, labels = mnist_digits.holdout_split()
    OUT.mkdir(exist_ok=True)
    source, scored = OUT / "digits.parquet", OUT / "scored.parquet"
    mnist_digits.write_parquet(source, images, labels)
    print(f"\n== Spark: spark-submit spark_jobs/score.py on {len(labels)} held-out digits "
          "(a JVM starts first: about a minute)", flush=True)
    job = subprocess.Popen(
        [Path(sys.executable).parent / "spark-submit", "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", str(ROOT / "spark_jobs" / "score.py"),
         "--input", str(source), "--output", str(scored), "--daemon", address],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    assert job.stdout is not None
    log, scoring = [], True
    for line in job.stdout:  # the job's own lines as they come, up to its "scored" line
        log.append(line)
        own = re.match(r"\d{4}-\d\d-\d\d [\d:,]+ INFO (.*)", line)
        if own and scoring:
            print(f"   job: {own.group(1)}", flush=True)
            scoring = not own.group(1).startswith("scored ")
    (OUT / "spark-job.log").write_text("".join(log))
    if job.wait() != 0:
        sys.exit(f"the Spark job failed; its log: {OUT / 'spark-job.log'}")
    result = pd.read_parquet(scored).merge(pd.read_parquet(source, columns=["id", "label"]),
                                           on="id", suffixes=("", "_true"))
    print(f"   rows out: {len(result)}, distinct ids: {result['id'].nunique()}, "
          f"accuracy: {(result['label'] == result['label_true']).mean():.1%}")
    summary = json.loads((scored / energy.ENERGY_FILE).read_text())
    print(f"   what it cost ({scored.name}/{energy.ENERGY_FILE}):")
    for line in energy.describe(summary):
        print(f"   {line}")


def summarize_metrics(url: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(
        urllib.request.urlopen(url, timeout=10).read().decode())}

    def total(family: str, suffix: str) -> float:
        return sum(s.value for s in families[family].samples if s.name == family + suffix)

    batches = total("hetserve_batch_size", "_count")
    print(f"\n== Daemon metrics ({url})")
    print(f"   batches run: {batches:.0f}, mean batch size: "
          f"{total('hetserve_batch_size', '_sum') / max(batches, 1):.1f}")
    emulated = False
    for s in families["hetserve_inferences"].samples:
        if s.name.endswith("_total"):
            print(f"   inferences on {s.labels['device']} ({s.labels['kind']}, "
                  f"{s.labels['engine']}): {s.value:.0f}")
            emulated |= s.labels["kind"] == "fpga-emulator" and s.value > 0
    if emulated:
        print("   fpga-emulator: Intel's FPGA Emulation Platform ran the FPGA kernels (as a "
              "board's binary is built) on this CPU; its speed and power are not an FPGA's")


def online_request(address: str) -> None:
    images, labels = mnist_digits.holdout_split()
    with grpcclient.InferenceServerClient(address) as client:
        tensor = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
        tensor.set_data_from_numpy(images[:1])
        start = time.perf_counter()
        result = client.infer(MODEL, [tensor])
        elapsed_ms = (time.perf_counter() - start) * 1e3
    p = softmax(result.as_numpy("logits"))[0]
    cost = Cost.of(result.get_response(), 1)
    print("\n== Online: one digit through tritonclient.grpc")
    print(f"   true label {labels[0]}, predicted {p.argmax()} (p={p.max():.3f}), "
          f"{elapsed_ms:.1f} ms round trip")
    if cost.joules is not None:
        print(f"   the reply's parameters: ran on {cost.device}, {1e3 * cost.joules:.3f} mJ "
              f"(power source {cost.source}"
              f"{', an estimate' if cost.source == energy.ESTIMATE else ''}), "
              f"{cost.flops:,} FLOPs")



def rest_request(url: str) -> None:
    """The KServe V2 REST protocol as curl would speak it: JSON in, the top classes out."""
    images, labels = mnist_digits.holdout_split()
    body = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                   "data": images[1].ravel().tolist()}],
                       "outputs": [{"name": "logits", "parameters": {"classification": 3}}]})
    request = urllib.request.Request(f"{url}/v2/models/{MODEL}/infer", body.encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        top = json.loads(reply.read())["outputs"][0]["data"]
    print(f"\n== Online over REST: POST {url}/v2/models/{MODEL}/infer (JSON, classification 3)")
    print(f"   true label {labels[1]}; top classes (value:index:label): {', '.join(top)}")


if __name__ == "__main__":
    main()
