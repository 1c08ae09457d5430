"""Priorities, deadlines and overload against a real daemon whose device is slowed down (the
faulty test engine), driven by tritonclient's asyncio client."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.support.daemon import MODEL, image_input
from tests.support.metrics import scrape, total

BATCH_S = 0.02  # added to every batch on the device: capacity is max_batch_size / BATCH_S


async def _timed(client, images, **kwargs) -> tuple[float, str]:
    """(seconds, status name) of one request; "OK" when it succeeded."""
    start = time.monotonic()
    try:
        await client.infer(MODEL, image_input(images), **kwargs)
        status = "OK"
    except InferenceServerException as e:
        status = e.status().removeprefix("StatusCode.")
    return time.monotonic() - start, status


def test_a_low_priority_flood_does_not_delay_high_priority_requests(serve, holdout) -> None:
    # One client's 488 calls at once: within its share of TCP's calls (three quarters)
    daemon, control = serve(8, "max_queue_delay_microseconds: 1000 priority_levels: 2 "
                               "default_priority_level: 2", "--max-rpcs-tcp", "1024",
                            devices="faulty:cpu1")
    control.set(delay_s=BATCH_S)
    budget_s = 0.25  # a few batches; the flood below queues about 1.2 s of work
    image = holdout[0][:1]

    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as client:
            flood = [asyncio.create_task(_timed(client, image, priority=2)) for _ in range(480)]
            await asyncio.sleep(0.4)  # the flood has arrived and waits
            high = []
            for _ in range(8):
                high.append(await _timed(client, image, priority=1))
            return high, await asyncio.gather(*flood)

    high, low = asyncio.run(main())
    assert all(status == "OK" for _, status in high + low), {s for _, s in high + low}
    assert max(s for s, _ in high) < budget_s, f"high-priority latencies {high}"
    # The flood was real: low-priority requests behind the backlog waited far past the budget.
    assert np.percentile([s for s, _ in low], 90) > 3 * budget_s


def test_expired_requests_never_reach_the_device(serve, holdout) -> None:
    daemon, control = serve(4, "max_queue_delay_microseconds: 1000 default_queue_policy { "
                               "allow_timeout_override: true }", devices="faulty:cpu1")
    control.set(delay_s=BATCH_S)
    image = holdout[0][:1]

    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as client:
            backlog = [asyncio.create_task(_timed(client, image)) for _ in range(100)]
            await asyncio.sleep(0.1)  # about 0.4 s of work is queued
            # A client gRPC deadline, and a queue timeout (µs) as a request parameter.
            expiring = [asyncio.create_task(_timed(client, image, client_timeout=0.1))
                        for _ in range(10)]
            expiring += [asyncio.create_task(_timed(client, image, timeout=50_000))
                         for _ in range(10)]
            return await asyncio.gather(*backlog), await asyncio.gather(*expiring)

    backlog, expiring = asyncio.run(main())
    assert all(status == "OK" for _, status in backlog)
    assert [status for _, status in expiring] == ["DEADLINE_EXCEEDED"] * 20
    assert max(s for s, _ in expiring) < 0.3  # answered at the deadline, not after the backlog
    time.sleep(0.2)
    metrics = scrape(daemon.metrics_url)
    assert total(metrics, "hetserve_inferences_total", model=MODEL) == 100
    assert total(metrics, "hetserve_requests_expired_total", model=MODEL) >= 10


@pytest.mark.timeout(60)
def test_deadlines_shorter_than_the_queue_never_stall_the_daemon(serve, holdout) -> None:
    """Clients whose deadlines pass between arrival and batch (a millisecond or less) get
    DEADLINE_EXCEEDED or an answer, and every other client is still served: such a request
    once spun the daemon's event loop for good."""
    daemon, _ = serve(8, "max_queue_delay_microseconds: 500")
    image = holdout[0][:1]

    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as client:
            for i in range(200):
                await _timed(client, image, client_timeout=0.0002 + i % 10 * 0.0001)
            return await asyncio.wait_for(_timed(client, image, client_timeout=5.0), 10.0)

    _, status = asyncio.run(main())
    assert status == "OK"


def test_overload_at_three_times_capacity(serve, holdout) -> None:
    # Capacity: 4 samples per 50 ms = 80 requests/s; offered: 240/s for 2 s, open loop.
    daemon, control = serve(4, "max_queue_delay_microseconds: 1000 default_queue_policy { "
                               "max_queue_size: 16 }", devices="faulty:cpu1")
    control.set(delay_s=0.05)
    images = holdout[0][:480]
    before = scrape(daemon.metrics_url)["process_resident_memory_bytes"]

    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as client:
            calls = []
            start = time.monotonic()
            for i in range(480):
                await asyncio.sleep(max(start + i / 240 - time.monotonic(), 0))
                calls.append(asyncio.create_task(_timed(client, images[i:i + 1])))
            offered_s = time.monotonic() - start  # more than 2 s where this machine is busy
            return offered_s, await asyncio.gather(*calls)

    offered_s, replies = asyncio.run(main())
    after = scrape(daemon.metrics_url)["process_resident_memory_bytes"]
    statuses = [status for _, status in replies]
    assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}  # every request answered
    accepted = statuses.count("OK")
    # At most what the device serves while requests arrive, plus what the queue and a batch hold.
    ceiling = 80 * offered_s + 16 + 4
    assert 40 <= accepted <= 1.25 * ceiling, f"{accepted} accepted of 480 in {offered_s:.1f} s"
    refused = [s for s, status in replies if status == "RESOURCE_EXHAUSTED"]
    served = [s for s, status in replies if status == "OK"]
    # Refused at once: far sooner than a request that waits its turn in the queue.
    assert np.median(refused) < 0.25 * np.median(served)
    assert np.percentile(refused, 90) < np.median(served)
    # The queue is bounded (16 samples), so memory is too.
    assert after - before < 50 * 2**20, f"resident memory grew {(after - before) / 2**20} MiB"


def test_engine_instances_run_batches_at_the_same_time(serve, holdout) -> None:
    """instance_group count 2: two batches in flight on one device, each on its own engine."""
    delay_s = 0.3  # per batch; max_batch_size 1 makes each request a batch of its own
    daemon, control = serve(1, "max_queue_delay_microseconds: 1000", devices="faulty:cpu1",
                            instances=2)
    control.set(delay_s=delay_s)

    async def main() -> float:
        async with aioclient.InferenceServerClient(daemon.url) as client:
            start = time.monotonic()
            replies = await asyncio.gather(*[_timed(client, holdout[0][:1]) for _ in range(8)])
            assert [status for _, status in replies] == ["OK"] * 8
            return time.monotonic() - start

    elapsed = asyncio.run(main())
    # One engine would need 8 x 0.3 s; two share the eight batches.
    assert 4 * delay_s <= elapsed < 7 * delay_s, f"eight batches took {elapsed:.2f} s"


def test_a_tcp_flood_without_a_token_leaves_room_for_a_socket_user(serve, holdout) -> None:
    """A local user floods over TCP (no token), each refused request sent again at once:
    together such callers hold at most three quarters of the queue, so a socket user's light
    load is never refused."""
    daemon, control = serve(4, "max_queue_delay_microseconds: 1000 default_queue_policy { "
                               "max_queue_size: 32 }", devices="faulty:cpu1")
    control.set(delay_s=0.05)
    image = holdout[0][:1]

    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as flooder, \
                aioclient.InferenceServerClient(daemon.socket_url) as user:
            end = time.monotonic() + 1.5
            refused = [0]

            async def flood() -> None:
                while time.monotonic() < end:
                    if (await _timed(flooder, image))[1] == "RESOURCE_EXHAUSTED":
                        refused[0] += 1
            flooding = [asyncio.create_task(flood()) for _ in range(64)]
            await asyncio.sleep(0.3)  # the queue is as full as the flood may make it
            light = []
            for _ in range(8):
                light.append(await _timed(user, image))
            await asyncio.gather(*flooding)
            return light, refused[0]

    light, refused = asyncio.run(main())
    assert [status for _, status in light] == ["OK"] * 8
    assert refused > 100  # the flood filled its share all along
