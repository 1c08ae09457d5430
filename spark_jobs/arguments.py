"""The command-line options that both entry points (score.py, batch, and stream.py,
streaming) take: the model, the daemon and how to reach it, and the requests' size, priority and
output form; and what they mean for spark_jobs.api."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spark_jobs.credentials import Credentials
from spark_jobs.daemon import ADDRESS_CONF, ADDRESS_ENV


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
