"""Device meters: busy time, utilization, energy attributed to models; source selection."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from accelerators.engine import Device
from accelerators.power.hwmon import HwmonPower
from accelerators.power.meter import DeviceMeter, PowerMonitor
from accelerators.power.model import ModelEstimate
from accelerators.power.select import SourcePicker, cpu_model_watts
from tests.support.sysfs import write

CPU = Device("cpu0", "cpu", "onnxruntime")


def test_each_batch_is_charged_its_run_time_at_full_load_watts() -> None:
    meter = DeviceMeter(CPU, ModelEstimate(10.0, 50.0))
    meter.add_model("idle_model")
    meter.sample(0.0)
    assert meter.charge("a", 0.3) == pytest.approx(15.0)  # 0.3 s at 50 W
    assert meter.charge("b", 0.1) == pytest.approx(5.0)
    meter.sample(1.0)  # 40% busy: 10 + 0.4 × 40 = 26 W for 1 s, 6 J of it idle
    reading = meter.read()
    assert (reading.up, reading.source, reading.power_w) == (True, "model", pytest.approx(26.0))
    assert reading.energy_j == pytest.approx(26.0)
    assert reading.busy_s == pytest.approx(0.4)
    assert reading.model_energy_j == {"idle_model": 0.0, "a": pytest.approx(15.0),
                                      "b": pytest.approx(5.0)}
    meter.sample(2.0)  # nothing ran: 10 J of idle energy, no model's
    reading = meter.read()
    assert reading.energy_j == pytest.approx(36.0)
    assert sum(reading.model_energy_j.values()) == pytest.approx(20.0)


def test_batches_side_by_side_share_the_devices_watts() -> None:
    meter = DeviceMeter(CPU, ModelEstimate(10.0, 50.0))
    meter.sample(0.0)
    meter.charge("a", 0.8)
    meter.charge("a", 0.8)
    meter.sample(1.0)  # two instances, 1.6 busy seconds in one: each batch gets 50 / 1.6 W
    assert meter.charge("a", 0.8) == pytest.approx(25.0)


def test_a_failing_sensor_turns_the_device_down_and_keeps_totals(tmp_path: Path) -> None:
    power = write(tmp_path / "power1_input", "20000000")
    meter = DeviceMeter(CPU, HwmonPower(power))
    meter.sample(0.0)
    meter.sample(1.0)
    power.unlink()
    meter.sample(2.0)
    reading = meter.read()
    assert (reading.up, reading.energy_j) == (False, pytest.approx(20.0))
    write(power, "20000000")
    meter.sample(3.0)
    assert meter.read().up


def test_busy_watts_for_routing_are_full_utilization_watts_from_either_source(
        tmp_path: Path) -> None:
    assert DeviceMeter(CPU, ModelEstimate(10.0, 50.0)).busy_power_w() == 50.0
    power = write(tmp_path / "power1_input", "30000000")
    meter = DeviceMeter(CPU, HwmonPower(power))
    meter.sample(0.0)
    assert meter.busy_power_w() is None  # nothing measured yet
    meter.charge("a", 0.5)
    meter.sample(1.0)  # 30 W while half busy: with nothing else known, power is taken as flat
    assert meter.busy_power_w() == pytest.approx(30.0)
    # A device drawing 20 W idle and 100 W flat out: the fit finds the 100 W, where energy per
    # busy second would charge the idle watts too (e.g. 40 W at a quarter busy: 160 W).
    meter = DeviceMeter(CPU, HwmonPower(power))
    meter.sample(1.0)
    for t, busy in enumerate([0.0, 0.25, 0.5, 1.0, 0.25, 0.75], start=2):
        write(power, str(int((20 + 80 * busy) * 1e6)))
        meter.charge("a", busy)
        meter.sample(float(t))
    assert meter.busy_power_w() == pytest.approx(100.0, rel=0.01)


def test_configured_sources_and_estimates() -> None:
    picker = SourcePicker("cpu=model,gpu0=hwmon:/nonexistent", "cpu=5:15,gpu=1:2")
    cpu = picker.pick(CPU)
    assert isinstance(cpu, ModelEstimate) and (cpu.idle_w, cpu.busy_w) == (5.0, 15.0)
    gpu = picker.pick(Device("gpu0", "gpu", "onnxruntime"))  # configured sensor unreadable
    assert isinstance(gpu, ModelEstimate) and "/nonexistent does not exist" in gpu.reason
    with pytest.raises(ValueError, match="source 'watts' is unknown"):
        SourcePicker("cpu=watts")
    with pytest.raises(ValueError, match="expected 0 <= idle watts <= busy watts"):
        SourcePicker("", "cpu=65:10")
    with pytest.raises(ValueError, match="is not IDLE_W:BUSY_W"):
        SourcePicker("", "cpu=10")


def test_monitor_samples_on_its_thread_and_the_estimate_says_why() -> None:
    monitor = PowerMonitor(interval_s=0.05)
    meter = monitor.meter(CPU)
    assert monitor.meter(CPU) is meter
    if isinstance(meter.source, ModelEstimate):  # no readable RAPL here: the reason is given
        assert "rapl" in meter.source.reason
    monitor.start()
    try:
        meter.charge("m", 0.01)
        time.sleep(0.3)
    finally:
        monitor.stop()
    reading = meter.read()
    assert reading.up and reading.energy_j > 0 and reading.model_energy_j["m"] > 0


def test_an_emulated_fpga_reads_no_board_sensor_and_is_priced_only_when_configured() -> None:
    emulator = Device("fpga0", "fpga", "opencl", emulated=True)
    unpriced = SourcePicker("fpga=opae").pick(emulator)  # a board's sensor is never its
    idle, busy = cpu_model_watts()
    assert isinstance(unpriced, ModelEstimate) and not unpriced.priced
    assert (unpriced.idle_w, unpriced.busy_w) == (0.0, busy - idle)  # what it adds to the CPU
    assert "emulated" in unpriced.describe()
    for watts in ("fpga0=3:9", "fpga-emulator=3:9"):
        priced = SourcePicker("", watts).pick(emulator)
        assert priced.priced and (priced.idle_w, priced.busy_w) == (3.0, 9.0)
    assert SourcePicker("", "fpga=3:9").pick(emulator).busy_w == busy - idle  # a board's figure
