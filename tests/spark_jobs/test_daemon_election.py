"""One daemon per node, always: executors that find the node's daemon just killed elect exactly
one of them to restart it; a daemon that runs but cannot answer for a while (frozen here, as
under memory pressure or on an overloaded node) is waited for, never replaced; and every row
they send is scored exactly once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

from spark_jobs.client import infer
from spark_jobs.daemon import NodeDaemon, read_starter
from spark_jobs.interface import ModelInterface
from tests.support.daemon import MODEL, MODELS
from tests.support.processes import serving, supervising
from tests.support.waiting import until

CALLERS = 4
ROUNDS = 20
ROWS = 24  # per caller and round
FROZEN = {5: 7.0, 15: 7.0}  # round: seconds the daemon is stopped, longer than every probe
STARTER = "app-election"


def _score(address: str, ids: list[int], images: np.ndarray) -> tuple[list[int], list[int]]:
    """One executor task: find (or restart) the node's daemon, score its rows, retrying and
    recovering as score.py does. Runs in a process of its own."""
    daemon = NodeDaemon(address, str(MODELS), STARTER)
    model = ModelInterface.fetch(daemon.ensure(), MODEL)
    result = infer(address, model, images, batch_size=8, inflight=2, recover=daemon.ensure)
    return ids, result.logits.reshape(len(ids), -1).argmax(axis=1).tolist()


def test_callers_that_find_the_daemon_killed_restart_exactly_one(tmp_path: Path, holdout):
    socket = tmp_path / "run" / "grpc.sock"
    address = f"unix:{socket}"
    starter_file = socket.parent / "daemon.starter"
    images, labels = holdout
    scored: dict[int, int] = {}
    # spawn: gRPC must not be forked; the pool's processes stand for an executor's workers.
    with multiprocessing.get_context("spawn").Pool(CALLERS) as pool:
        try:
            assert NodeDaemon(address, str(MODELS), STARTER).ensure() == address
            started = time.monotonic()
            for round_ in range(ROUNDS):
                target = read_starter(starter_file)["daemon"]
                if round_ in FROZEN:
                    os.kill(target, signal.SIGSTOP)
                    threading.Timer(FROZEN[round_], os.kill, (target, signal.SIGCONT)).start()
                else:
                    os.kill(target, signal.SIGKILL)
                work = []
                for c in range(CALLERS):
                    ids = list(range((round_ * CALLERS + c) * ROWS,
                                     (round_ * CALLERS + c + 1) * ROWS))
                    work.append((address, ids, images[np.asarray(ids) % len(images)]))
                for ids, predicted in pool.starmap(_score, work, chunksize=1):
                    for i, label in zip(ids, predicted):
                        assert i not in scored, f"row {i} scored twice"
                        scored[i] = label
                daemons = serving(socket)
                record = read_starter(starter_file)
                assert len(daemons) == 1, f"round {round_}: daemons {daemons} serve {socket}"
                assert record is not None and str(record["daemon"]) == daemons[0]
                assert (record["daemon"] == target) == (round_ in FROZEN)
            print(f"{ROUNDS} rounds in {time.monotonic() - started:.1f} s")
        finally:
            NodeDaemon(address, str(MODELS), STARTER).stop_started()
    assert sorted(scored) == list(range(ROUNDS * CALLERS * ROWS))
    truth = labels[np.asarray(sorted(scored)) % len(labels)]
    accuracy = float(np.mean(np.asarray([scored[i] for i in sorted(scored)]) == truth))
    assert accuracy > 0.9, f"accuracy {accuracy:.3f} on the held-out digits"
    until(lambda: not serving(socket) and not supervising(socket), timeout_s=30.0,
          what=f"left behind: daemons {serving(socket)}, supervisors {supervising(socket)}")
