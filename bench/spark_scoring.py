"""Rows/s of Spark scoring through the node-local daemon against in-process ONNX Runtime inside
Spark's Python workers, on the same Parquet data (raw float32 tensors) and the same Spark master,
in one run.

    .venv/bin/python -m bench.spark_scoring [--rows 100000] [--repeats 2] [--master local[2]]

Cold: each method as its own spark-submit, timed from start to exit (JVM, Python workers, ORT
sessions or the daemon start all included): score.py starting its own daemon, score.py using
the daemon already running, and in-process ONNX Runtime in mapInArrow. Warm: in one Spark
session, each method once on a small slice first, then `--repeats` rounds of all, every other
round in reverse order; the best run of each counts. Warm methods: the daemon through
mapInArrow (score.py's default) and mapInPandas, and in-process ONNX Runtime in mapInArrow (the
reference: the same Arrow decoding and output code, the model run in the worker) and in
predict_batch_udf, each in batches of the served model's max_batch_size (the daemon path's
request size). Every method writes the same Parquet output except predict_batch_udf (label and
all scores). On a GPU node give `--provider CUDAExecutionProvider` and `--master local[16]`:
the reference then runs a CUDA session in every Python worker, the daemon whatever its config
chooses.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.ml.functions import predict_batch_udf
from pyspark.sql import DataFrame, SparkSession

from bench import ort_reference
from service.local_daemon import DaemonProcess
from spark_jobs import staging
from spark_jobs.api import PREDICT_RETURN_TYPE, score_dataframe
from spark_jobs.interface import ModelInterface
from spark_jobs.results import output_schema
from tools import mnist_digits

ROOT = Path(__file__).resolve().parent.parent

MODEL = ROOT / "models" / "mnist_cnn" / "1" / "model.onnx"
TOP_K = 5  # score.py's default
SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.files.maxPartitionBytes": str(32 << 20)}


def write_dataset(path: Path, rows: int) -> None:
    """8 files of id, tensor (raw float32) and x (the same as array<float>, which
    predict_batch_udf needs; a columnar read of the others never touches it)."""
    images, _ = mnist_digits.holdout_split()
    for n, part in enumerate(np.array_split(np.arange(rows), 8)):
        samples = images[part % len(images)].reshape(len(part), -1)
        pd.DataFrame({"id": part, "tensor": [x.tobytes() for x in samples],
                      "x": list(samples)}).to_parquet(path / f"part-{n}.parquet")


def reference_arrow(frame: DataFrame, model: ModelInterface, provider: str) -> DataFrame:
    return frame.mapInArrow(functools.partial(
        ort_reference.score_arrow, path=str(MODEL), model=model,
        batch_size=model.max_batch_size, top_k=TOP_K,
        provider=provider), output_schema("bigint"))


def reference_job(args: argparse.Namespace) -> None:
    """The cold in-process reference, run by spark-submit: mapInArrow to Parquet."""
    spark = SparkSession.builder.appName("hetserve-bench-reference").getOrCreate()
    try:
        model = ModelInterface("mnist_cnn", "image", "FP32", (1, 28, 28), "logits",
                               args.batch)
        frame = spark.read.parquet(args.input).select("id", "tensor")
        reference_arrow(frame, model, args.provider).write.parquet(args.output)
    finally:
        spark.stop()


def cold_runs(args: argparse.Namespace, data: Path, tmp: Path, daemon: str) -> dict[str, float]:
    """Seconds from spark-submit to its exit, per method."""
    conf = [a for k, v in SPARK_CONF.items() for a in ("--conf", f"{k}={v}")]
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", args.master, *conf]
    score = [str(ROOT / "spark_jobs" / "score.py"), "--input", str(data)]
    jobs = {
        "daemon, started by the job": [*score, "--daemon", f"unix:{tmp / 'cold' / 'grpc.sock'}",
                                       "--model-repository", str(args.models)],
        "daemon, already running": [*score, "--daemon", daemon, "--no-start-daemon"],
        "in-process mapInArrow": [__file__, "--reference-job", "--input", str(data),
                                  "--batch", str(ModelInterface.fetch(daemon, "mnist_cnn")
                                                 .max_batch_size),
                                  "--provider", args.provider]}
    seconds = {}
    for n, (name, job) in enumerate(jobs.items()):
        start = time.perf_counter()
        run = subprocess.run([*submit, *job, "--output", str(tmp / f"cold-{n}")],
                             capture_output=True, text=True, cwd=ROOT)
        seconds[name] = time.perf_counter() - start
        if run.returncode != 0:
            sys.exit(f"{name}: spark-submit failed\n{run.stderr[-3000:]}")
        print(f"cold {name}: {args.rows / seconds[name]:,.0f} rows/s "
              f"({seconds[name]:.1f} s)", flush=True)
    return seconds


def warm_runs(args: argparse.Namespace, data: Path, small: Path, tmp: Path,
              daemon: str) -> dict[str, float]:
    """The best of `repeats` runs per method in one Spark session, in seconds."""
    builder = SparkSession.builder.master(args.master).appName("hetserve-bench")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        model = ModelInterface.fetch(daemon, "mnist_cnn")
        udf = predict_batch_udf(ort_reference.make_predict_fn(str(MODEL), "image", (1, 28, 28)),
                                return_type=PREDICT_RETURN_TYPE,
                                batch_size=model.max_batch_size,
                                input_tensor_shapes=[[784]])

        def methods(folder: Path) -> dict:
            frame = spark.read.parquet(str(folder))
            tensors = frame.select("id", "tensor")
            return {
                "daemon mapInArrow": lambda: score_dataframe(
                    spark, tensors, "mnist_cnn", address=daemon, top_k=TOP_K),
                "daemon mapInPandas": lambda: score_dataframe(
                    spark, tensors, "mnist_cnn", address=daemon, top_k=TOP_K, pandas=True),
                "in-process mapInArrow": lambda: reference_arrow(tensors, model, args.provider),
                "in-process predict_batch_udf": lambda: frame.select(
                    "id", udf("x").alias("p")).select("id", "p.label", "p.scores")}

        def timed(run, out: Path) -> float:
            start = time.perf_counter()
            run().write.mode("overwrite").parquet(str(out))
            return time.perf_counter() - start

        for run in methods(small).values():  # warm-up
            timed(run, tmp / "warm-up")
        best: dict[str, float] = {}
        for repeat in range(args.repeats):
            # Every other round in reverse order: the first method after the warm-up still
            # pays the JVM's JIT compilation (measured: 2 CPU-s more for 40,000 rows).
            order = list(enumerate(methods(data).items()))
            for n, (name, run) in order[::-1] if repeat % 2 else order:
                seconds = timed(run, tmp / f"warm-{n}")
                print(f"warm {name}: {args.rows / seconds:,.0f} rows/s ({seconds:.1f} s)",
                      flush=True)
                best[name] = min(best.get(name, seconds), seconds)
        return best
    finally:
        spark.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2, help="warm runs per method")
    parser.add_argument("--master", default="local[2]", help="Spark master (default: local[2])")
    parser.add_argument("--provider", default="CPUExecutionProvider",
                        help="ONNX Runtime provider of the in-process references")
    parser.add_argument("--no-cold", action="store_true", help="skip the spark-submit runs")
    parser.add_argument("--models", type=Path, default=ROOT / "models",
                        help="the daemon's model repository, e.g. one whose mnist_cnn config "
                             "asks for KIND_GPU on a GPU node (default: ./models)")
    parser.add_argument("--daemon-threads", type=int, default=0,
                        help="the daemon's ONNX Runtime intra-op threads per engine instance "
                             "(default: 0, the daemon's own choice: its instances split the "
                             "cores)")
    parser.add_argument("--reference-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # the reference job's
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def report(rows: int, cold: dict[str, float], warm: dict[str, float]) -> None:
    """Rates and ratios to the in-process mapInArrow reference of the same run."""
    for label, seconds in (("cold", cold), ("warm", warm)):
        reference = seconds.get("in-process mapInArrow")
        for name, s in seconds.items():
            ratio = f", {reference / s:.2f}x in-process mapInArrow" if reference else ""
            print(f"{label} best: {name} {rows / s:,.0f} rows/s{ratio}")


def main(argv: list[str] | None = None) -> None:
    # Spark's Python workers unpickle bench.ort_reference's functions, and spark-submit runs the
    # cold reference job from this file's path: both import the package from the repository root.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    args = parse_args(argv)
    if args.reference_job:
        reference_job(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-bench-"))
    data, small = tmp / "data", tmp / "small"
    data.mkdir(), small.mkdir()
    write_dataset(data, args.rows)
    write_dataset(small, 2000)
    daemon = DaemonProcess(["--models", str(args.models), "--socket", str(tmp / "d.sock"),
                            "--port", "0", "--metrics-port", "0", "--intra-op-threads",
                            str(args.daemon_threads)],
                           f"unix:{tmp / 'd.sock'}", tmp / "daemon.log")
    try:
        daemon.wait_ready()
        cold = {} if args.no_cold else cold_runs(args, data, tmp, daemon.address)
        warm = warm_runs(args, data, small, tmp, daemon.address)
        report(args.rows, cold, warm)
    finally:
        daemon.stop()
        shutil.rmtree(tmp)  # the data and outputs: hundreds of MB
        staging.unlink_orphans()  # the regions the stopped Python workers kept


if __name__ == "__main__":
    main()
