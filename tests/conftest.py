"""Shared fixtures: a real daemon on ports and a socket picked here, and a real client."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.daemon import Daemon
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
