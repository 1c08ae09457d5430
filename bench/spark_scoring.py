"""Rows/s of score.py's scoring through the node-local daemon against in-process ONNX Runtime in
a predict_batch_udf, on the same Parquet data and the same Spark local[2], in one run.

    .venv/bin/python bench/spark_scoring.py [--rows 100000] [--repeats 2]

Both write their output as Parquet; the daemon shares the two cores with Spark. Each side runs
once on a small slice first (JVM, Python workers, ORT sessions warm), then `--repeats` times
alternately; the best run of each counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "bench")]
os.environ["PYTHONPATH"] = os.pathsep.join(  # Spark's Python workers import ort_reference
    [str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark.ml.functions import predict_batch_udf  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import mnist_digits  # noqa: E402
import ort_reference  # noqa: E402
from spark_jobs.api import PREDICT_RETURN_TYPE, score_dataframe  # noqa: E402
from spark_jobs.daemon import DaemonProcess  # noqa: E402

MODEL = ROOT / "models" / "mnist_cnn" / "1" / "model.onnx"
BATCH = 128  # the model's max_batch_size: each side infers in batches of this size


def write_dataset(path: Path, rows: int) -> None:
    images, _ = mnist_digits.holdout_split()
    flat = images.reshape(len(images), -1)
    for n, part in enumerate(np.array_split(np.arange(rows), 8)):
        pd.DataFrame({"id": part, "tensor": list(flat[part % len(flat)])}).to_parquet(
            path / f"part-{n}.parquet")


def timed(run, out: Path) -> float:
    start = time.perf_counter()
    run().write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--daemon-threads", type=int, default=0,
                        help="the daemon's ONNX Runtime intra-op threads per engine instance "
                             "(default: 0, the daemon's own choice: its instances split the "
                             "cores)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hetserve-bench-"))
    data, small = tmp / "data", tmp / "small"
    data.mkdir(), small.mkdir()
    write_dataset(data, args.rows)
    write_dataset(small, 2000)
    daemon = DaemonProcess(["--models", str(ROOT / "models"), "--socket", str(tmp / "d.sock"),
                            "--port", "0", "--metrics-port", "0", "--intra-op-threads",
                            str(args.daemon_threads)],
                           f"unix:{tmp / 'd.sock'}", tmp / "daemon.log")
    spark = (SparkSession.builder.master("local[2]").appName("hetserve-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.files.maxPartitionBytes", str(32 << 20)).getOrCreate())
    try:
        daemon.wait_ready()
        udf = predict_batch_udf(ort_reference.make_predict_fn(str(MODEL), "image", (1, 28, 28)),
                                return_type=PREDICT_RETURN_TYPE, batch_size=BATCH,
                                input_tensor_shapes=[[784]])

        def sides(folder: Path) -> dict:
            frame = spark.read.parquet(str(folder))
            return {
                "daemon": lambda: score_dataframe(spark, frame, "mnist_cnn",
                                                  address=daemon.address, batch_size=BATCH),
                "onnxruntime": lambda: frame.select("id", udf("tensor").alias("p"))
                .select("id", "p.label", "p.scores")}

        for name, run in sides(small).items():  # warm-up
            timed(run, tmp / f"warm-{name}")
        best: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, run in sides(data).items():
                seconds = timed(run, tmp / f"out-{name}")
                print(f"{name}: {args.rows / seconds:,.0f} rows/s ({seconds:.1f} s)", flush=True)
                best[name] = min(best.get(name, seconds), seconds)
        rates = {k: args.rows / v for k, v in best.items()}
        print(f"best: daemon {rates['daemon']:,.0f} rows/s, in-process onnxruntime "
              f"predict_batch_udf {rates['onnxruntime']:,.0f} rows/s, ratio "
              f"{rates['daemon'] / rates['onnxruntime']:.2f}x")
    finally:
        spark.stop()
        daemon.stop()


if __name__ == "__main__":
    main()
