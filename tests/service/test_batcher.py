"""The batcher's rules, with a plain function as the model run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.batcher import BatchPolicy, DynamicBatcher
from service.errors import QueueFullError


def _batcher(policy: BatchPolicy, runs: list[int], delay_s: float = 0.0) -> DynamicBatcher:
    async def run(inputs, size):
        runs.append(size)
        await asyncio.sleep(delay_s)
        return {"y": inputs["x"] * 2}
    return DynamicBatcher("m", policy, run, lambda s: None)


def _x(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, np.float32)}


def test_requests_in_one_window_share_a_run_and_get_their_own_rows() -> None:
    async def main():
        runs: list[int] = []
        b = _batcher(BatchPolicy(8, 0.05, 100), runs)
        out = await asyncio.gather(b.submit(_x(1), 1), b.submit(_x(2, 3), 2), b.submit(_x(4), 1))
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert runs == [4]
    assert [o["y"].tolist() for o in out] == [[2], [4, 6], [8]]


def test_a_full_batch_leaves_without_waiting_and_never_exceeds_max() -> None:
    async def main():
        runs: list[int] = []
        b = _batcher(BatchPolicy(4, 10.0, 100), runs)
        await asyncio.wait_for(asyncio.gather(*[b.submit(_x(i), 1) for i in range(8)]), 2.0)
        await b.close()
        return runs
    assert asyncio.run(main()) == [4, 4]


def test_cancelled_requests_are_dropped_before_running() -> None:
    async def main():
        runs: list[int] = []
        b = _batcher(BatchPolicy(8, 0.05, 100), runs)
        doomed = asyncio.create_task(b.submit(_x(9, 9, 9), 3))
        kept = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0)
        doomed.cancel()
        result = await kept
        await b.close()
        return runs, result
    runs, result = asyncio.run(main())
    assert runs == [1] and result["y"].tolist() == [2]


def test_a_full_queue_refuses_at_once() -> None:
    async def main():
        b = _batcher(BatchPolicy(2, 0.0, 3), [], delay_s=0.2)
        first = [asyncio.create_task(b.submit(_x(i), 1)) for i in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError, match="max_queue_size is 3"):
            await b.submit(_x(5), 1)
        await asyncio.gather(*first)
        await b.close()
    asyncio.run(main())


def test_unbatched_models_run_one_request_at_a_time() -> None:
    async def main():
        runs: list[int] = []
        b = _batcher(BatchPolicy(0, 0.0, 100), runs)
        out = await asyncio.gather(b.submit(_x(1, 2), 1), b.submit(_x(3), 1))
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert runs == [1, 1] and out[0]["y"].tolist() == [2, 4]
