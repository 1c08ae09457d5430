"""The scheduler of one model: when a batch leaves the queue, where it runs, and on which thread.

Queue: one FIFO per priority level (level 1 first). A batch leaves only when a device slot is
free, so batches grow while devices are busy. When every slot is free (the devices idle), what
is queued leaves at once, as waiting would only delay it, unless the devices were busy more than
half the time lately and such waits lately grew batches (_worth_waiting). Otherwise the wait
window opens when the oldest waiting request arrived, and a batch leaves when it is full
(max_batch_size, or the largest preferred size) or when the window closes, to the microsecond
(service/core/precise_timer.py). `max_queue_delay_microseconds` stays the upper bound of every
wait.

Device: the ranking's first choice (service/core/ranking.py: policy order, failover); a device
that fails the batch is marked so and the batch runs on the next.

Thread: a batch is handed to the device's instance threads, which leaves the event loop free to
read the requests that arrive meanwhile. Only a request that comes alone to idle devices runs on
the loop's own thread, in the call that queues it, and only where that costs less than the
hand-off, both measured on this device (_runs_inline). Every 8th such request is handed over
all the same, so that the hand-off's measure follows the machine's load (on a loaded machine it
measured above a 2 ms batch, and a measure never taken again would keep such batches inline).

Requests whose gRPC deadline or REJECT queue timeout passes are answered DEADLINE_EXCEEDED the
moment it passes and never reach a device; DELAY requests move behind every other request;
cancelled ones are dropped. A full level refuses at once, and so does a level where one caller
(a uid, the token's holders, an address), or every unauthenticated TCP caller together, would
hold more than three quarters of its places while holding some already: the others find room.
Requests that carry several samples are packed whole and their outputs split back in order,
each with its rows' part of the batch's cost. Over the node's power budget
(service/core/power_budget.py) priority levels are held back, lowest first: their requests
wait, within their deadlines, except those already behind the others (DELAY).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.core.batch_buffers import Batch, BatchBuffers
from service.core.power_budget import PowerBudget
from service.core.precise_timer import PreciseTimer
from service.core.queue_policy import DEFAULT_OPTIONS, BatchPolicy, RequestOptions, callers_share
from service.core.statistics import ModelStatistics
from service.core.types import Answer, Finished, Inputs, Tensors, settle
from service.errors import (
    DeadlineExceededError,
    DeviceError,
    HetserveError,
    InvalidInputError,
    ModelUnavailableError,
    QueueFullError,
)

log = logging.getLogger(__name__)
# Arrivals closer than this come together (one event-loop iteration hands over many: a
# front-end's frame, several gRPC calls), so a request after so short a gap may have company.
_TOGETHER_S = 100e-6
# Whether the window still grows batches when the devices were busy lately: the share of the
# latest waits during which the batch grew (a moving average, the newest weighing 1/8). Below a
# quarter the window is skipped (one client on a slow device: its next request never has
# company), but every 8th request still waits, to notice when company comes back.
_PAID_WEIGHT = 1 / 8
_PAID_MIN = 0.25
_PROBE_EVERY = 8
# Every 8th request that would run inline is handed over instead: the hand-off is measured anew.
_INLINE_PROBE_EVERY = 8


class Device(Protocol):
    """What the scheduler needs of a device runner (service/core/device_runner.py)."""

    healthy: bool

    @property
    def idle(self) -> bool:
        """No batch of this model queued or running on the device."""

    @property
    def handoff_s(self) -> float | None:
        """The measured cost of handing a batch to an instance thread and back; None before
        one was measured."""

    @property
    def known_good(self) -> Tensors | None:
        """One sample the device has run; None before its first batch."""

    def expected_batch_s(self, size: int) -> float | None:
        """How long a batch of `size` computes, from measured batches; None before any."""

    def batch_size_for(self, queued: int) -> int:
        """How many of `queued` samples its next batch should take for the most samples per
        second (fewer where padding up would waste more than it gains)."""

    def submit(self, batch: Batch, outputs: list[str], size: int, done: Finished,
               since: float | None = None) -> None:
        """Hands the batch to an instance thread now, which assembles and runs it; `done(answer,
        None)` or `done(None, error)` (DeviceError) is called on the loop's thread as soon as it
        is. `since`: time.monotonic() when the batch's one request was queued, where nothing
        else waited on the loop: what running it inline would have saved is measured from
        then."""

    async def run(self, batch: Batch, outputs: list[str], size: int,
                  since: float | None = None) -> Answer:
        """submit()'s answer, awaited."""

    def run_inline(self, batch: Batch, outputs: list[str], size: int) -> Answer:
        """On this thread (raises DeviceError)."""


class _InputsRefused(InvalidInputError):
    """A device that failed a batch still runs what it ran before: the batch's inputs are at
    fault."""


class Ranking(Protocol):
    """The model's devices in the order a batch tries them, and their health
    (service/core/ranking.py)."""

    def candidates(self, size: int) -> Sequence[Device]:
        ...

    def failed(self, device: Any, batch: Batch, error: DeviceError) -> None:
        ...

    def succeeded(self, device: Any) -> None:
        ...

    async def close(self) -> None:
        ...


@dataclass(eq=False)
class _Run:
    """A batch the dispatcher began: its requests, inputs, start (time.monotonic()), the
    devices in the ranking's order, and Device.run's `since`."""
    pending: list[_Pending]
    batch: Batch
    started: float
    devices: list[Device]
    since: float | None


@dataclass(eq=False)
class _Pending:
    inputs: Inputs
    size: int
    level: int
    future: asyncio.Future
    enqueued: float  # loop.time(), which is time.monotonic()
    expires: float | None  # REJECT: answered DEADLINE_EXCEEDED from then on
    caller: str  # whose places it holds (RequestOptions)
    anonymous: bool
    delay_after: float | None  # DELAY: moves behind every other request from then on
    timer: asyncio.TimerHandle | None = None
    taken: bool = False  # left the queue: claimed by a batch, answered, or cancelled
    delayed: bool = False  # moved behind every other request


class Scheduler:
    def __init__(self, model: str, policy: BatchPolicy, ranking: Ranking, outputs: list[str],
                 slots: int, buffers: BatchBuffers, stats: ModelStatistics,
                 observe_queue_s: Callable[[float], None],
                 on_expired: Callable[[], None], budget: PowerBudget | None = None) -> None:
        self.model = model
        self.policy = policy
        self._ranking = ranking
        self._outputs = outputs
        self._buffers = buffers
        self._stats = stats
        self._observe_queue_s = observe_queue_s
        self._on_expired = on_expired
        self._loop = asyncio.get_running_loop()
        self._levels: list[deque[_Pending]] = [deque() for _ in policy.levels]
        self._delayed: deque[_Pending] = deque()
        self._queued = [0] * len(policy.levels)  # samples waiting per level
        self._queued_delayed = [0] * len(policy.levels)  # of them, behind the others
        self._held: list[Counter[str]] = [Counter() for _ in policy.levels]  # by caller
        self._held_anonymous = [0] * len(policy.levels)  # by unauthenticated TCP callers
        self._budget = budget
        if budget is not None:
            budget.subscribe(self._arrived_now)
        self._arrived = asyncio.Event()
        self._wanted = 1  # samples the dispatcher waits for
        self._slots = asyncio.Semaphore(slots)  # batches in flight at once
        self._running: set[_Run] = set()  # batches handed to devices and not answered yet
        self._failovers: set[asyncio.Task] = set()  # of those, the ones trying later devices
        self._none_running = asyncio.Event()  # what close() waits for
        self._none_running.set()
        self._window_open = True  # false from a window's close to the end of its wait
        self._timer = PreciseTimer(self._loop, self._close_window)
        self._idle_since = float("-inf")  # loop.time() when the last running batch ended
        self._last_run_s = 0.0  # how long that batch ran
        self._last_arrival = float("-inf")  # loop.time() when the latest request was queued
        self._inline_runs = 0  # lone requests run inline since the hand-off was last measured
        self._waits_paid = 1.0  # share of the latest waits that grew their batch
        self._waits_skipped = 0  # windows skipped since the last wait
        self._emptied: asyncio.Event | None = None  # set as the queue empties, while draining
        self._task = asyncio.create_task(self._dispatch(), name=f"scheduler-{model}")

    def queued(self) -> int:
        return sum(self._queued)

    async def submit(self, inputs: Inputs, size: int,
                     options: RequestOptions = DEFAULT_OPTIONS) -> Answer:
        return await self.enqueue(inputs, size, options)

    def enqueue(self, inputs: Inputs, size: int, options: RequestOptions = DEFAULT_OPTIONS,
                alone: bool = True) -> asyncio.Future[Answer]:
        """`submit` without waiting: queues the request now (QueueFullError refuses it) and
        returns its answer's future; cancelling the future takes the request out of the queue.
        `alone` false says that others came with it (a front-end's frame of several)."""
        level = self.policy.level(options.priority)
        limit = self.policy.levels[level].max_queue_size
        if self._queued[level] + size > limit:
            raise QueueFullError(
                f"model {self.model!r}: priority level {level + 1} queue holds "
                f"{self._queued[level]} samples and max_queue_size is {limit}; retry later")
        self._check_share(level, size, options)
        now = self._loop.time()
        timeout_s = self.policy.timeout_s(level, options.timeout_us)
        reject = self.policy.levels[level].reject_on_timeout
        queue_until = now + timeout_s if timeout_s else None
        expires = options.deadline  # the sooner of it and a REJECT queue timeout
        if reject and queue_until is not None and (expires is None or queue_until < expires):
            expires = queue_until
        pending = _Pending(inputs, size, level, self._loop.create_future(), now, expires,
                           options.caller, options.anonymous, None if reject else queue_until)
        alone = alone and \
            now - self._last_arrival >= max(self.policy.max_queue_delay_s, _TOGETHER_S)
        self._last_arrival = now
        if alone and self._runs_now(pending):
            return pending.future
        if expires is not None:
            pending.timer = self._loop.call_at(expires, self._expire, pending)
        pending.future.add_done_callback(lambda _: self._leave(pending))
        self._levels[level].append(pending)
        self._queued[level] += size
        self._held[level][pending.caller] += size
        self._held_anonymous[level] += size if pending.anonymous else 0
        if self._takeable() >= self._wanted:
            self._arrived.set()
        return pending.future

    def _check_share(self, level: int, size: int, options: RequestOptions) -> None:
        """QueueFullError where the caller, or every unauthenticated TCP caller together, would
        hold more than its share of the level (a caller's first request always fits)."""
        if not options.caller:
            return
        limit = self.policy.levels[level].max_queue_size
        share = callers_share(limit)
        held = self._held[level][options.caller]
        if held and held + size > share:
            raise QueueFullError(
                f"model {self.model!r}: this caller ({options.caller}) holds {held} samples of "
                f"priority level {level + 1}'s queue, its share ({share} of max_queue_size "
                f"{limit}, so that other callers find room); retry later")
        together = self._held_anonymous[level]
        if options.anonymous and together and together + size > share:
            raise QueueFullError(
                f"model {self.model!r}: callers over TCP without a token hold {together} "
                f"samples of priority level {level + 1}'s queue, their share together "
                f"({share}; a token, or the unix socket, has places of its own); retry later")

    def _runs_now(self, pending: _Pending) -> bool:
        """Runs a request that came alone (none other within the window) at once, in this call,
        when it would leave the queue at once as a batch of its own (nothing queued or running,
        the devices idle long enough, its level not held, its deadline ahead) and its device
        runs it on this thread (_runs_inline), except every _INLINE_PROBE_EVERY-th time, which
        measures the hand-off anew; false leaves it to the queue, where requests that come
        together share a batch. Saves the dispatcher's wake-up, the instance thread's round
        trip and the caller's wake-up: three event-loop iterations per request at low load."""
        if self.queued() or self._running or self._worth_waiting() or (
                pending.expires is not None and pending.expires <= pending.enqueued) or (
                self._budget is not None and self._budget.holds(pending.level)):
            return False
        device = self._ranking.candidates(pending.size)[0]
        if not _runs_inline(device, pending.size):
            return False
        self._inline_runs += 1
        if self._inline_runs >= _INLINE_PROBE_EVERY:  # handed over: the dispatcher measures it
            self._inline_runs = 0
            return False
        started = time.monotonic()
        batch = self._batch([pending])
        try:
            answer = device.run_inline(batch, self._outputs, pending.size)
        except DeviceError:  # the queue runs it again, and tells a fault of the inputs from
            return False  # one of the device's before it blames the device (_execute)
        finally:
            batch.release()
        self._idle_since = time.monotonic()
        self._answer([pending], answer, batch, started)
        return True

    def _takeable(self) -> int:
        """Samples a batch may take now: those of the levels the power budget does not hold."""
        if self._budget is None or not self._budget.stage:
            return self.queued()
        return sum(delayed if self._budget.holds(level) else queued for level, (queued, delayed)
                   in enumerate(zip(self._queued, self._queued_delayed)))

    def _arrived_now(self) -> None:
        """The power budget released levels: what they hold may be taken."""
        self._arrived.set()

    async def close(self) -> None:
        """Ends the model's service: batches in flight finish, queued requests are refused,
        and the devices close."""
        if self._budget is not None:
            self._budget.unsubscribe(self._arrived_now)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._none_running.wait()
        self._timer.close()
        for queue in (*self._levels, self._delayed):
            while queue:
                settle(queue.popleft().future, error=ModelUnavailableError(
                    f"model {self.model!r} is unloading"))
        await self._ranking.close()

    async def drain(self, grace_s: float) -> bool:
        """Until every queued request has left the queue (answered, or in a batch, which close()
        lets finish): for a version that takes no new requests. False if `grace_s` ran out."""
        self._emptied = event = asyncio.Event()

        async def emptied() -> None:
            while self.queued():
                event.clear()
                await event.wait()
        try:
            await asyncio.wait_for(emptied(), grace_s)
        except TimeoutError:
            return False
        return True

    def _leave(self, pending: _Pending) -> None:
        """Frees the queue room of a request answered or cancelled while it waited."""
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.taken:
            pending.taken = True
            self._queued[pending.level] -= pending.size
            held = self._held[pending.level]
            held[pending.caller] -= pending.size
            if not held[pending.caller]:
                del held[pending.caller]
            self._held_anonymous[pending.level] -= pending.size if pending.anonymous else 0
            if pending.delayed:
                self._queued_delayed[pending.level] -= pending.size
            if self._emptied is not None and not self.queued():
                self._emptied.set()

    def _expire(self, pending: _Pending) -> None:
        if not pending.taken:
            self._on_expired()
            settle(pending.future, error=DeadlineExceededError(
                f"model {self.model!r}: the request's deadline passed after "
                f"{self._loop.time() - pending.enqueued:.3f} s in the queue; it was not run"))

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                pending, waited = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            try:
                self._begin(pending, waited)
            except Exception as e:  # a bug: its requests fail, the model goes on
                log.error("model %r: a batch could not begin", self.model, exc_info=e)
                self._failed(pending, e)
                self._slots.release()

    def _ended(self, run: _Run) -> None:
        self._running.discard(run)
        if not self._running:
            self._idle_since = self._loop.time()
            self._none_running.set()

    async def _next_batch(self) -> tuple[list[_Pending], bool]:
        """The next batch, and whether it waited out a window."""
        while True:
            while not self._takeable():
                await self._wait_for(1)
            waited = False
            if self._worth_waiting():
                oldest = min(q[0].enqueued for q in (*self._levels, self._delayed) if q)
                close_at = oldest + self.policy.max_queue_delay_s
                queued = self._takeable()
                if queued < self.policy.dispatch_size and close_at > self._loop.time():
                    await self._wait_until(close_at, self.policy.dispatch_size)
                    self._waited(grew=self._takeable() > queued)
                    waited = True
            elif self._busy_lately():  # but waits lately did not pay
                self._waits_skipped += 1
            batch = self._take()
            if batch:
                return batch, waited

    def _worth_waiting(self) -> bool:
        """Whether waiting out the window can grow the batch to good effect: while a batch runs
        (requests queue behind it anyway), or when the devices have just stopped, idle for less
        time than the last batch ran (over half busy lately: arrivals come quickly and running
        them one by one would cost throughput) and such waits lately grew batches. Otherwise
        waiting only delays the request: one client on a device slower than its round trip
        keeps the devices busy lately, yet no other request comes within the window."""
        return bool(self._running) or self.policy.delay_when_idle or (
            self._busy_lately() and (self._waits_paid > _PAID_MIN
                                     or self._waits_skipped >= _PROBE_EVERY - 1))

    def _busy_lately(self) -> bool:
        return self._loop.time() - self._idle_since < self._last_run_s

    def _waited(self, grew: bool) -> None:
        self._waits_skipped = 0
        self._waits_paid += _PAID_WEIGHT * (grew - self._waits_paid)

    async def _wait_until(self, deadline: float, samples: int) -> None:
        """Until `samples` are queued or the loop's clock reaches `deadline`, to the
        microsecond (PreciseTimer: asyncio's own timers wake up to a millisecond late)."""
        self._timer.arm(deadline)
        try:
            await self._wait_for(samples)
        finally:
            self._timer.disarm()
            self._window_open = True

    def _close_window(self) -> None:
        self._window_open = False
        self._arrived.set()

    async def _wait_for(self, samples: int) -> None:
        """Until `samples` are queued (or an open window closes); submit wakes this only then,
        not on every arrival."""
        self._wanted = samples
        while self._takeable() < samples and self._window_open:
            self._arrived.clear()
            await self._arrived.wait()

    def _take(self) -> list[_Pending]:
        """Highest priority first, FIFO within a level, delayed requests last."""
        limit = self._limit()
        now = self._loop.time()
        batch: list[_Pending] = []
        total = 0
        for level, queue in (*enumerate(self._levels), (None, self._delayed)):
            if level is not None and self._budget is not None and self._budget.holds(level):
                continue
            while queue:
                pending = queue[0]
                # A request answered, cancelled or expired leaves the counts now, not when its
                # future's callbacks run: counts above what the queues hold would spin
                # _next_batch (a request whose deadline passed before its batch formed).
                if pending.taken or pending.future.done():  # answered or cancelled
                    self._leave(queue.popleft())
                    continue
                if pending.expires is not None and now >= pending.expires:
                    queue.popleft()
                    self._expire(pending)
                    self._leave(pending)
                    continue
                if (queue is not self._delayed and pending.delay_after is not None
                        and now >= pending.delay_after):
                    pending.delayed = True
                    self._queued_delayed[pending.level] += pending.size
                    self._delayed.append(queue.popleft())
                    continue
                if batch and (total + pending.size > limit or not self.policy.batching):
                    return batch
                queue.popleft()
                self._leave(pending)
                batch.append(pending)
                total += pending.size
        return batch

    def _limit(self) -> int:
        """The samples the next batch may take: up to max_batch_size, as many as the device
        that would run it runs fastest per sample."""
        most = max(self.policy.max_batch_size, 1)
        queued = min(self._takeable(), most)
        devices = self._ranking.candidates(queued) if queued > 1 else ()
        return devices[0].batch_size_for(queued) if devices else most

    def _batch(self, pending: list[_Pending]) -> Batch:
        """The requests' batch; one whose inputs cannot be read (its client's shared memory
        shrank) is answered with the reason, from whichever thread assembles the batch."""
        loop_thread = threading.get_ident()

        def failed(i: int, error: HetserveError) -> None:
            if threading.get_ident() == loop_thread:
                settle(pending[i].future, error=error)
            else:
                self._loop.call_soon_threadsafe(settle, pending[i].future, None, error)
        return self._buffers.batch([p.inputs for p in pending], sum(p.size for p in pending),
                                   failed)

    def _begin(self, pending: list[_Pending], waited: bool) -> None:
        """Hands the batch of `pending` (`waited`: after its window) to its first device's
        instance thread at once (on the loop's thread it would keep the loop from reading the
        requests that came with it or behind it). This runs in the dispatcher's turn of
        the loop, which the freed slot of the previous batch schedules ahead of that batch's
        replies: the device gets its next batch before the replies are sent."""
        batch = self._batch(pending)
        # A lone request that found nothing else queued or running, taken at once: its time
        # until its answer, less the device's work, is what running it inline would save.
        alone = len(pending) == 1 and not waited and not self._running and not self.queued()
        since = pending[0].enqueued if alone else None
        run = _Run(pending, batch, time.monotonic(), list(self._ranking.candidates(batch.size)),
                   since)
        if run.devices:
            run.devices[0].submit(batch, self._outputs, batch.size,
                                  functools.partial(self._answered, run), since)
        self._running.add(run)
        self._none_running.clear()
        if not run.devices:
            self._fail_over(run, None)

    def _answered(self, run: _Run, answer: Answer | None, error: BaseException | None) -> None:
        """The first device's answer to a batch, on the loop's thread as it comes: the replies
        leave in this call, with no task between (each would cost another iteration of the
        loop); a failure goes on to the next devices (_fail_over)."""
        if error is not None:
            self._fail_over(run, error)
            return
        assert answer is not None
        run.batch.release()
        self._slots.release()
        try:
            self._ranking.succeeded(run.devices[0])
            self._answer(run.pending, answer, run.batch, run.started)
        except Exception as e:  # a bug: nobody may wait forever
            log.error("model %r: a batch could not be answered", self.model, exc_info=e)
            self._failed(run.pending, e)
        finally:
            # Ended after its callers resume, as a task's end would be: a request they send at
            # once comes while the batch still counts as running, in company, not alone.
            self._loop.call_soon(self._ended, run)

    def _fail_over(self, run: _Run, error: BaseException | None) -> None:
        """A batch its first device failed with `error` (None: it has no device) goes to the
        next devices, in a task of its own."""
        task = asyncio.create_task(self._run(run, error))
        self._failovers.add(task)
        task.add_done_callback(self._failed_over)

    def _failed_over(self, task: asyncio.Task) -> None:
        self._failovers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("model %r: a batch failed unexpectedly", self.model,
                      exc_info=task.exception())

    async def _run(self, run: _Run, error: BaseException | None) -> None:
        """Finishes a batch whose first device failed it with `error`, and frees its slot once
        the devices are done with it, before its replies."""
        try:
            try:
                answer = await self._execute(run.batch, run.devices, error, run.since)
            finally:
                run.batch.release()
                self._slots.release()
            self._answer(run.pending, answer, run.batch, run.started)
        except _InputsRefused as e:
            if len(run.pending) == 1:
                settle(run.pending[0].future, error=e)
                return
            for request in run.pending:  # which request's inputs the devices refuse
                await self._alone(request)
        except HetserveError as e:
            self._failed(run.pending, e)
        except BaseException as e:
            self._failed(run.pending, e)
            raise
        finally:
            self._loop.call_soon(self._ended, run)

    async def _alone(self, request: _Pending) -> None:
        """One request of a batch the devices refused, run on its own."""
        started, batch = time.monotonic(), self._batch([request])
        try:
            try:
                answer = await self._execute(batch, list(self._ranking.candidates(batch.size)))
            finally:
                batch.release()
        except HetserveError as e:
            self._failed([request], e)
            return
        except BaseException as e:
            self._failed([request], e)
            raise
        self._answer([request], answer, batch, started)

    def _failed(self, pending: list[_Pending], error: BaseException) -> None:
        """Answers a batch that did not run: with its error, or, where it is a bug or the
        scheduler closing, unavailable (nobody may wait forever)."""
        for request in pending:
            settle(request.future, error=error if isinstance(error, HetserveError) else
                   ModelUnavailableError(f"model {self.model!r}: the batch was not run to "
                                         "the end"))

    async def _execute(self, batch: Batch, devices: list[Device],
                       first_error: BaseException | None = None,
                       since: float | None = None) -> Answer:
        """The batch's answer from the first of `devices` (the ranking's order) that runs it;
        `first_error`: what the first device failed it with, where it ran there already;
        `since`: Device.run's. A device that failed it is blamed (ranking.failed) only once the
        batch is not found at fault: a later device that refuses the inputs clears the earlier
        ones (a device never measured, on trial, has no sample of its own to tell)."""
        failed: list[tuple[Device, DeviceError]] = []
        size = batch.size
        for i, device in enumerate(devices):
            try:
                if i == 0 and first_error is not None:
                    raise first_error
                answer = await device.run(batch, self._outputs, size, since)
            except DeviceError as e:
                if await self._runs_what_it_ran(device):
                    shapes = {n: list(a.shape) for n, a in batch.inputs().items()}
                    raise _InputsRefused(
                        f"inputs {shapes}: model {self.model!r} cannot run them, though its "
                        f"device runs the inputs it ran before: {e}") from None
                failed.append((device, e))
                continue
            for culprit, error in failed:
                self._ranking.failed(culprit, batch, error)
            self._ranking.succeeded(device)
            return answer
        for culprit, error in failed:
            self._ranking.failed(culprit, batch, error)
        raise DeviceError(f"model {self.model!r}: every device failed the batch: "
                          + "; ".join(str(e) for _, e in failed))

    async def _runs_what_it_ran(self, device: Device) -> bool:
        """Whether `device` still runs a sample it ran before: then a batch it failed failed
        for its inputs (too small for the model's kernels, say), which is no fault of the
        device's; it stays healthy and the request gets INVALID_ARGUMENT."""
        sample = device.known_good
        if sample is None:
            return False
        try:
            await device.run(Batch.of(sample, 1), self._outputs, 1)
        except DeviceError:
            return False
        return True

    def _answer(self, batch: list[_Pending], answer: Answer, run: Batch, started: float) -> None:
        """Answers a batch's requests with their rows of `answer`, and records the batch
        (`started`: time.monotonic() when it left the queue)."""
        ran = time.monotonic()
        self._last_run_s = ran - started
        total = run.size
        for pending in batch:
            self._observe_queue_s(started - pending.enqueued)
        self._stats.queue.add(sum(started - p.enqueued for p in batch), len(batch))
        if len(batch) == 1:  # nothing to split (and unbatched models have no batch axis)
            settle(batch[0].future, result=answer)
        else:
            offset = 0
            for pending in batch:
                settle(pending.future, result=Answer(
                    {name: array[offset:offset + pending.size]
                     for name, array in answer.outputs.items()},
                    answer.device, answer.cost.share(pending.size, total)))
                offset += pending.size
        self._stats.record_batch(len(batch), total, run.assembly_s,
                                 ran - started - run.assembly_s, time.monotonic() - ran)


def _runs_inline(device: Device, size: int) -> bool:
    """Whether a batch costs the event loop less run on its thread than handed to the device's
    instance threads: the device healthy and idle, and the batch's measured time below the
    hand-off's, measured while nothing else waited on the loop. Any longer batch runs on a
    thread, so that the loop goes on reading the requests that come meanwhile and they can form
    the next batch; a rule on the batch's time alone would lock batching off wherever a batch
    takes a little longer than that time."""
    if not (device.healthy and device.idle):
        return False
    handoff_s, batch_s = device.handoff_s, device.expected_batch_s(size)
    return handoff_s is not None and batch_s is not None and batch_s < handoff_s
