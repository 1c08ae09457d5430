"""Node-local daemons that jobs start: one per host under a lock, stopped only by the job that
started them (or when its Spark process ends), and restarted after a crash mid-job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd

from service.local_daemon import is_ready, log_tail
from spark_jobs.api import stop_started_daemons
from spark_jobs.daemon import NodeDaemon, read_starter
from spark_jobs.score import parse_args, score, write
from tests.support.daemon import MODELS
from tests.support.processes import serving
from tests.support.waiting import until

ENSURE = """
import sys
from spark_jobs.daemon import NodeDaemon
print(NodeDaemon(sys.argv[1], sys.argv[2], "app-lock").ensure(), flush=True)
sys.stdin.read()  # stays until the test lets go: it is the daemon's starter
"""


def test_executors_on_one_host_start_one_daemon_that_ends_with_its_starter(tmp_path):
    socket = tmp_path / "run" / "grpc.sock"
    address = f"unix:{socket}"
    starters = [subprocess.Popen([sys.executable, "-c", ENSURE, address, str(MODELS)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(3)]
    try:
        assert [p.stdout.readline().strip() for p in starters] == [address] * 3
        assert len(serving(socket)) == 1
        record = read_starter(socket.parent / "daemon.starter")
        assert record is not None and record["starter"] == "app-lock"
    finally:
        for p in starters:
            p.communicate("")
    # Every starter has gone: the supervisor notices its Spark process ended and stops it, and
    # with it gone the record names no running daemon.
    until(lambda: not serving(socket), timeout_s=30.0)
    until(lambda: read_starter(socket.parent / "daemon.starter") is None, timeout_s=30.0)


def test_a_supervisor_killed_with_sigkill_takes_its_daemon_with_it(tmp_path):
    socket = tmp_path / "run" / "grpc.sock"
    address = f"unix:{socket}"
    starter = subprocess.Popen([sys.executable, "-c", ENSURE, address, str(MODELS)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout.readline().strip() == address
        record = read_starter(socket.parent / "daemon.starter")
        os.kill(record["supervisor"], signal.SIGKILL)  # no chance to stop the daemon itself
        until(lambda: not serving(socket), timeout_s=30.0,
              what="the daemon outlived its supervisor")
    finally:
        starter.communicate("")


def test_a_job_stops_only_the_daemon_it_started(daemon, tmp_path):
    address = f"unix:{tmp_path / 'run' / 'grpc.sock'}"
    mine = NodeDaemon(address, str(MODELS), "app-a")
    other = NodeDaemon(address, str(MODELS), "app-b")
    assert mine.ensure() == address
    try:
        assert other.ensure() == address and not other.stop_started()
        assert is_ready(address)
        # A daemon the job did not start (a system one) is never stopped.
        assert not NodeDaemon(daemon.socket_url, str(MODELS), "app-a").stop_started()
        assert is_ready(daemon.socket_url)
    finally:
        assert mine.stop_started()
    assert not is_ready(address)


def test_daemon_killed_mid_job_is_restarted_and_every_row_scored_once(spark, holdout, tmp_path):
    images = np.tile(holdout[0], (12, 1, 1, 1))
    rows = len(images)
    source = tmp_path / "digits.parquet"
    pd.DataFrame({"id": np.arange(rows, dtype=np.int64),
                  "tensor": [x.tobytes() for x in images]}).to_parquet(source, row_group_size=2000)
    socket = tmp_path / "run" / "grpc.sock"
    args = parse_args(["--input", str(source), "--output", str(tmp_path / "scored.parquet"),
                       "--daemon", f"unix:{socket}", "--model-repository", str(MODELS),
                       "--batch-size", "16", "--inflight", "1", "--top-k", "1"])
    failure: list[BaseException] = []

    def job() -> None:
        try:
            write(spark, score(spark, args), args)
        except BaseException as e:  # reported by the assertion below
            failure.append(e)

    spark.conf.set("spark.sql.files.maxPartitionBytes", str(4 << 20))
    runner = threading.Thread(target=job)
    runner.start()
    starter_file = socket.parent / "daemon.starter"
    try:
        until(lambda: read_starter(starter_file) is not None and is_ready(f"unix:{socket}"),
              timeout_s=120)
        until(lambda: bool(spark.sparkContext.statusTracker().getActiveStageIds()), timeout_s=120)
        time.sleep(1)  # the scoring stage is under way
        assert runner.is_alive(), "the job ended before the daemon could be killed"
        killed = read_starter(starter_file)["daemon"]
        os.kill(killed, signal.SIGKILL)
        runner.join(200)
        assert not runner.is_alive(), ("the job still runs 200 s after the daemon was killed; "
                                       "the daemons' log ends:\n"
                                       + log_tail(socket.parent / "daemon.log"))
        assert not failure, failure
        scored = pd.read_parquet(args.output)
        assert len(scored) == rows and sorted(scored["id"]) == list(range(rows))
        restarted = read_starter(starter_file)
        assert restarted is not None and restarted["daemon"] != killed
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.sparkContext.cancelAllJobs()  # a no-op unless an assertion above failed
        runner.join(60)
        assert stop_started_daemons(spark, args.daemon) == 1
    assert not serving(socket)
