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
from pathlib import Path
from typing import Any

from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import energy, output
from spark_jobs.api import image_columns, job_session, score_dataframe
from spark_jobs.client import Credentials
from spark_jobs.daemon import ADDRESS_CONF, ADDRESS_ENV
from spark_jobs.resources import task_profile

log = logging.getLogger("hetserve.score")


def add_scoring_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, daemon and request options that batch and streaming jobs share."""
    parser.add_argument("--model", default="mnist_cnn", help="model name (default: mnist_cnn)")
    parser.add_argument("--daemon", help=f"daemon address on every node, e.g. unix:/path or "
                        f"127.0.0.1:8001 (default: Spark conf {ADDRESS_CONF}, then each node's "
                        f"${ADDRESS_ENV}, then the user's unix socket)")
    parser.add_argument("--model-repository", type=Path, default=Path("models"),
                        help="repository for the daemons the job starts where none answers; "
                             "it must exist at this path on every node (default: ./models)")
    parser.add_argument("--no-start-daemon", action="store_true",
                        help="fail where no daemon answers instead of starting one")
    parser.add_argument("--batch-size", type=int,
                        help="samples per request, rounded down to one of the batch sizes the "
                             "daemon runs the model at (default: the largest, max_batch_size "
                             "or the largest dynamic_batching.preferred_batch_size)")
    parser.add_argument("--inflight", type=int, default=2,
                        help="requests in flight per Spark task and Arrow batch; a task "
                             "overlaps two batches (default: 2)")
    parser.add_argument("--priority", type=int,
                        help="request priority, 1 the highest (default: the model's lowest "
                             "level, so that online traffic keeps its latency)")
    parser.add_argument("--top-k", type=int, default=5,
                        help="classes kept per row in top_labels/top_scores (default: 5)")
    parser.add_argument("--output-mode", choices=["labels", "raw"], default="labels",
                        help="labels: label, top_labels and top_scores by softmax (classifiers); "
                             "raw: each output tensor of the model as an array column named "
                             "after it, flat in row-major order (detectors, OCR, segmentation; "
                             "default: labels)")
    parser.add_argument("--energy-column", action="store_true",
                        help="add energy_joules to the output: each row's share of the joules "
                             "its request cost (the job's energy summary is written either way)")
    parser.add_argument("--tls-ca", metavar="PEM",
                        help="reach a daemon's TCP port over TLS, trusting this CA certificate "
                             "(a path on every node); a unix socket needs no TLS")
    parser.add_argument("--token-file", metavar="FILE",
                        help="send the bearer token in this file (a path on every node) to a "
                             "daemon's TCP port, over TLS (the system's CAs without --tls-ca)")


def scoring_options(args: argparse.Namespace) -> dict[str, Any]:
    """score_dataframe's keyword arguments from add_scoring_arguments' options."""
    return {"address": args.daemon, "batch_size": args.batch_size, "inflight": args.inflight,
            "model_repository": None if args.no_start_daemon
            else str(args.model_repository.resolve()),
            "priority": args.priority, "top_k": args.top_k,
            "energy_column": args.energy_column, "output_mode": args.output_mode,
            # absolute: executors run elsewhere than the driver's working directory
            "credentials": Credentials(*(str(Path(f).resolve()) if f else None
                                         for f in (args.tls_ca, args.token_file)))}


def daemon_repository(args: argparse.Namespace) -> str | None:
    """The repository the job starts daemons from, None where it never does (not allowed, or a
    daemon reached with TLS, which a job only uses)."""
    options = scoring_options(args)
    return None if options["credentials"] else options["model_repository"]


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
