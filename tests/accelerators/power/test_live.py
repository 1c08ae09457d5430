"""The machine's own sensors, wherever it has them; each absent one is skipped with its reason."""

from __future__ import annotations

import time

import pytest

from accelerators.power import hwmon, rapl, xrt
from accelerators.power.nvml import NvmlSource
from accelerators.power.opae import OpaeSource
from accelerators.power.source import PowerSource, SourceError


def sample_twice(source: PowerSource) -> None:
    source.sample(time.monotonic(), 0)
    time.sleep(0.3)
    s = source.sample(time.monotonic(), 0)
    assert s.energy_j >= 0 and 0 <= s.power_w < 5000, s


def live(make) -> PowerSource:
    try:
        return make()
    except SourceError as e:
        pytest.skip(f"no live sensor on this machine: {e}")


def test_rapl() -> None:
    sample_twice(live(rapl.RaplSource))


def test_hwmon() -> None:
    chips = [c for c in hwmon.HWMON.glob("hwmon*")
             if any(c.glob("energy*_input")) or any(c.glob("power*_*"))] \
        if hwmon.HWMON.is_dir() else []
    if not chips:
        pytest.skip(f"no live sensor on this machine: no power or energy file under {hwmon.HWMON}")
    sample_twice(live(lambda: hwmon.hwmon_source(str(chips[0]))))


def test_nvml() -> None:
    source = live(NvmlSource)
    sample_twice(source)
    assert "nvml GPU 0" in source.describe()


def test_xrt() -> None:
    sample_twice(live(xrt.XrtSource))


def test_opae() -> None:
    sample_twice(live(OpaeSource))
