"""The stack fixture: a real daemon under steady load, scraped by a real Prometheus server with the
project's rules (tests/support/prometheus_stack.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.daemon import Daemon, example_repository
from tests.support.prometheus_stack import Load, Prometheus, Stack, recording_rules, scrape


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory,
          holdout: tuple[np.ndarray, np.ndarray]) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    # The example model on one device, so that each rule yields one series to check.
    daemon = Daemon(tmp, example_repository(tmp, "onnxruntime"))
    load = prometheus = None
    try:
        load = Load(daemon.url, holdout[0])
        time.sleep(3)  # a few power samples under load before the first scrape
        before = scrape(daemon.metrics_url)
        prometheus = Prometheus(tmp, f"127.0.0.1:{daemon.metrics_port}")
        deadline = time.monotonic() + 60
        while not prometheus.query("count_over_time(hetserve_inferences_total[1m]) >= 8"):
            assert time.monotonic() < deadline, "Prometheus gathered no 8 samples in 60 s"
            time.sleep(0.5)
        yield Stack(daemon, load, prometheus, before, recording_rules())
    finally:
        if prometheus is not None:
            prometheus.stop()
        if load is not None:
            load.stop()
        assert daemon.stop() == 0
