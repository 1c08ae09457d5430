"""bench/request_path.py: the servicer's path to the null engine, in this process."""

from __future__ import annotations

import asyncio

from bench.request_path import lone, measure
from bench.serving import model_repository


def test_requests_go_through_the_servicers_path_and_their_cpu_is_reported(tmp_path,
                                                                         holdout) -> None:
    models = model_repository(tmp_path, devices="null:cpu0")
    result = asyncio.run(measure(models, 2, 0.2, holdout[0][:1]))
    assert result["requests_per_s"] > 0 and result["cpu_us_per_request"] > 0


def test_a_lone_request_is_timed_hot_and_cold(tmp_path, holdout) -> None:
    models = model_repository(tmp_path, devices="null:cpu0")
    result = asyncio.run(lone(models, 0.2, holdout[0][:1]))
    assert result["hot_us"] > 0 and result["cold_us"] > 0 and result["queue_us"] >= 0
