"""bench/owner_capacity.py: simulated front-ends keep requests at a real device owner."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from bench.owner_capacity import _owner


def test_simulated_frontends_keep_the_owner_busy_and_every_request_is_answered() -> None:
    args = argparse.Namespace(seconds=0.3, frontends=2, in_flight=[1, 8])
    one, eight = asyncio.run(_owner(args))
    # one request per batch (the counts are read between a batch and its answer: ±1)
    assert one["in_flight"] == 1 and one["rps"] > 0
    assert one["per_batch"] == pytest.approx(1.0, abs=0.01)
    # 8 in flight from 2 front-ends: batches hold more than one request (a refused one would
    # end its front-end, and the point)
    assert eight["rps"] > 0 and eight["per_batch"] > 1.0
    assert eight["cpu_us"] > 0
