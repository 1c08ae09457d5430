"""Ranking policies over real device runners (the faulty test engine as fpga0, ONNX Runtime as
cpu0); measured speeds are set by hand where a policy's choice depends on them."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from accelerators.engine_factory import DeviceSpec
from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from accelerators.power.meter import PowerMonitor
from accelerators.power.model import ModelEstimate
from service.core import slow_devices
from service.core.batch_buffers import Batch, BatchBuffers
from service.core.buckets import Buckets
from service.core.device_runner import BatchTimes, DeviceRunner
from service.core.metrics import Metrics
from service.core.model_settings import parse_batch_policy
from service.core.ranking import DeviceRanking
from service.core.scheduler import Scheduler
from service.core.statistics import ModelStatistics
from tests.support.daemon import MODEL, MODELS
from tests.support.faulty_engine import CONTROL_ENV, FaultyEngine


@pytest.fixture
def workers(tmp_path, monkeypatch):
    monkeypatch.setenv(CONTROL_ENV, str(tmp_path / "control.json"))
    path = MODELS / MODEL / "1" / "model.onnx"
    metrics = Metrics(PowerMonitor(model_watts="fpga=5:25,cpu=10:65"))  # no sensor here
    made = [DeviceRunner(MODEL, [FaultyEngine(DeviceSpec("faulty", "fpga0"), path, 1)], metrics),
            DeviceRunner(MODEL, [OnnxRuntimeEngine(path, 1, use_gpu=False)], metrics)]
    yield made
    for w in made:
        w.close()


def _ranking(workers, policy: str, budget_s: float = 0.1, metrics: Metrics | None = None,
             prefer_order: str = "measured") -> DeviceRanking:
    return DeviceRanking(MODEL, workers, policy, budget_s, ["logits"], metrics or Metrics(),
                         prefer_order=prefer_order)


def _measured(worker: DeviceRunner, seconds_per_sample: float, pending: int = 0,
              batches: int = slow_devices.TRIAL_BATCHES) -> None:
    """As if its `batches` took `seconds_per_sample` per sample, with `pending` samples queued
    (by default past its trial)."""
    worker.seconds_per_sample = seconds_per_sample
    worker.times = BatchTimes()
    for _ in range(batches):
        worker.times.observe(1, seconds_per_sample)
    worker.pending_samples = pending


def test_prefer_keeps_the_order_and_spills_past_the_budget(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 2e-4)  # twice cpu0's time per sample: not much slower
    _measured(cpu, 1e-4)
    ranking = _ranking(workers, "prefer")
    assert ranking.candidates(8) == [fpga, cpu]
    _measured(fpga, 2e-4, pending=1000)  # 0.2 s of work queued: past the 0.1 s budget
    assert ranking.candidates(8) == [cpu, fpga]


def test_prefer_ranks_a_much_slower_device_last_until_it_measures_faster(
        workers, caplog) -> None:
    fpga, cpu = workers
    metrics = Metrics()
    ranking = _ranking(workers, "prefer", metrics=metrics)
    demoted = metrics.device_demoted.labels(MODEL, "fpga0", "faulty")
    _measured(fpga, 4e-4)
    _measured(cpu, 1e-4)  # 4 times: not much slower
    assert ranking.candidates(8) == [fpga, cpu] and demoted._value.get() == 0
    caplog.set_level("INFO", "service.core.slow_devices")
    _measured(fpga, 5e-4)
    assert ranking.candidates(8) == ranking.candidates(8) == [cpu, fpga]
    assert demoted._value.get() == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"model {MODEL!r}: faulty:fpga0 is 5.0 times slower per sample than onnxruntime:cpu0: "
        "ranked after the faster devices (still a failover target), re-measured every 30 s"]
    cpu.mark_failed()
    assert ranking.candidates(8) == [fpga, cpu]  # the failover target
    cpu.mark_healthy()
    # Its re-measure is due: it takes the next batch in its place; still slow when measured,
    # it goes last again, without a word.
    fpga.times.observed_at -= slow_devices.REMEASURE_EVERY_S
    assert ranking.candidates(8) == [fpga, cpu]
    _measured(fpga, 6e-4)
    assert ranking.candidates(8) == [cpu, fpga] and len(caplog.records) == 1
    _measured(fpga, 2e-4)  # faster now: back first, said once
    assert ranking.candidates(8) == ranking.candidates(8) == [fpga, cpu]
    assert demoted._value.get() == 0 and len(caplog.records) == 2
    assert "faulty:fpga0 is no longer much slower than onnxruntime:cpu0 (2.0 times per " \
        "sample)" in caplog.records[1].getMessage()


def test_an_idle_unmeasured_device_takes_one_batch_first_once_another_is_measured(
        workers) -> None:
    """Under light load only the first device would run: the others are tried, one batch at a
    time, so that a much slower first device is found out; never with prefer_order strict."""
    fpga, cpu = workers
    ranking, strict = _ranking(workers, "prefer"), _ranking(workers, "prefer",
                                                            prefer_order="strict")
    assert ranking.candidates(1) == [fpga, cpu]  # nothing measured: the configured order
    _measured(fpga, 1e-3)
    assert ranking.candidates(1) == [cpu, fpga] and strict.candidates(1) == [fpga, cpu]
    cpu.pending_samples = 1  # its trial batch runs: the next ones go to the measured device
    assert ranking.candidates(1) == [fpga, cpu]
    _measured(cpu, 1e-4)  # measured ten times faster: fpga0 goes last
    assert ranking.candidates(1) == [cpu, fpga]
    _measured(cpu, 5e-4)  # twice as fast only: the configured order again
    assert ranking.candidates(1) == [fpga, cpu]


def test_one_slow_batch_of_the_faster_device_does_not_keep_a_much_slower_one_first(
        workers) -> None:
    """A device is judged by its best recent batches, and tried until it has run a few: its
    first batch may have shared the CPU with an emulator (0.8 s against 5 ms, seen on 2 vCPUs)."""
    fpga, cpu = workers
    metrics = Metrics()
    ranking = _ranking(workers, "prefer", metrics=metrics)
    _measured(fpga, 1e-3)
    _measured(cpu, 1e-2, batches=1)  # ten times slower than fpga0 the first time: not demoted
    assert ranking.candidates(1) == [cpu, fpga]  # on trial still
    assert metrics.device_demoted.labels(MODEL, "cpu0", "onnxruntime")._value.get() == 0
    cpu.times.observe(1, 1e-4)  # then ten times faster: fpga0 is found out
    assert ranking.candidates(1) == [cpu, fpga]
    assert metrics.device_demoted.labels(MODEL, "fpga0", "faulty")._value.get() == 1
    cpu.times.observe(1, 1e-2)  # and a slow batch again does not bring it back
    assert ranking.candidates(1) == ranking.candidates(1) == [cpu, fpga]


def test_the_least_tried_device_is_tried_first(workers) -> None:
    fpga, cpu = workers
    ranking = _ranking(workers, "prefer")
    _measured(fpga, 1e-3, batches=1)
    assert ranking.candidates(1) == [cpu, fpga]  # not run yet, and another is measured
    _measured(cpu, 1e-3, batches=1)
    assert ranking.candidates(1) == [fpga, cpu]  # a tie: the configured order
    fpga.times.observe(1, 1e-3)
    assert ranking.candidates(1) == [cpu, fpga]
    cpu.times.observe(1, 1e-3)
    fpga.times.observe(1, 1e-3)
    cpu.times.observe(1, 1e-3)  # both past their trial: the configured order
    assert ranking.candidates(1) == ranking.candidates(1) == [fpga, cpu]


def test_devices_are_compared_at_a_batch_size_both_ran(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 1e-3)  # batches of one only (as a probe's)
    _measured(cpu, 1e-4)
    cpu.times = BatchTimes()
    for _ in range(slow_devices.TRIAL_BATCHES):  # ten times faster per sample, but on batches
        cpu.times.observe(8, 8 * 1e-4)  # of eight
    ranking = _ranking(workers, "prefer")
    assert ranking.candidates(8) == [fpga, cpu]  # at one sample, cpu0's is a batch of eight
    cpu.times.observe(1, 2e-4)
    assert ranking.candidates(8) == [cpu, fpga]  # five times slower at one sample


def test_a_strict_prefer_order_keeps_a_much_slower_device_first(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 1e-2)
    _measured(cpu, 1e-4)
    assert _ranking(workers, "prefer", prefer_order="strict").candidates(8) == [fpga, cpu]
    assert _ranking(workers, "prefer").candidates(8) == [cpu, fpga]


def test_latency_picks_the_earliest_completion(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 1e-3)
    _measured(cpu, 1e-4, pending=50)
    assert _ranking(workers, "latency").candidates(8) == [cpu, fpga]
    _measured(cpu, 1e-4, pending=500)
    assert _ranking(workers, "latency").candidates(8) == [fpga, cpu]


def test_efficiency_picks_the_fewest_joules_within_the_budget(workers) -> None:
    fpga, cpu = workers  # estimated busy power (the fixture's): fpga 25 W, cpu 65 W
    _measured(fpga, 2e-4)
    _measured(cpu, 1e-4)
    assert fpga.meter.source.source == "model"
    assert fpga.joules_per_inference() == pytest.approx(25 * 2e-4)
    ranking = _ranking(workers, "efficiency")
    assert ranking.candidates(8) == [fpga, cpu]  # 5 mJ against 6.5 mJ
    _measured(fpga, 2e-4, pending=1000)  # fpga cannot meet the budget now
    assert ranking.candidates(8) == [cpu, fpga]


def test_efficiency_ranks_an_emulator_without_figures_of_its_own_last(workers) -> None:
    fpga, cpu = workers
    fpga.meter.source = ModelEstimate(0.0, 1.0, "an emulated FPGA", priced=False)
    _measured(fpga, 1e-4)  # cheaper on its borrowed figures, and faster
    _measured(cpu, 2e-4)
    assert fpga.joules_per_inference() < cpu.joules_per_inference()
    assert _ranking(workers, "efficiency").candidates(8) == [cpu, fpga]


def _scheduler(ranking: DeviceRanking) -> Scheduler:
    config = text_format.Parse("max_batch_size: 8", model_config_pb2.ModelConfig())
    buffers = BatchBuffers({"image": ((1, 28, 28), np.dtype(np.float32))}, 8, 1)
    return Scheduler(MODEL, parse_batch_policy(config, 64), ranking, ["logits"], 1,
                     buffers, ModelStatistics(), lambda s: None, lambda: None)


def test_a_failed_device_goes_last_until_a_probe_succeeds(workers, tmp_path, holdout) -> None:
    fpga, cpu = workers
    control = tmp_path / "control.json"
    images = {"image": holdout[0][:2]}

    async def main():
        ranking = _ranking(workers, "prefer")
        scheduler = _scheduler(ranking)
        control.write_text('{"fail": true}')
        result = await scheduler.submit(images, 2)
        assert not fpga.healthy and ranking.candidates(2) == [cpu, fpga]
        control.write_text('{"fail": false}')
        for _ in range(40):
            await asyncio.sleep(0.1)
            if fpga.healthy:
                break
        await scheduler.close()
        return result
    result = asyncio.run(main())
    assert result.outputs["logits"].shape == (2, 10) and fpga.healthy
    assert result.device == "onnxruntime:cpu0"  # the batch that fpga0 failed ran on cpu0


def test_a_runner_measures_its_batch_times_and_a_lone_requests_hand_off(workers, holdout) -> None:
    fpga, cpu = workers
    images = {"image": holdout[0][:4]}

    async def main():
        before = (cpu.expected_batch_s(4), cpu.handoff_s, cpu.expected_completion_s(4))
        running = asyncio.ensure_future(cpu.run(Batch.of(images, 4), ["logits"], 4))
        await asyncio.sleep(0)  # handed over: unmeasured, it takes no more batches
        busy = cpu.expected_completion_s(4)
        answer = await running  # others were waiting on the loop: its hand-off is not its own
        unmeasured = cpu.handoff_s
        await cpu.run(Batch.of(images, 4), ["logits"], 4, since=time.monotonic())
        return before, busy, answer, unmeasured
    (batch_s, handoff_s, first), busy, answer, unmeasured = asyncio.run(main())
    assert batch_s is None and handoff_s is None and first == 0.0 and busy == float("inf")
    assert answer.outputs["logits"].shape == (4, 10) and unmeasured is None
    assert cpu.handoff_s is not None and cpu.handoff_s > 0
    assert 0 < cpu.expected_batch_s(1) <= cpu.expected_batch_s(4) < cpu.expected_batch_s(8)


def test_a_device_that_fails_an_inline_batch_is_marked_failed_and_the_next_runs_it(
        workers, tmp_path, holdout) -> None:
    """The queue runs the batch again, so that a fault of the inputs is not the device's; this
    one is the device's, which fails it again and is blamed."""
    fpga, cpu = workers
    images = {"image": holdout[0][:1]}

    async def main():
        ranking = _ranking(workers, "prefer")
        scheduler = _scheduler(ranking)
        (tmp_path / "control.json").write_text('{"fail": true}')
        _measured(fpga, 0.0001)
        _measured(cpu, 0.0001)  # measured too: an unmeasured device would be tried first
        fpga._handoffs.append(1.0)  # so that its quick batch runs inline
        answer = scheduler.enqueue(images, 1)
        queued = fpga.healthy and not answer.done()  # failed inline, queued unblamed
        result = await answer
        await scheduler.close()
        return queued, result
    queued, result = asyncio.run(main())
    assert queued and not fpga.healthy and result.device == "onnxruntime:cpu0"


# ResNet-50 on an H200 (bench/curves/h200_resnet50.curve): seconds per batch by bucket.
H200 = {1: 0.001715, 2: 0.00173, 4: 0.001754, 8: 0.0025, 16: 0.004015, 32: 0.007702,
        64: 0.015213}


def test_a_bucketed_device_cuts_a_batch_where_padding_up_would_waste_time() -> None:
    """Batches of 33-40 padded up to 64 took twice 32's time on an H200: the batch is cut at the
    bucket that runs the most samples per second, and a device without buckets takes all."""
    path = MODELS / MODEL / "1" / "model.onnx"
    metrics = Metrics(PowerMonitor(model_watts="cpu=10:65"))
    bucketed = DeviceRunner(MODEL, [OnnxRuntimeEngine(path, 1, use_gpu=False)], metrics,
                            buckets=Buckets(tuple(H200)))
    plain = DeviceRunner(MODEL, [OnnxRuntimeEngine(path, 1, use_gpu=False)], metrics)
    try:
        assert bucketed.batch_size_for(40) == 40  # nothing measured: no cut
        bucketed.times.observe(1, H200[1])
        assert bucketed.batch_size_for(15) == 15  # only batches of one ran: no cut on a guess
        for rows, seconds in H200.items():
            bucketed.times.observe(rows, seconds)
            plain.times.observe(rows, seconds)
        assert [bucketed.batch_size_for(n) for n in (64, 60, 33, 32, 20, 9, 3, 1)] == \
            [64, 32, 32, 32, 16, 8, 3, 1]
        assert bucketed.expected_batch_s(33) == H200[64]
        assert [plain.batch_size_for(n) for n in (64, 33, 3)] == [64, 33, 3]
    finally:
        bucketed.close()
        plain.close()
