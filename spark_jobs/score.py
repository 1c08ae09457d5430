"""Batch scoring through the node-local hetserve daemon.

    spark-submit spark_jobs/score.py --input digits.parquet --output scored.parquet

Input: Parquet with columns `id` and `tensor` (raw bytes or an array of numbers per row), or a
folder of image files (`--format image`, read by Spark's `image` source, id = file path; resized
and normalized as the model's config.pbtxt says, see docs/spark.md).
Output: Parquet with `id`, `label` (top-1 class), `top_labels` and `top_scores` (the k best
classes and their softmax scores), `device` (where the daemon ran the row) and
`model_version` (`energy_joules` too, each row's share of its request's joules, with
--energy-column). The output appears whole when the job succeeds, or not at all, with the job's
energy summary inside (`_hetserve_energy.json`: rows, joules, joules per row and GFLOP/s per
watt by device and power source), which the job also prints.
Each executor uses its own node's daemon; where none answers, the job starts one per host and
stops the ones it started at the end.
"""

from __future__ import annotations

import argparse
import logging
import time

from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import energy, output
from spark_jobs.api import image_columns, job_session, score_dataframe
from spark_jobs.arguments import add_scoring_arguments, daemon_repository, scoring_options
from spark_jobs.resources import task_profile

log = logging.getLogger("hetserve.score")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="Parquet dataset or image folder")
    parser.add_argument("--output", required=True, help="Parquet output (replaced)")
    parser.add_argument("--format", choices=["parquet", "image"], default="parquet",
                        help="input format (default: parquet)")
    add_scoring_arguments(parser)
    parser.add_argument("--errors", help="write malformed rows (id, error) to this Parquet "
                        "output and go on; without it a malformed row fails the job")
    parser.add_argument("--task-resource", metavar="NAME=AMOUNT",
                        help="run scoring tasks on executors holding this accelerator, e.g. "
                             "fpga=1 (stage-level scheduling; needs a cluster manager with "
                             "custom resources, see docs/spark.md)")
    return parser.parse_args(argv)


def score(spark: SparkSession, args: argparse.Namespace,
          energy_meter: Accumulator | None = None) -> DataFrame:
    """The input scored, adding what the rows cost to `energy_meter` (energy.meter)."""
    if args.format == "image":
        frame = image_columns(
            spark.read.format("image").option("dropInvalid", True).load(args.input))
    else:
        frame = spark.read.parquet(args.input).select("id", "tensor")
    dynamic = spark.conf.get("spark.dynamicAllocation.enabled", "false") == "true"
    return score_dataframe(
        spark, frame, args.model,
        profile=task_profile(args.task_resource, dynamic) if args.task_resource else None,
        keep_errors=args.errors is not None, images=args.format == "image",
        energy=energy_meter, **scoring_options(args))


def write(spark: SparkSession, scored: DataFrame, args: argparse.Namespace,
          energy_meter: Accumulator | None = None) -> dict | None:
    """Each output is written whole or not at all; the scored rows first, with the summary of
    `energy_meter` inside (energy.ENERGY_FILE), then the errors. Returns the summary."""
    if args.errors is None:
        return energy.write_parquet(spark, scored, args.output, energy_meter)
    staging = output.staging_path(args.output)
    try:
        scored.write.parquet(staging)  # scores every row once
        both = spark.read.parquet(staging)
        failed = F.col("error").isNotNull()
        summary = energy.write_parquet(spark, both.filter(~failed).drop("error"), args.output,
                                       energy_meter)
        output.write_parquet(spark, both.filter(failed).select("id", "error"), args.errors)
        count = spark.read.parquet(args.errors).count()
        log.info("%d row%s could not be scored: in %s, with the reason of each", count,
                 "" if count == 1 else "s", args.errors)
        return summary
    finally:
        output.delete(spark, staging)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with job_session("hetserve-score", args.daemon, daemon_repository(args)) as spark:
        start = time.perf_counter()
        spent = energy.meter(spark)
        scored = score(spark, args, spent)
        log.info("scoring %s through the node-local daemons", args.input)
        summary = write(spark, scored, args, spent)
        assert summary is not None  # written with a meter
        elapsed = time.perf_counter() - start
        rows = spark.read.parquet(args.output).count()
        log.info("scored %d rows in %.2f s (%.0f rows/s) into %s", rows, elapsed,
                 rows / elapsed, args.output)
        for line in energy.describe(summary):
            log.info("%s", line)


if __name__ == "__main__":
    main()
