"""The load client of `hetserve tune` and the benchmarks: how load points are split among client
processes and how their raw results are merged (pure functions), and the processes driving a real
echo server (bench/echo_server.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from service.clients.load_client import ClientPool, infer_request, merge, shares, summary
from service.local_daemon import free_port
from tests.support.daemon import ROOT


def _part(latencies_ms: list[float], started: float, ended: float, errors: dict | None = None,
          cpu_s: float = 0.0) -> dict:
    return {"latencies": [x / 1e3 for x in latencies_ms], "errors": errors or {},
            "started": started, "ended": ended, "cpu_s": cpu_s}


def test_shares_split_callers_evenly_and_keep_their_total() -> None:
    assert shares(16, 3) == [6, 5, 5]
    assert shares(1, 4) == [1, 0, 0, 0]
    assert shares(64, 1) == [64]
    assert all(sum(shares(n, p)) == n for n in range(50) for p in range(1, 9))


def test_merged_percentiles_are_over_every_latency_not_an_average_of_percentiles() -> None:
    fast = _part([1.0] * 990, 10.0, 12.0)  # one process: every call 1 ms
    slow = _part([100.0] * 10, 10.0, 12.0)  # the other: ten calls of 100 ms
    merged = merge([fast, slow])
    # p99 of all 1000 calls lies between the 990th (1 ms) and the 991st (100 ms) value; the
    # average of the two processes' p99s would say 50.5 ms
    assert merged["p99_ms"] == pytest.approx(np.percentile([1.0] * 990 + [100.0] * 10, 99))
    assert merged["p99_ms"] != pytest.approx((1.0 + 100.0) / 2)
    assert merged["p50_ms"] == pytest.approx(1.0)
    assert merged["requests"] == 1000


def test_merged_rate_is_over_the_span_all_processes_ran() -> None:
    merged = merge([_part([1.0] * 100, 10.0, 12.0, {"UNAVAILABLE": 2}, cpu_s=0.5),
                    _part([2.0] * 50, 10.5, 13.0, {"UNAVAILABLE": 1, "CANCELLED": 4},
                          cpu_s=0.25)])
    assert merged["rps"] == pytest.approx(150 / 3.0)  # not 100/2 + 50/2.5
    assert merged["errors"] == {"UNAVAILABLE": 3, "CANCELLED": 4}
    assert merged["client_cpu_s"] == pytest.approx(0.75)


def test_a_point_without_answers_has_no_rate_and_no_percentiles() -> None:
    merged = merge([_part([], 1.0, 2.0, {"UNAVAILABLE": 7})])
    assert (merged["rps"], merged["requests"]) == (0.0, 0)
    assert math.isnan(merged["p50_ms"]) and math.isnan(merged["p99_ms"])
    assert summary([], Counter(), 0.0)["rps"] == 0.0


def test_client_processes_drive_a_real_echo_server(holdout) -> None:
    port = free_port()
    echo = subprocess.Popen([sys.executable, str(ROOT / "bench" / "echo_server.py"), str(port)])
    request = infer_request("mnist_cnn", {"image": holdout[0][:1]})
    pool = ClientPool(3, {"echo": f"127.0.0.1:{port}"}, request)
    try:
        pool.wait_ready()
        closed = pool.run("echo", "closed", 4, 0.5)  # one process gets no caller
        stream = pool.run("echo", "stream", 6, 0.5)
        poisson = pool.run("echo", "poisson", 300, 0.5)
    finally:
        pool.close()
        echo.terminate()
        echo.wait(10)
    for point in (closed, stream, poisson):
        assert point["errors"] == {} and point["requests"] > 0
        assert point["rps"] > 0 and point["p99_ms"] >= point["p50_ms"] > 0
        assert point["client_cpu_s"] > 0
    assert poisson["requests"] < 300  # arrivals over half a second, not more
