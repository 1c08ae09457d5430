"""Streaming scoring: request files landing in a folder, scored through the node-local daemons,
written to a Parquet sink exactly once.

    spark-submit spark_jobs/stream.py --input requests/ --output scored/ \\
        --checkpoint checkpoints/scored [--format json|parquet] [--available-now]

Requests: JSON lines or Parquet files with `id` and `tensor` (an array of numbers; Parquet may
also hold raw bytes, see --schema). Each micro-batch goes to `OUTPUT/batch_id=N/`, written whole
into a hidden staging folder and moved into place: a batch that Spark replays after a failure or
a restart (foreachBatch is at-least-once) replaces its own folder, so the sink holds every
request exactly once. Read it with spark.read.parquet(OUTPUT). Each batch's folder holds its
energy summary (`_hetserve_energy.json`, which Spark's reader skips), also logged per batch;
--energy-column adds each row's share of the joules, `energy_joules`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import energy
from spark_jobs.api import job_session, score_options, score_with
from spark_jobs.arguments import add_scoring_arguments, daemon_repository, scoring_options
from spark_jobs.options import ScoreOptions

log = logging.getLogger("hetserve.stream")
DEFAULT_SCHEMAS = {"json": "id long, tensor array<float>", "parquet": "id long, tensor binary"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="folder that request files land in")
    parser.add_argument("--output", required=True, help="Parquet sink folder")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint folder")
    parser.add_argument("--format", choices=sorted(DEFAULT_SCHEMAS), default="json",
                        help="request file format (default: json, one request per line)")
    parser.add_argument("--schema", help="request schema as DDL (default: "
                        + "; ".join(f"{k}: {v}" for k, v in DEFAULT_SCHEMAS.items()) + ")")
    parser.add_argument("--max-files-per-trigger", type=int, default=100,
                        help="request files per micro-batch (default: 100)")
    parser.add_argument("--trigger-s", type=float, default=1.0,
                        help="seconds between micro-batches (default: 1)")
    parser.add_argument("--available-now", action="store_true",
                        help="score the files present now, in micro-batches, then stop")
    add_scoring_arguments(parser)
    return parser.parse_args(argv)


def write_batch(batch: DataFrame, batch_id: int, options: ScoreOptions, sink: str) -> None:
    """foreachBatch: idempotent by batch id, so a replayed batch replaces, never adds (its
    energy summary too, which goes inside the batch's folder)."""
    spent = energy.meter(batch.sparkSession)
    scored = score_with(batch, dataclasses.replace(options, energy=spent))
    summary = energy.write_parquet(batch.sparkSession, scored,
                                   f"{sink.rstrip('/')}/batch_id={batch_id}", spent)
    assert summary is not None  # written with a meter
    for line in energy.describe(summary):
        log.info("micro-batch %d %s", batch_id, line)


def start(spark: SparkSession, args: argparse.Namespace) -> StreamingQuery:
    requests = (spark.readStream.format(args.format)
                .schema(args.schema or DEFAULT_SCHEMAS[args.format])
                .option("maxFilesPerTrigger", args.max_files_per_trigger)
                .load(args.input))
    options = score_options(spark, args.model, **scoring_options(args))
    writer = requests.writeStream.foreachBatch(
        functools.partial(write_batch, options=options, sink=args.output)) \
        .option("checkpointLocation", args.checkpoint).queryName("hetserve-stream")
    trigger = {"availableNow": True} if args.available_now \
        else {"processingTime": f"{args.trigger_s} seconds"}
    return writer.trigger(**trigger).start()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with job_session("hetserve-stream", args.daemon, daemon_repository(args)) as spark:
        query = start(spark, args)
        log.info("scoring requests from %s into %s", args.input, args.output)
        query.awaitTermination()


if __name__ == "__main__":
    main()
