"""Shared fixtures: a real daemon on ports and a socket picked here, a real client, and `serve`,
daemons of variants of the example model on the faulty test engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# Before grpc is first imported: the tests fork only to exec (daemons, Spark's JVM, other
# users), and grpc's fork handlers can crash such a child before its exec (grpc/grpc#43055:
# Spark's JVM then never starts).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.daemon import Daemon
from tests.support.faulty_engine import CONTROL_ENV
from tests.support.served import ENGINE_MODULE, Control, write_model
from tools import mnist_digits


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("daemon"))
    yield d
    assert d.stop() == 0


@pytest.fixture
def client(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(daemon.url)
    yield c
    c.close()


@pytest.fixture(scope="session")
def holdout() -> tuple[np.ndarray, np.ndarray]:
    return mnist_digits.holdout_split()


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """serve(max_batch_size, dynamic_batching, *daemon_args, instances=1, **parameters)
    -> (Daemon, Control);
    stopped at the end of the test (exit status 0 checked)."""
    control = Control(tmp_path / "control.json")
    monkeypatch.setenv(CONTROL_ENV, str(control.path))
    started: list[Daemon] = []

    def start(max_batch_size: int, dynamic_batching: str | None, *daemon_args: str,
              instances: int = 1, **parameters: str) -> tuple[Daemon, Control]:
        models = write_model(tmp_path / "models", max_batch_size, dynamic_batching, parameters,
                             instances)
        started.append(Daemon(tmp_path, models, "--engine-modules", ENGINE_MODULE,
                              *daemon_args))
        return started[-1], control

    yield start
    for d in started:
        assert d.stop() == 0
