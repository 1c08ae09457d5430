"""The cluster test's job (spark-submit): score.py's scoring and output, then a probe stage under
the same ResourceProfile that reports, per task, the accelerators it holds and the daemon it
reaches on its node.

    spark-submit tests/spark_jobs/cluster_job.py PROBE_JSON SCORE_PY_ARGS...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from service.local_daemon import is_ready
from spark_jobs.api import job_session
from spark_jobs.daemon import resolve_address
from spark_jobs.resources import task_profile, task_resources
from spark_jobs.score import parse_args, score, write


def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = sum(b.num_rows for b in batches)
    address = resolve_address()
    yield pa.RecordBatch.from_pydict({
        "rows": [rows], "resources": [json.dumps(task_resources())], "daemon": [address],
        "ready": [is_ready(address)]})


def main(probe_output: str, argv: list[str]) -> None:
    args = parse_args(argv)
    with job_session("hetserve-cluster-test", args.daemon) as spark:
        write(spark, score(spark, args), args)
        profile = task_profile(args.task_resource, new_executors=False)
        found = spark.read.parquet(args.input).mapInArrow(
            probe, "rows long, resources string, daemon string, ready boolean",
            profile=profile).collect()
        Path(probe_output).write_text(json.dumps([row.asDict() for row in found]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
