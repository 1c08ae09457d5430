"""Batch scoring through the node-local hetserve daemon.

    spark-submit spark_jobs/score.py --input digits.parquet --output scored.parquet

Input: Parquet with columns `id` and `tensor` (raw bytes or an array of numbers per row), or a
folder of image files (`--format image`, read by Spark's `image` source, id = file path).
Output: Parquet with `id`, `label` (top-1 class) and `scores` (softmax of the model's output).
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.client import ModelInterface
from spark_jobs.daemon import ADDRESS_CONF, ADDRESS_ENV, ensure_daemon, resolve_address
from spark_jobs.scoring import ScoreOptions, output_schema, score_frames

log = logging.getLogger("hetserve.score")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="Parquet dataset or image folder")
    parser.add_argument("--output", required=True, help="Parquet output (overwritten)")
    parser.add_argument("--format", choices=["parquet", "image"], default="parquet",
                        help="input format (default: parquet)")
    parser.add_argument("--model", default="mnist_cnn", help="model name (default: mnist_cnn)")
    parser.add_argument("--daemon", help=f"daemon address, e.g. unix:/path or host:8001 "
                        f"(default: Spark conf {ADDRESS_CONF}, then ${ADDRESS_ENV}, "
                        "then this user's unix socket)")
    parser.add_argument("--model-repository", type=Path, default=Path("models"),
                        help="repository for a daemon the job starts when none answers "
                             "(default: ./models)")
    parser.add_argument("--batch-size", type=int, default=128,
                        help="samples per request, capped by the model's max_batch_size "
                             "(default: 128)")
    parser.add_argument("--inflight", type=int, default=2,
                        help="requests in flight per Spark task (default: 2)")
    return parser.parse_args(argv)


def read_input(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    if args.format == "image":
        return spark.read.format("image").option("dropInvalid", True).load(args.input) \
            .selectExpr("image.origin AS id", "image.height", "image.width",
                        "image.nChannels", "image.data")
    return spark.read.parquet(args.input).select("id", "tensor")


def score(spark: SparkSession, args: argparse.Namespace, address: str) -> DataFrame:
    model = ModelInterface.fetch(address, args.model)
    frame = read_input(spark, args)
    scorer = functools.partial(
        score_frames, options=ScoreOptions(address, model, args.batch_size, args.inflight),
        images=args.format == "image")
    return frame.mapInPandas(scorer, output_schema(frame.schema["id"].dataType.simpleString()))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # force: pyspark may have configured the root logger already.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    spark = SparkSession.builder.appName("hetserve-score").getOrCreate()
    try:
        address = resolve_address(args.daemon, spark.conf.get(ADDRESS_CONF, None))
        with ensure_daemon(address, args.model_repository) as address:
            log.info("scoring %s through the daemon at %s", args.input, address)
            start = time.perf_counter()
            score(spark, args, address).write.mode("overwrite").parquet(args.output)
            elapsed = time.perf_counter() - start
            rows = spark.read.parquet(args.output).count()
            log.info("scored %d rows in %.2f s (%.0f rows/s) into %s", rows, elapsed,
                     rows / elapsed, args.output)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
