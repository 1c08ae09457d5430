"""Energy of a device shared by two engines (ONNX Runtime CUDA and OpenCL on one GPU), charged to
each engine by its batches; the CPU estimate scaled from the CPU count."""

from __future__ import annotations

import pytest

from accelerators.engine import Device
from accelerators.power.meter import DeviceMeter
from accelerators.power.model import ModelEstimate
from accelerators.power.select import SourcePicker, cpu_model_watts

GPU = Device("gpu0", "gpu", "onnxruntime")


def test_a_shared_devices_energy_is_split_between_engines_by_busy_time() -> None:
    meter = DeviceMeter(GPU, ModelEstimate(50.0, 250.0))
    meter.add_model("m", "onnxruntime")
    meter.add_model("m", "opencl")
    meter.sample(0.0)
    meter.charge("m", 0.1, "onnxruntime")
    meter.charge("m", 0.3, "opencl")
    meter.sample(1.0)  # 40% busy: 50 + 0.4 × 200 = 130 J, 100 J of it in the batches' runs
    reading = meter.read()
    assert reading.energy_j == pytest.approx(130.0)
    assert reading.engine_energy_j == {"onnxruntime": pytest.approx(25.0),
                                       "opencl": pytest.approx(75.0)}
    assert reading.model_energy_j == {"m": pytest.approx(100.0)}


def test_the_cpu_estimate_scales_with_the_cpus_and_stays_an_estimate() -> None:
    assert cpu_model_watts(2) == (12.0, 26.0)
    assert cpu_model_watts(32) == (42.0, 116.0)
    source = SourcePicker("cpu=model").pick(Device("cpu0", "cpu", "onnxruntime"))
    assert source.source == "model"
    assert (source.idle_w, source.busy_w) == cpu_model_watts()
    configured = SourcePicker("cpu=model", "cpu=10:65").pick(Device("cpu0", "cpu", "x"))
    assert (configured.idle_w, configured.busy_w) == (10.0, 65.0)
