"""Routing policies over real device runners (the faulty test engine as fpga0, ONNX Runtime as
cpu0); measured speeds are set by hand where a policy's choice depends on them."""

from __future__ import annotations

import asyncio

import pytest

from accelerators.engine_factory import DeviceSpec
from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from accelerators.power.meter import PowerMonitor
from accelerators.power.model import ModelEstimate
from service.core.device_runner import DeviceRunner
from service.core.metrics import Metrics
from service.core.router import Router
from tests.conftest import MODEL, MODELS
from tests.service.faulty_engine import CONTROL_ENV, FaultyEngine


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


def _router(workers, policy: str, budget_s: float = 0.1) -> Router:
    return Router(MODEL, workers, policy, budget_s, ["logits"], Metrics())


def _measured(worker: DeviceRunner, seconds_per_sample: float, pending: int = 0) -> None:
    worker.seconds_per_sample = seconds_per_sample
    worker.pending_samples = pending


def test_prefer_keeps_the_order_and_spills_past_the_budget(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 1e-3)
    _measured(cpu, 1e-4)
    router = _router(workers, "prefer")
    assert router.candidates(8) == [fpga, cpu]
    _measured(fpga, 1e-3, pending=200)  # 0.2 s of work queued: past the 0.1 s budget
    assert router.candidates(8) == [cpu, fpga]


def test_latency_picks_the_earliest_completion(workers) -> None:
    fpga, cpu = workers
    _measured(fpga, 1e-3)
    _measured(cpu, 1e-4, pending=50)
    assert _router(workers, "latency").candidates(8) == [cpu, fpga]
    _measured(cpu, 1e-4, pending=500)
    assert _router(workers, "latency").candidates(8) == [fpga, cpu]


def test_efficiency_picks_the_fewest_joules_within_the_budget(workers) -> None:
    fpga, cpu = workers  # estimated busy power (the fixture's): fpga 25 W, cpu 65 W
    _measured(fpga, 2e-4)
    _measured(cpu, 1e-4)
    assert fpga.meter.source.source == "model"
    assert fpga.joules_per_inference() == pytest.approx(25 * 2e-4)
    router = _router(workers, "efficiency")
    assert router.candidates(8) == [fpga, cpu]  # 5 mJ against 6.5 mJ
    _measured(fpga, 2e-4, pending=1000)  # fpga cannot meet the budget now
    assert router.candidates(8) == [cpu, fpga]


def test_efficiency_ranks_an_emulator_without_figures_of_its_own_last(workers) -> None:
    fpga, cpu = workers
    fpga.meter.source = ModelEstimate(0.0, 1.0, "an emulated FPGA", priced=False)
    _measured(fpga, 1e-4)  # cheaper on its borrowed figures, and faster
    _measured(cpu, 2e-4)
    assert fpga.joules_per_inference() < cpu.joules_per_inference()
    assert _router(workers, "efficiency").candidates(8) == [cpu, fpga]


def test_a_failed_device_goes_last_until_a_probe_succeeds(workers, tmp_path, holdout) -> None:
    fpga, cpu = workers
    control = tmp_path / "control.json"
    images = {"image": holdout[0][:2]}

    async def main():
        router = _router(workers, "prefer")
        control.write_text('{"fail": true}')
        result = await router.run(images, 2)
        assert not fpga.healthy and router.candidates(2) == [cpu, fpga]
        control.write_text('{"fail": false}')
        for _ in range(40):
            await asyncio.sleep(0.1)
            if fpga.healthy:
                break
        await router.close()
        return result
    result = asyncio.run(main())
    assert result.outputs["logits"].shape == (2, 10) and fpga.healthy
    assert result.device == "cpu0"  # the batch that fpga0 failed ran on cpu0


def test_run_now_runs_on_this_thread_only_when_the_first_choice_is_idle_and_quick(
        workers, holdout) -> None:
    fpga, cpu = workers
    images = {"image": holdout[0][:1]}

    async def main():
        router = _router(workers, "prefer")
        answers = {"unmeasured": router.run_now(images, 1)}
        _measured(fpga, 0.0001, pending=1)
        answers["busy"] = router.run_now(images, 1)
        _measured(fpga, 0.01)
        answers["slow"] = router.run_now(images, 1)
        _measured(fpga, 0.0001)
        answers["idle and quick"] = router.run_now(images, 1)
        await router.close()
        return answers
    answers = asyncio.run(main())
    assert answers["unmeasured"] is answers["busy"] is answers["slow"] is None
    assert answers["idle and quick"].device == "fpga0"
    assert answers["idle and quick"].outputs["logits"].shape == (1, 10)


def test_a_device_that_fails_a_run_now_is_marked_failed_and_run_uses_the_next(
        workers, tmp_path, holdout) -> None:
    fpga, cpu = workers
    images = {"image": holdout[0][:1]}

    async def main():
        router = _router(workers, "prefer")
        (tmp_path / "control.json").write_text('{"fail": true}')
        _measured(fpga, 0.0001)
        now = router.run_now(images, 1)
        healthy = fpga.healthy
        result = await router.run(images, 1)
        await router.close()
        return now, healthy, result
    now, healthy, result = asyncio.run(main())
    assert now is None and not healthy and result.device == "cpu0"
