"""Power sources read real files of a fake sysfs tree built in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelerators.power.hwmon import HwmonEnergy, HwmonPower, hwmon_source
from accelerators.power.model import ModelEstimate
from accelerators.power.opae import OpaeSource, parse_power
from accelerators.power.rapl import RaplSource
from accelerators.power.source import SourceError
from accelerators.power.xrt import XrtSource
from tests.support.sysfs import write


def rapl_tree(root: Path, package_uj: int = 1_000_000, max_uj: int = 10_000_000) -> Path:
    pkg = root / "intel-rapl:0"
    write(pkg / "name", "package-0")
    write(pkg / "energy_uj", str(package_uj))
    write(pkg / "max_energy_range_uj", str(max_uj))
    core = root / "intel-rapl:0:0"  # inside the package: must not be added
    write(core / "name", "core")
    write(core / "energy_uj", "500000")
    write(core / "max_energy_range_uj", str(max_uj))
    psys = root / "intel-rapl:1"  # the platform: contains the package
    write(psys / "name", "psys")
    write(psys / "energy_uj", "9000000")
    write(psys / "max_energy_range_uj", str(max_uj))
    return pkg


def test_rapl_sums_package_zones_only_and_handles_wraparound(tmp_path: Path) -> None:
    pkg = rapl_tree(tmp_path, package_uj=9_000_000)
    source = RaplSource(tmp_path)
    assert [z.path.name for z in source.zones] == ["intel-rapl:0"]
    assert source.sample(0.0, 0).energy_j == 0.0
    write(pkg / "energy_uj", "9500000")  # +0.5 J in 1 s
    s = source.sample(1.0, 0)
    assert (s.energy_j, s.power_w) == (pytest.approx(0.5), pytest.approx(0.5))
    write(pkg / "energy_uj", "1500000")  # wrapped at 10 J: +0.5 to the top, then +1.5
    s = source.sample(2.0, 0)
    assert (s.energy_j, s.power_w) == (pytest.approx(2.5), pytest.approx(2.0))


@contextlib.contextmanager
def unreadable(path: Path) -> Iterator[None]:
    """The file as an unprivileged user sees a root-only counter (root reads through modes)."""
    path.chmod(0o400 if os.geteuid() == 0 else 0)
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_rapl_permission_denied_names_the_file_and_the_fix() -> None:
    root = Path(tempfile.mkdtemp(prefix="hetserve-rapl-"))  # traversable by an unprivileged user
    try:
        root.chmod(0o755)
        pkg = rapl_tree(root)
        for p in (pkg, *pkg.iterdir()):
            p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
        with unreadable(pkg / "energy_uj"), pytest.raises(SourceError) as caught:
            RaplSource(root)
        message = str(caught.value)
        assert str(pkg / "energy_uj") in message
        assert "root since Linux 5.10" in message
    finally:
        shutil.rmtree(root)


def test_rapl_without_zones_says_so(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no package zone"):
        RaplSource(tmp_path)


def test_hwmon_prefers_the_energy_counter_and_finds_chips_by_name(tmp_path: Path) -> None:
    chip = tmp_path / "hwmon2"
    write(chip / "name", "amdgpu")
    write(chip / "power1_average", "50000000")  # 50 W in µW
    energy = write(chip / "energy1_input", "1000000")  # µJ
    source = hwmon_source("amdgpu", tmp_path)
    assert isinstance(source, HwmonEnergy)
    source.sample(0.0, 0)
    write(energy, "4000000")
    s = source.sample(2.0, 0)
    assert (s.energy_j, s.power_w) == (pytest.approx(3.0), pytest.approx(1.5))
    with pytest.raises(SourceError, match="no chip named 'nvme'"):
        hwmon_source("nvme", tmp_path)


def test_hwmon_power_is_integrated(tmp_path: Path) -> None:
    chip = tmp_path / "hwmon0"
    power = write(chip / "power1_input", "10000000")
    source = hwmon_source(str(chip), tmp_path)
    assert isinstance(source, HwmonPower)
    source.sample(0.0, 0)
    write(power, "30000000")
    s = source.sample(2.0, 0)  # trapezoid: (10 + 30) / 2 W × 2 s
    assert (s.energy_j, s.power_w) == (pytest.approx(40.0), pytest.approx(30.0))
    write(power, "garbage")
    with pytest.raises(SourceError, match="is not an integer"):
        source.sample(3.0, 0)


def test_xrt_reads_xmc_power_of_the_chosen_card(tmp_path: Path) -> None:
    write(tmp_path / "0000:3b:00.1" / "xmc.u.1" / "xmc_power", "25000000")
    card = write(tmp_path / "0000:5e:00.1" / "xmc.u.2" / "xmc_power", "40000000")
    source = XrtSource("0000:5e:00.1", tmp_path)
    assert source.path == card
    source.sample(0.0, 0)
    s = source.sample(0.5, 0)
    assert (s.energy_j, s.power_w) == (pytest.approx(20.0), pytest.approx(40.0))
    with pytest.raises(SourceError, match="no Alveo card"):
        XrtSource("0000:00:00.0", tmp_path)


FPGAINFO = """\
//****** POWER ******//
Object Id                        : 0xEE00000
PCIe s:b:d.f                     : 0000:B1:00.0
Device Id                        : 0x0B30
( 1) Board Power                 : 68.53 Watts
( 2) 12V Backplane Current       : 3.72 Amps
"""


def test_opae_parses_fpgainfo_power() -> None:
    assert parse_power(FPGAINFO) == 68.53
    assert parse_power("Total Input Power : 70.1 Watts\nFPGA Core Power : 30 Watts") == 70.1
    with pytest.raises(SourceError, match="no power in watts"):
        parse_power("Board Temperature : 40.0 Celsius")


def test_opae_runs_the_fpgainfo_command(tmp_path: Path) -> None:
    tool = write(tmp_path / "fpgainfo", f"#!/bin/sh\n[ \"$1\" = power ] || exit 2\ncat <<'X'\n"
                                        f"{FPGAINFO}X")
    tool.chmod(0o755)
    source = OpaeSource(command=str(tool))
    source.sample(0.0, 0)
    assert source.sample(1.0, 0).energy_j == pytest.approx(68.53)
    with pytest.raises(SourceError, match="not on PATH"):
        OpaeSource(command=str(tmp_path / "absent"))


def test_model_estimate_blends_idle_and_busy_by_utilization() -> None:
    estimate = ModelEstimate(10.0, 60.0)
    estimate.sample(0.0, 0.0)
    assert estimate.sample(1.0, 0.0).power_w == 10.0
    s = estimate.sample(3.0, 0.5)  # 35 W for 2 s
    assert (s.energy_j, s.power_w) == (pytest.approx(80.0), pytest.approx(35.0))
    assert estimate.sample(4.0, 2.0).power_w == 60.0  # overlapping batches clamp at busy
    with pytest.raises(SourceError, match="idle watts <= busy watts"):
        ModelEstimate(50.0, 10.0)
