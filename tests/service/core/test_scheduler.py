"""The scheduler's rules, with policies read from config.pbtxt text and plain objects as the
device and its ranking."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service.core.batch_buffers import BatchBuffers
from service.core.model_settings import ModelSettings, parse_batch_policy
from service.core.queue_policy import BatchPolicy, RequestOptions
from service.core.scheduler import Scheduler
from service.core.statistics import ModelStatistics
from service.core.types import Answer, Cost
from service.errors import (
    ConfigError,
    DeadlineExceededError,
    InvalidInputError,
    ModelUnavailableError,
    QueueFullError,
)


def _policy(max_batch_size: int, batching: str | None = "max_queue_delay_microseconds: 50000",
            max_queue_size: int = 100, parameters: dict[str, str] | None = None) -> BatchPolicy:
    text = f"max_batch_size: {max_batch_size}\n" + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in (parameters or {}).items())
    if batching is not None:
        text += f"dynamic_batching {{ {batching} }}\n"
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return parse_batch_policy(config, max_queue_size)


class _Device:
    """A device whose batches take `delay_s` (asyncio.sleep on a thread's behalf; time.sleep on
    the loop's thread) and whose measured hand-off costs `handoff_s` (None: none measured yet),
    so that the scheduler runs a batch inline when `delay_s` is below it."""

    healthy = True

    def __init__(self, runs: list, delay_s: float, handoff_s: float | None) -> None:
        self.runs, self.delay_s, self.handoff_s = runs, delay_s, handoff_s
        self.inline: list[bool] = []  # per batch, whether it ran on the loop's thread
        self.running = 0
        self.fastest = 0  # a batch size that runs fastest per sample (0: any)
        self.tasks: set[asyncio.Task] = set()  # batches handed over and running

    @property
    def idle(self) -> bool:
        return not self.running

    def expected_batch_s(self, size):
        return self.delay_s

    def batch_size_for(self, queued):
        return min(queued, self.fastest or queued)

    def submit(self, batch, outputs, size, done, since=None):
        def answered(task):
            error = asyncio.CancelledError() if task.cancelled() else task.exception()
            done(None if error else task.result(), error)
        self.tasks.add(task := asyncio.ensure_future(self.run(batch, outputs, size, since)))
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(answered)

    async def run(self, batch, outputs, size, since=None):
        inputs = batch.inputs()
        self.runs.append(inputs["x"].tolist())
        self.inline.append(False)
        self.running += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.running -= 1
        return self._answer(inputs, size)

    def run_inline(self, batch, outputs, size):
        inputs = batch.inputs()
        self.runs.append(inputs["x"].tolist())
        self.inline.append(True)
        time.sleep(self.delay_s)
        return self._answer(inputs, size)

    @staticmethod
    def _answer(inputs, size):
        return Answer({"y": inputs["x"] * 2}, "d0", Cost(0.5 * size, "model", 100 * size))


class _Only:
    """The ranking of one device."""

    def __init__(self, device: _Device) -> None:
        self.device = device

    def candidates(self, size):
        return [self.device]

    def failed(self, device, batch, error):
        raise AssertionError(f"no device fails here: {error}")

    def succeeded(self, device):
        pass

    async def close(self):
        pass


def _scheduler_of(policy: BatchPolicy, runs: list, delay_s: float = 0.0, slots: int = 1,
             now: bool = False, handoff_s: float | None = None) -> Scheduler:
    """`now`: the hand-off costs a second, so that every batch runs inline."""
    return _scheduler(policy, _Device(runs, delay_s, 1.0 if now else handoff_s), slots)


def _scheduler(policy: BatchPolicy, device: _Device, slots: int = 1) -> Scheduler:
    buffers = BatchBuffers({"x": ((), np.dtype(np.float32))}, policy.max_batch_size, slots)
    return Scheduler("m", policy, _Only(device), ["y"], slots, buffers, ModelStatistics(),
                     lambda s: None, lambda: None)


def _x(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, np.float32)}


def _later(s: float) -> RequestOptions:
    return RequestOptions(deadline=time.monotonic() + s)


def test_requests_in_one_window_share_a_run_and_get_their_own_rows() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8), runs)
        out = await asyncio.gather(b.submit(_x(1), 1), b.submit(_x(2, 3), 2), b.submit(_x(4), 1))
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert runs == [[1, 2, 3, 4]]
    assert [o.outputs["y"].tolist() for o in out] == [[2], [4, 6], [8]]
    assert {o.device for o in out} == {"d0"}
    # the batch's 2 J and 400 FLOPs, by rows
    assert [o.cost for o in out] == [Cost(0.5, "model", 100), Cost(1.0, "model", 200),
                                    Cost(0.5, "model", 100)]


def test_a_full_batch_leaves_without_waiting_and_never_exceeds_max() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(4, "max_queue_delay_microseconds: 10000000"), runs)
        await asyncio.wait_for(asyncio.gather(*[b.submit(_x(i), 1) for i in range(8)]), 2.0)
        await b.close()
        return runs
    assert [len(r) for r in asyncio.run(main())] == [4, 4]


def test_a_batch_takes_what_its_device_runs_fastest_and_leaves_the_rest_for_the_next() -> None:
    async def main():
        runs: list = []
        device = _Device(runs, 0.0, None)
        device.fastest = 2
        b = _scheduler(_policy(8), device)
        out = await asyncio.gather(*[b.submit(_x(i), 1) for i in range(5)])
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert runs == [[0, 1], [2, 3], [4]]
    assert [o.outputs["y"].tolist() for o in out] == [[0], [2], [4], [6], [8]]


def test_a_device_gets_its_next_batch_before_the_last_ones_replies_go_out() -> None:
    """The slot a batch frees is taken again, and the next batch handed to the device, in the
    loop's turn right after the device is done: ahead of that batch's replies, so that a fast
    device does not wait for the event loop to answer dozens of requests first."""
    async def main():
        runs: list = []
        events: list[str] = []
        device = _Device(runs, 0.05, None)
        submit = device.submit
        device.submit = lambda *a: (events.append(f"batch {len(runs) + 1}"), submit(*a))[1]
        b = _scheduler(_policy(4, "max_queue_delay_microseconds: 100"), device)

        async def call(i: int) -> None:
            await b.submit(_x(i), 1)
            events.append("reply")
        first = [asyncio.create_task(call(i)) for i in range(4)]
        await asyncio.sleep(0.02)  # the first batch runs; the next one queues
        second = [asyncio.create_task(call(i)) for i in range(4, 8)]
        await asyncio.gather(*first, *second)
        await b.close()
        return runs, events
    runs, events = asyncio.run(main())
    assert runs == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert events == ["batch 1", "batch 2", *["reply"] * 8]


def test_a_bug_while_a_batch_begins_fails_its_requests_and_the_model_goes_on() -> None:
    class Once(_Only):
        def __init__(self, device: _Device) -> None:
            super().__init__(device)
            self.calls = 0

        def candidates(self, size):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a bug")
            return super().candidates(size)

    async def main():
        runs: list = []
        policy = _policy(4, "max_queue_delay_microseconds: 0")
        buffers = BatchBuffers({"x": ((), np.dtype(np.float32))}, 4, 1)
        b = Scheduler("m", policy, Once(_Device(runs, 0.0, None)), ["y"], 1, buffers,
                      ModelStatistics(), lambda s: None, lambda: None)
        with pytest.raises(ModelUnavailableError, match="was not run to the end"):
            await b.enqueue(_x(1), 1, alone=False)  # queued: the dispatcher begins its batch
        later = await b.enqueue(_x(2), 1, alone=False)
        await b.close()
        return runs, later
    runs, later = asyncio.run(main())
    assert runs == [[2]] and later.outputs["y"].tolist() == [4]


def test_cancelled_requests_are_dropped_before_running() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8), runs)
        doomed = asyncio.create_task(b.submit(_x(9, 9, 9), 3))
        kept = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0)
        doomed.cancel()
        result = await kept
        queued = b.queued()
        await b.close()
        return runs, result, queued
    runs, result, queued = asyncio.run(main())
    assert runs == [[1]] and result.outputs["y"].tolist() == [2] and queued == 0


def test_a_full_queue_refuses_at_once() -> None:
    async def main():
        b = _scheduler_of(_policy(2, "max_queue_delay_microseconds: 0", max_queue_size=3), [],
                     delay_s=0.2)
        first = [asyncio.create_task(b.submit(_x(i), 1)) for i in range(2)]
        await asyncio.sleep(0.01)  # two run
        first += [asyncio.create_task(b.submit(_x(i), 1)) for i in range(3)]
        await asyncio.sleep(0)  # three wait
        start = time.monotonic()
        with pytest.raises(QueueFullError, match="max_queue_size is 3"):
            await b.submit(_x(5), 1)
        refused_in = time.monotonic() - start
        await asyncio.gather(*first)
        await b.close()
        return refused_in
    assert asyncio.run(main()) < 0.05


def test_without_dynamic_batching_each_request_runs_alone() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, None), runs, slots=1)
        out = await asyncio.gather(*[b.submit(_x(i, i), 2) for i in range(4)])
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert sorted(runs) == [[i, i] for i in range(4)] and out[3].outputs["y"].tolist() == [6, 6]


def test_higher_priority_jumps_a_low_priority_backlog() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(2, "max_queue_delay_microseconds: 0 priority_levels: 2 "
                                "default_priority_level: 2"), runs, delay_s=0.05)
        low = [asyncio.create_task(b.submit(_x(i), 1)) for i in range(10)]
        await asyncio.sleep(0.01)  # the first batch of lows is running
        high = await b.submit(_x(100), 1, RequestOptions(priority=1))
        await asyncio.gather(*low)
        await b.close()
        return runs, high
    runs, high = asyncio.run(main())
    assert high.outputs["y"].tolist() == [200]
    assert runs[1][0] == 100, f"the high-priority request should run next, ran: {runs}"


def test_an_expired_request_is_answered_at_its_deadline_and_never_runs() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(1, "max_queue_delay_microseconds: 0"), runs, delay_s=0.3)
        busy = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError, match="was not run"):
            await b.submit(_x(2), 1, _later(0.05))
        answered_in = time.monotonic() - start
        await busy
        await asyncio.sleep(0.05)
        await b.close()
        return runs, answered_in
    runs, answered_in = asyncio.run(main())
    assert runs == [[1]] and answered_in < 0.2


@pytest.mark.timeout(30)  # a regression spins the event loop: no wait_for could end it
def test_a_deadline_passed_before_the_batch_forms_does_not_stall_the_model() -> None:
    """The batch former meets the request expired before its own timer does: it is answered
    DEADLINE_EXCEEDED, and the scheduler goes on (it once spun the event loop for good)."""
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 500"), runs)
        with pytest.raises(DeadlineExceededError):
            await asyncio.wait_for(b.submit(_x(9), 1, _later(-0.001)), 2.0)
        out = await asyncio.wait_for(b.submit(_x(2), 1), 2.0)
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert [9] not in runs and out.outputs["y"].tolist() == [4]


@pytest.mark.parametrize("requested_us, expires", [(0, True), (20_000, True), (10_000_000, True)])
def test_queue_timeout_rejects_and_a_request_may_only_shorten_it(requested_us, expires) -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(1, "max_queue_delay_microseconds: 0 default_queue_policy { "
                                "default_timeout_microseconds: 100000 timeout_action: REJECT "
                                "allow_timeout_override: true }"), runs, delay_s=0.4)
        busy = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            await b.submit(_x(2), 1, RequestOptions(timeout_us=requested_us))
        waited = time.monotonic() - start
        await busy
        await b.close()
        return waited
    waited = asyncio.run(main())
    assert waited < 0.2  # never longer than the model's 100 ms, even when asked for 10 s
    if requested_us == 20_000:
        assert waited < 0.08


def test_delay_timeout_moves_a_request_behind_the_others() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(1, "max_queue_delay_microseconds: 0 default_queue_policy { "
                                "default_timeout_microseconds: 10000000 timeout_action: DELAY "
                                "allow_timeout_override: true }"), runs, delay_s=0.02)
        first = asyncio.create_task(b.submit(_x(0), 1))
        await asyncio.sleep(0.005)
        delayed = asyncio.create_task(b.submit(_x(1), 1, RequestOptions(timeout_us=1)))
        await asyncio.sleep(0.005)
        rest = [asyncio.create_task(b.submit(_x(i), 1)) for i in (2, 3)]
        await asyncio.gather(first, delayed, *rest)
        await b.close()
        return runs
    assert asyncio.run(main()) == [[0], [2], [3], [1]]


def _unreadable(i, error):
    raise AssertionError(f"part {i}: {error}")


def test_batches_are_assembled_in_reused_buffers_with_zero_padding() -> None:
    buffers = BatchBuffers({"x": ((2,), np.dtype(np.float32))}, 8, 1)
    parts = [{"x": np.ones((1, 2), np.float32)}, {"x": np.full((2, 2), 2, np.float32)}]
    first = buffers.batch(parts, 3, _unreadable)
    assert first.inputs()["x"].tolist() == [[1, 1], [2, 2], [2, 2]]
    padded = first.inputs(4)["x"]  # a device whose bucket is 4
    assert padded.tolist() == [[1, 1], [2, 2], [2, 2], [0, 0]]
    first.release()
    second = buffers.batch(parts[::-1], 3, _unreadable).inputs()["x"]
    assert np.shares_memory(padded, second)  # the same memory, filled again
    alone = {"x": np.ones((1, 2), np.float32)}
    assert buffers.batch([alone], 1, _unreadable).inputs()["x"] is alone["x"]  # no copy


class _Shrunk:
    """A shared-memory input whose object shrank after the request was validated."""

    shape, dtype, nbytes = (1, 2), np.dtype(np.float32), 8

    def read_into(self, out):
        raise InvalidInputError("input 'x': shared memory region 'r' no longer holds 8 bytes")


def test_an_input_that_cannot_be_read_fails_its_request_alone() -> None:
    failed = {}
    buffers = BatchBuffers({"x": ((2,), np.dtype(np.float32))}, 8, 1)
    batch = buffers.batch([{"x": np.ones((1, 2), np.float32)}, {"x": _Shrunk()}], 2,
                          lambda i, e: failed.setdefault(i, str(e)))
    assert batch.inputs()["x"].tolist() == [[1, 1], [0, 0]]
    assert failed == {1: "input 'x': shared memory region 'r' no longer holds 8 bytes"}


def test_policy_from_config_and_the_effective_config() -> None:
    text = ('name: "m" max_batch_size: 8 dynamic_batching { priority_levels: 3 '
            "priority_queue_policy { key: 1 value: { max_queue_size: 5 } } } "
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ] '
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    settings = ModelSettings.parse(text_format.Parse(text, model_config_pb2.ModelConfig()), 1,
                                   Path(), max_queue_size=64, node_gpus=0)
    policy = settings.batching
    assert [q.max_queue_size for q in policy.levels] == [5, 64, 64]
    assert policy.default_priority == 2 and policy.level(0) == 1 and policy.level(9) == 1
    config = settings.effective_config(["onnxruntime:cpu0"])
    assert config.dynamic_batching.default_priority_level == 2
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 64


def test_a_request_to_idle_devices_runs_at_once_whatever_the_window() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 10000000"), runs)
        out = await asyncio.wait_for(b.submit(_x(1), 1), 5.0)  # far below the 10 s window
        await b.close()
        return runs, out
    runs, out = asyncio.run(main())
    assert runs == [[1]] and out.outputs["y"].tolist() == [2]


def test_batches_form_while_a_device_is_busy() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 200000"), runs, delay_s=0.3,
                     slots=2)
        first = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0.05)  # running, alone: every slot was free
        second = asyncio.create_task(b.submit(_x(2), 1))
        await asyncio.sleep(0.05)  # a slot is free, but the window waits for more
        third = asyncio.create_task(b.submit(_x(3), 1))
        await asyncio.gather(first, second, third)
        await b.close()
        return runs
    assert asyncio.run(main()) == [[1], [2, 3]]


def test_queue_delay_when_idle_keeps_the_window_for_idle_devices_too() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 200000",
                             parameters={"queue_delay_when_idle": "true"}), runs, now=True)
        first = asyncio.create_task(b.submit(_x(1), 1))
        await asyncio.sleep(0.05)
        await asyncio.gather(first, b.submit(_x(2), 1))
        await b.close()
        return runs
    assert asyncio.run(main()) == [[1, 2]]


def test_a_lone_request_to_idle_devices_runs_in_the_call_that_queues_it() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 200000"), runs, now=True)
        answer = b.enqueue(_x(1), 1)
        done_at_once, queued = answer.done(), b.queued()  # no task or loop iteration between
        await b.close()
        return runs, answer.result(), done_at_once, queued
    runs, answer, done_at_once, queued = asyncio.run(main())
    assert done_at_once and queued == 0 and runs == [[1]]
    assert answer.outputs["y"].tolist() == [2] and answer.cost == Cost(0.5, "model", 100)


@pytest.mark.parametrize("window_us, busy_s, pause_s", [
    # the next requests come within the window (the device long idle): they may have company
    (200000, 0.0, 0.01),
    # they come after the window, but the device was busy until then: arrivals come quickly
    (1000, 0.1, 0.0),
])
def test_requests_right_after_an_inline_run_queue_and_share_a_batch(window_us, busy_s,
                                                                pause_s) -> None:
    async def main():
        device = _Device([], busy_s, 1.0)  # a hand-off dearer than any batch: inline if alone
        b = _scheduler(_policy(8, f"max_queue_delay_microseconds: {window_us}"), device)
        first = b.enqueue(_x(1), 1)  # came alone: runs now
        await asyncio.sleep(pause_s)
        later = [b.enqueue(_x(i), 1) for i in (2, 3)]
        waited = [not f.done() for f in later]
        await asyncio.gather(*later)
        await b.close()
        return device, first.done(), waited
    device, first_done, waited = asyncio.run(main())
    assert first_done and waited == [True, True] and device.runs == [[1], [2, 3]]
    assert device.inline == [True, False]  # a batch of several runs on a thread


def test_every_eighth_request_that_would_run_inline_is_handed_over_to_measure_it_anew() -> None:
    async def main():
        device = _Device([], 0.0002, 1.0)
        b = _scheduler(_policy(8, "max_queue_delay_microseconds: 0"), device)
        for i in range(16):  # one client, its requests far apart: each comes alone
            await b.submit(_x(i), 1)
            await asyncio.sleep(0.02)
        await b.close()
        return device.inline
    assert asyncio.run(main()) == ([True] * 7 + [False]) * 2


def test_requests_that_came_together_do_not_run_in_the_call_but_share_a_batch() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8), runs, now=True)
        answers = [b.enqueue(_x(i), 1, alone=False) for i in (1, 2)]  # a front-end's frame
        waited = [not a.done() for a in answers]
        await asyncio.gather(*answers)
        await b.close()
        return runs, waited
    runs, waited = asyncio.run(main())
    assert waited == [True, True] and runs == [[1, 2]]


def test_a_request_past_its_deadline_does_not_run_in_the_call() -> None:
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8), runs, now=True)
        with pytest.raises(DeadlineExceededError):
            await b.submit(_x(1), 1, RequestOptions(deadline=time.monotonic() - 1))
        await b.close()
        return runs
    assert asyncio.run(main()) == []


def _queue_waits(company_s: float | None, rounds: int) -> tuple[list[bool], list[list]]:
    """One client on a device slower than its round trip (40 ms batches, a 50 ms window): per
    request, whether it waited the window, and the runs; with `company_s`, each request is
    followed that much later by a second one, which a wait lets into its batch."""
    async def main():
        runs: list = []
        b = _scheduler_of(_policy(8, "max_queue_delay_microseconds: 50000"), runs, delay_s=0.04)
        waited = []
        for i in range(rounds):
            start = time.monotonic()
            answers = [b.enqueue(_x(i), 1)]
            if company_s is not None:
                await asyncio.sleep(company_s)
                answers.append(b.enqueue(_x(-i), 1))
            await asyncio.gather(*answers)
            waited.append(time.monotonic() - start > 0.04 + 0.025)
        await b.close()
        return waited, runs
    return asyncio.run(main())


def test_one_client_on_a_slow_device_stops_waiting_for_company_that_never_comes() -> None:
    waited, _ = _queue_waits(None, 28)
    assert not waited[0] and waited[1]  # idle devices run at once; busy lately, the window waits
    # once waits bring nobody, only every 8th request still waits, to notice company coming back
    assert waited[-16:].count(True) == 2


def test_waits_that_grow_batches_go_on() -> None:
    waited, runs = _queue_waits(0.005, 16)
    assert all(waited[1:]) and all(len(run) == 2 for run in runs[2:])  # after [0], [-0]


@pytest.mark.parametrize("text, message", [
    ("dynamic_batching { max_queue_delay_microseconds: 10000001 }",
     r"max_queue_delay_microseconds 10000001 is above 10000000 \(10 s\)"),
    ('dynamic_batching { } parameters { key: "queue_delay_when_idle" value: { string_value: '
     '"yes" } }', r"parameters\['queue_delay_when_idle'\] 'yes'; expected 'true' or 'false'"),
])
def test_a_bad_window_fails_the_model_naming_the_field(text, message) -> None:
    config = text_format.Parse(f'name: "m" max_batch_size: 8 {text}',
                               model_config_pb2.ModelConfig())
    with pytest.raises(ConfigError, match=message):
        parse_batch_policy(config, 100)


@pytest.mark.parametrize("batch_s, handoff_s, inline", [
    (0.0002, 0.0006, True),  # MNIST on a 2-vCPU VM: cheaper than the hand-off
    (0.002, 0.0006, False),  # a few-ms batch there: the loop must go on reading requests
    (0.0002, 0.00005, False),  # MNIST where threads hand off quickly (16 cores)
    (0.002, 0.00005, False),  # ResNet-50 on a GPU node
    (0.0001, None, False),  # no hand-off measured yet
])
def test_a_batch_runs_inline_only_where_it_costs_less_than_the_measured_hand_off(
        batch_s, handoff_s, inline) -> None:
    async def main():
        device = _Device([], batch_s, handoff_s)
        b = _scheduler(_policy(8), device)
        await b.submit(_x(1), 1)
        await b.close()
        return device.inline
    assert asyncio.run(main()) == [inline]


@pytest.mark.parametrize("batch_s, handoff_s", [
    (0.003, 0.0006),  # a few ms per batch on a 2-vCPU VM
    (0.002, 0.00005),  # ResNet-50 on a GPU node
    (0.012, 0.0006),  # a slower device
    (0.0002, 0.0006),  # a faster one, below the hand-off
    (0.002, 0.005),  # a loaded 2-vCPU box, where the hand-off measured longer than the batch
])
def test_batches_grow_with_concurrency_after_an_idle_period(batch_s, handoff_s) -> None:
    """One client first (batches of one), then 16: their requests queue while a batch runs."""
    async def main():
        device = _Device([], batch_s, handoff_s)
        b = _scheduler(_policy(64, "max_queue_delay_microseconds: 500"), device)

        async def client(requests: int) -> None:
            for i in range(requests):
                await b.submit(_x(i), 1)
        await client(20)
        alone = len(device.runs)
        await asyncio.gather(*(client(20) for _ in range(16)))
        await b.close()
        return alone, [len(run) for run in device.runs[alone:]], device.inline[alone:]
    alone, batches, inline = asyncio.run(main())
    assert alone == 20 and sum(batches) == 320
    assert sum(batches) / len(batches) > 4, batches
    # no batch of several holds the loop while the others' requests wait to be read
    assert not any(on_loop for size, on_loop in zip(batches, inline) if size > 1)


def _as(caller: str, anonymous: bool = False) -> RequestOptions:
    return RequestOptions(caller=caller, anonymous=anonymous)


def test_one_caller_or_all_anonymous_ones_hold_at_most_three_quarters_of_a_level() -> None:
    async def main():
        b = _scheduler_of(_policy(1, "max_queue_delay_microseconds: 0", max_queue_size=8), [],
                     delay_s=0.3)
        running = b.enqueue(_x(0), 1, _as("uid 1000"))  # runs: the slot is taken
        await asyncio.sleep(0.01)
        held = [b.enqueue(_x(i), 1, _as("uid 1000")) for i in range(6)]  # 6 of 8: its share
        refusals = []
        for options in (_as("uid 1000"), _as("127.0.0.2", True)):
            try:
                b.enqueue(_x(9), 1, options)
                refusals.append("")
            except QueueFullError as e:
                refusals.append(str(e))
        other = b.enqueue(_x(7), 1, _as("uid 1001"))  # another caller finds room
        for f in [running, *held, other]:
            f.cancel()
        await b.close()
        return refusals
    flooded, anonymous_first = asyncio.run(main())
    assert "this caller (uid 1000) holds 6 samples" in flooded and "its share (6 of" in flooded
    assert anonymous_first == ""  # its first request fits


def test_unauthenticated_tcp_callers_together_leave_a_quarter_to_the_others() -> None:
    async def main():
        b = _scheduler_of(_policy(1, "max_queue_delay_microseconds: 0", max_queue_size=8), [],
                     delay_s=0.3)
        running = b.enqueue(_x(0), 1)
        await asyncio.sleep(0.01)
        # Aliases of one user, or many users: each address holds little, together their share.
        anonymous = [b.enqueue(_x(i), 1, _as(f"10.0.0.{i}", True)) for i in range(6)]
        with pytest.raises(QueueFullError, match="callers over TCP without a token hold 6"):
            b.enqueue(_x(9), 1, _as("10.0.0.9", True))
        socket_user = b.enqueue(_x(7), 1, _as("uid 1001"))
        for f in [running, *anonymous, socket_user]:
            f.cancel()
        await b.close()
    asyncio.run(main())
