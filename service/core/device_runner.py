"""A device runner: the executor of one model's batches on one device. It runs them on one or
more engine instances (config.pbtxt's instance_group count), each in its own thread (engines
release the GIL), or on the caller's thread (run_inline: the scheduler's choice, by the times
measured here); meters them; and keeps what the scheduler and the ranking need: batch times by
size, the hand-off's cost, joules per inference, and health with backoff. A runner with buckets
hands its engines bucket shapes only (service.core.buckets), and warms every instance on every
warm-up batch (an FPGA: runs the first, plans the others) before the model is READY."""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from accelerators.engine import Engine, PreparesPlans, ReportsPlans
from accelerators.flops import FlopCounter
from service import contract
from service.core.batch_buffers import Batch
from service.core.buckets import Buckets
from service.core.metrics import Metrics
from service.core.types import Answer, Cost, Finished, Tensors, settle
from service.core.warmup import WarmupBatch
from service.errors import DeviceError

log = logging.getLogger(__name__)
_SMOOTHING = 0.2  # weight of the newest batch in a size's time average
_RECENT = 8  # the latest batches of a size whose best time tells what the device can do
_BACKOFF_S = (0.5, 30.0)  # first and longest wait before probing a failed device again
_HANDOFFS = 15  # the latest hand-offs measured, whose median is the hand-off's cost
_CUT_GAIN = 1.05  # a smaller bucket's samples per second over the whole batch's, to cut at it


class BatchTimes:
    """Seconds per batch by the rows it ran (a bucketed device's padding included), from the
    batches a device ran: averaged (what the next batch will likely take), and the best of the
    latest few (what the device can do: a neighbour's load, a cold start or another device
    sharing its CPU only ever slow a batch down). A size not run yet is estimated from the next
    larger one run (a batch takes no longer than a larger one), or scaled up from the largest."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}
        self._recent: dict[int, deque[float]] = {}
        self._sizes: list[int] = []  # sorted
        self.batches = 0
        self.observed_at = -math.inf  # time.monotonic() of the latest batch

    def observe(self, size: int, seconds: float) -> None:
        previous = self._seconds.get(size)
        if previous is None:  # the time first: a size listed is one the estimate can read
            self._seconds[size] = seconds
            self._recent[size] = deque(maxlen=_RECENT)
            bisect.insort(self._sizes, size)
        else:
            self._seconds[size] = previous + _SMOOTHING * (seconds - previous)
        self._recent[size].append(seconds)
        self.batches += 1
        self.observed_at = time.monotonic()

    @property
    def largest(self) -> int:
        """The largest size run; 0 before any."""
        return self._sizes[-1] if self._sizes else 0

    def measured(self, size: int) -> float | None:
        """The average of batches of exactly `size`; None if none ran."""
        return self._seconds.get(size)

    def estimate(self, size: float, best: bool = False) -> float | None:
        """The average (`best`: the best of the latest) at `size`; None before any batch ran."""
        if not self._sizes:
            return None
        at = bisect.bisect_left(self._sizes, size)
        ran = self._sizes[min(at, len(self._sizes) - 1)]
        seconds = min(self._recent[ran]) if best else self._seconds[ran]
        return seconds if at < len(self._sizes) else seconds * size / ran


class DeviceRunner:
    def __init__(self, model: str, engines: list[Engine], metrics: Metrics,
                 flops: FlopCounter | None = None, buckets: Buckets | None = None,
                 version: str = "") -> None:
        """`flops`: the model's count per sample; a partial one labels its FLOPs `partial`.
        `version`: the model version, a label of the series Triton has per version."""
        self.model = model
        self.buckets = buckets
        self.instances = len(engines)
        self.device = engines[0].device
        self._reply_device = contract.reply_device(self.device.engine, self.device.name,
                                                    self.device.emulated)
        # One thread per instance: engines are not re-entrant, and they release the GIL. With
        # as many threads as engines, a thread always finds an idle engine to pop. Batches reach
        # them through one queue and come back through one wake-up of the event loop: half the
        # CPU of an executor's hand-off (measured: 36 against 70 µs per batch on 2 vCPUs).
        self._idle = list(engines)
        self._batches: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, daemon=True,
                                          name=f"{model}-{self.device.name}-{i}")
                         for i in range(self.instances)]
        for thread in self._threads:
            thread.start()
        labels = dict(model=model, device=self.device.name, kind=self.device.kind_label,
                      engine=self.device.engine)

        self._compute = metrics.compute_duration.labels(**labels, version=version)
        self._batch_size = metrics.batch_size.labels(**labels, version=version)
        self._inferences = metrics.inferences.labels(**labels, version=version)
        # One series per kind of count: the served shape's from the start, the other only once
        # a request shape (of a variable dim) makes one.
        self._flop_series = lambda partial: metrics.flops.labels(
            **labels, count="partial" if partial else "complete")
        served = flops is not None and flops.served.partial
        self._flops = {served: self._flop_series(served)}
        self._padding = metrics.padding.labels(**labels)
        for engine in engines:
            if isinstance(engine, ReportsPlans):
                engine.report_plans(lambda event, count: metrics.opencl_plans.labels(
                    **labels, event=event).inc(count))
        self._flop_counter = flops
        self.meter = metrics.power.meter(self.device)
        self.meter.add_model(model, self.device.engine)
        self._healthy_gauge = metrics.device_healthy.labels(**labels)
        self._healthy_gauge.set(1)
        self.pending_samples = 0  # queued or running on this runner
        self.seconds_per_sample: float | None = None  # averaged over every size: joules
        self.times = BatchTimes()
        self._running = 0  # batches handed to the instance threads and not answered yet
        self.known_good: Tensors | None = None  # a sample it has run (Scheduler's check)
        self._handoffs: deque[float] = deque(maxlen=_HANDOFFS)
        self.healthy = True
        self.retry_at = 0.0  # time.monotonic() when an unhealthy device may be probed
        self._backoff_s = _BACKOFF_S[0]

    @property
    def idle(self) -> bool:
        return not self.pending_samples

    @property
    def handoff_s(self) -> float | None:
        """What a lone request's batch costs, beyond the device's work on it, when it is queued
        and handed to an idle instance thread rather than run inline (the queue's wake-ups, the
        thread's, and the event loop's when the answer comes back): the median of the latest;
        None before one was measured."""
        return statistics.median(self._handoffs) if self._handoffs else None

    def expected_batch_s(self, size: int) -> float | None:
        return self.times.estimate(self.rows_for(size))

    def batch_size_for(self, queued: int) -> int:
        """How many of `queued` samples the next batch takes: all of them, unless a smaller
        bucket runs clearly more samples per second than they do padded up to theirs. On an
        H200, ResNet-50's batches of 33-40 were padded to 64 and took twice 32's time: now 32
        go, and the rest with the next batch. Measured buckets only: an estimate scaled from
        a smaller bucket would keep a device that ran batches of one cutting at one."""
        if self.buckets is None or (whole := self.times.measured(self.rows_for(queued))) is None:
            return queued
        best, best_rate = queued, _CUT_GAIN * queued / whole
        for size in self.buckets.sizes:
            seconds = self.times.measured(size) if size < queued else None
            if seconds is not None and size / seconds > best_rate:
                best, best_rate = size, size / seconds
        return best

    def expected_completion_s(self, size: int) -> float:
        """Seconds until a batch of `size` handed over now would be done, from measured speed
        (the instances share the samples already pending). An unmeasured device: 0 while idle
        (it gets tried), unbounded while its first batches run (a slow one must not collect
        every batch before its speed is known)."""
        batch_s = self.expected_batch_s(math.ceil(self.pending_samples / self.instances + size))
        if batch_s is None:
            return math.inf if self.pending_samples else 0.0
        return batch_s

    @property
    def priced(self) -> bool:
        """Whether routing by energy may rank the device by its watts (an emulator without
        figures of its own may not)."""
        return self.meter.source.priced

    def joules_per_inference(self) -> float | None:
        """The device's watts at full utilization (fitted from its sensor, or the `model`
        estimate's: see `self.meter.source`) times measured seconds per sample; None until both
        are known."""
        watts = self.meter.busy_power_w()
        if watts is None or self.seconds_per_sample is None:
            return None
        return watts * self.seconds_per_sample

    def rows_for(self, size: int) -> int:
        """The rows a batch of `size` runs as here: with its buckets' padding."""
        return self.buckets.rows(size) if self.buckets else size

    def submit(self, batch: Batch, outputs: list[str], size: int, done: Finished,
               since: float | None = None) -> None:
        """Hands the batch to an instance thread, which assembles its inputs first; `done(answer,
        None)` or `done(None, error)` (a DeviceError, or a BaseException other than an Exception
        as it is) is then called on the event loop's thread, in the first iteration after the
        thread's, with no future or task between: each would cost a lone request's reply another
        iteration. `since`: time.monotonic() when its lone request was queued, nothing else
        waiting on the event loop meanwhile: the hand-off is measured from then (on a busy loop
        the thread's answer waits its turn, which is no cost of handing over: an estimate that
        counted it would run long batches on the loop)."""
        loop = asyncio.get_running_loop()
        idle = self._running < self.instances  # else it waits for one: no hand-off measured
        self.pending_samples += size
        self._running += 1

        def finished(ran: tuple[Answer, float] | None, error: BaseException | None) -> None:
            self.pending_samples -= size
            self._running -= 1
            if ran is None:
                done(None, self._failure(size, error) if isinstance(error, Exception) else error)
                return
            answer, worked_s = ran
            if since is not None and idle:
                self._handoffs.append(time.monotonic() - since - worked_s)
            done(answer, None)
        self._batches.put((loop, finished, batch, outputs, size))

    async def run(self, batch: Batch, outputs: list[str], size: int,
                  since: float | None = None) -> Answer:
        """submit()'s answer, awaited."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.submit(batch, outputs, size, lambda answer, error: settle(future, answer, error),
                    since)
        return await future

    def run_inline(self, batch: Batch, outputs: list[str], size: int) -> Answer:
        """The batch's answer computed on the calling thread (DeviceError if it failed)."""
        try:
            answer, record = self._timed_run(batch, outputs, size)
        except Exception as e:
            raise self._failure(size, e) from e
        record()
        return answer

    def _failure(self, size: int, error: Exception) -> DeviceError:
        """The DeviceError a batch's failure becomes, caused by it."""
        failure = DeviceError(f"device {self.device.name} failed to run a batch of {size}: "
                              f"{type(error).__name__}: {error}")
        failure.__cause__ = error
        return failure

    def _serve(self) -> None:
        """An instance thread: runs batches until close(), each answer handed to its loop
        before the batch is recorded in the metrics, which its reply need not wait for."""
        while (batch := self._batches.get()) is not None:
            loop, finished, work, outputs, size = batch
            started = time.perf_counter()
            record = None
            try:  # the answer, and the thread's work on it (assembly included)
                answer, record = self._timed_run(work, outputs, size)
                ran, error = (answer, time.perf_counter() - started), None
            except BaseException as e:  # handed to the batch's caller, as an executor does
                ran, error = None, e
            try:
                loop.call_soon_threadsafe(finished, ran, error)
            except RuntimeError:  # the loop is closed: nobody waits for this batch
                pass
            if record is not None:
                try:
                    record()
                except Exception:  # a bug in the metering must not end the instance thread
                    log.exception("device %s: a batch could not be recorded", self.device.name)

    def _timed_run(self, batch: Batch, outputs: list[str],
                   size: int) -> tuple[Answer, Callable[[], None]]:
        """The batch's answer, its compute (not its assembly) timed and charged; and what
        records it in the metrics and the speed estimates, to be called once it is answered."""
        rows = self.rows_for(size)
        inputs = batch.inputs(rows)
        engine = self._idle.pop()  # atomic under the GIL, like the append below
        try:
            start = time.perf_counter()
            result, padding = self._run_on(engine, inputs, outputs, size)
            busy_s = time.perf_counter() - start
        finally:
            self._idle.append(engine)
        count = self._flop_counter.per_sample(inputs) if self._flop_counter else None
        flops = size * count.total if count else 0
        unknown = count.uncounted if count else ()
        joules = self.meter.charge(self.model, busy_s, self.device.engine)
        if self.known_good is None:
            self.known_good = batch.sample()

        def record() -> None:
            # Plain updates from the instance threads (a rare lost update of an average is
            # harmless); the scheduler and the ranking only read them.
            self.times.observe(rows, busy_s)
            sample_s = busy_s / size
            previous = self.seconds_per_sample
            self.seconds_per_sample = sample_s if previous is None else \
                previous + _SMOOTHING * (sample_s - previous)
            self._padding.inc(padding)
            self._compute.observe(busy_s)
            self._batch_size.observe(size)
            self._inferences.inc(size)
            partial = bool(unknown)  # the metric says partial; the op names go in the reply
            if partial not in self._flops:
                self._flops[partial] = self._flop_series(partial)
            self._flops[partial].inc(flops)
        return Answer(result, self._reply_device,
                      Cost(joules, self.meter.source.source, flops, unknown)), record

    def _run_on(self, engine: Engine, inputs: Tensors, outputs: list[str],
                size: int) -> tuple[Tensors, int]:
        """The outputs of a batch on one engine, and the padding rows it computed."""
        if self.buckets is None:
            return engine.run(inputs, outputs), 0
        return self.buckets.run(engine.run, inputs, outputs, size)

    def warm_up(self, batches: list[WarmupBatch], outputs: list[str]) -> None:
        """Runs every warm-up batch on every instance (blocking; before the model is READY).
        An FPGA's binary takes every size at run time, so a size's first-use cost is its plan:
        each instance runs the first batch once, which proves the device end to end, and builds
        the plans of the others without running them (an emulator would take minutes over the
        larger ones). Warm-up is not traffic: it counts in no metric and no speed estimate."""
        if self.device.kind == "fpga" and batches:
            for engine in self._idle:
                self._run_on(engine, batches[0].inputs, outputs, batches[0].size)
                for batch in batches[1:]:
                    if isinstance(engine, PreparesPlans):
                        engine.prepare(batch.size)
                    else:
                        self._run_on(engine, batch.inputs, outputs, batch.size)
            return
        for engine in self._idle:
            for batch in batches:
                for _ in range(batch.count):
                    self._run_on(engine, batch.inputs, outputs, batch.size)

    def mark_failed(self) -> None:
        """Unhealthy until a probe succeeds; each failed probe doubles the wait before the next."""
        if not self.healthy:
            self._backoff_s = min(self._backoff_s * 2, _BACKOFF_S[1])
        self.retry_at = time.monotonic() + self._backoff_s
        self.healthy = False
        self._healthy_gauge.set(0)

    def mark_healthy(self) -> None:
        self.healthy = True
        self._backoff_s = _BACKOFF_S[0]
        self._healthy_gauge.set(1)

    def close(self) -> None:
        """Lets the batches handed over finish, then ends the instance threads."""
        for _ in self._threads:
            self._batches.put(None)
        for thread in self._threads:
            thread.join()
