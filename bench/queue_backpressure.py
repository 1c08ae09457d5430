"""The Spark client against a daemon whose queue its tasks overfill: as on a GPU
node, where 16 tasks x 2 Arrow batches x 2 requests x 128 samples ask for 8,192 queued samples
against the default --max-queue-size of 4,096. Every refused request waits and comes back
(spark_jobs/client.py); what counts is how much of the device's throughput survives that.

The device is bench/null_engine.py taking a fixed time per batch without the GIL (a fast
accelerator's run), so the device, not the host, bounds throughput. Client processes each call
spark_jobs.client.infer as a Spark task does. Reference in the same run: the same clients against
a daemon whose queue has room for all their requests. Rounds alternate the two daemons.

    .venv/bin/python -m bench.queue_backpressure [--clients 4] [--inflight 4] [--queue 512]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.serving import MODEL, model_repository
from service.clients.top import fetch
from service.local_daemon import local_daemon
from spark_jobs import staging
from spark_jobs.client import infer
from spark_jobs.interface import ModelInterface

ROOT = Path(__file__).resolve().parent.parent

ARROW_BATCH = 1024  # rows per infer() call, as an Arrow batch of a task


def _task(address: str, rows: int, inflight: int) -> None:
    model = ModelInterface.fetch(address, MODEL)
    samples = np.zeros((ARROW_BATCH, *model.input_dims), np.float32)
    for _ in range(rows // ARROW_BATCH):
        infer(address, model, samples, None, inflight)
    staging.regions.close()  # a process of multiprocessing ends without atexit


def _round(address: str, metrics_url: str, args: argparse.Namespace) -> dict:
    refused = _refusals(metrics_url)
    tasks = [multiprocessing.Process(target=_task, args=(address, args.rows, args.inflight))
             for _ in range(args.clients)]
    start = time.perf_counter()
    for task in tasks:
        task.start()
    for task in tasks:
        task.join()
    wall = time.perf_counter() - start
    if any(task.exitcode for task in tasks):
        raise SystemExit("a client process failed: see its traceback above")
    return {"rows_per_s": args.clients * args.rows / wall,
            "refusals": _refusals(metrics_url) - refused}


def _refusals(metrics_url: str) -> float:
    return sum(v for labels, v in fetch(metrics_url).series("hetserve_requests_total").items()
               if dict(labels).get("code") == "RESOURCE_EXHAUSTED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client processes (tasks)")
    parser.add_argument("--inflight", type=int, default=4, help="requests in flight per task")
    parser.add_argument("--queue", type=int, default=512,
                        help="--max-queue-size of the overfilled daemon, in samples")
    parser.add_argument("--rows", type=int, default=32768, help="rows per client and round")
    parser.add_argument("--batch-ms", type=float, default=5.0,
                        help="the null device's time per batch")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ["NULL_ENGINE_BATCH_S"] = str(args.batch_ms / 1000)
    demand = args.clients * args.inflight * 128
    queues = {"overfilled": args.queue, "room for all": max(4096, 2 * demand)}
    results: dict[str, list[dict]] = {name: [] for name in queues}
    with tempfile.TemporaryDirectory() as tmp:
        models = model_repository(Path(tmp) / "models", devices="null:cpu0")
        for round_ in range(args.rounds):
            for name, size in (queues.items() if round_ % 2 == 0 else
                               reversed(list(queues.items()))):
                with local_daemon(models, Path(tmp) / f"{name}{round_}", "--engine-modules",
                                  "bench.null_engine", "--max-queue-size", str(size)) as daemon:
                    results[name].append(_round(daemon.address, daemon.metrics_url, args))
    best = {name: max(r["rows_per_s"] for r in runs) for name, runs in results.items()}
    print(f"{args.clients} clients x {args.inflight} requests of 128 in flight ({demand} samples) "
          f"on a device of {args.batch_ms} ms per batch:")
    for name, runs in results.items():
        print(f"  queue {queues[name]:>5} ({name}): " + ", ".join(
            f"{r['rows_per_s']:,.0f} rows/s ({r['refusals']:.0f} refused)" for r in runs))
    print(f"overfilled / room for all, best of each: "
          f"{best['overfilled'] / best['room for all']:.2f}x")


if __name__ == "__main__":
    main()
