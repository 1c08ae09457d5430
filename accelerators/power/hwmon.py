"""hwmon sensors (many GPU and FPGA cards, e.g. amdgpu): `energy*_input` in µJ where the chip
counts energy, else `power*_average` / `power*_input` in µW, integrated over time."""

from __future__ import annotations

from pathlib import Path

from accelerators.power.source import (
    EnergyCounterSource,
    PowerGaugeSource,
    PowerSource,
    SourceError,
    read_int,
)

HWMON = Path("/sys/class/hwmon")


def find(spec: str, root: Path = HWMON) -> Path:
    """A hwmon folder by path, or by the chip name in its `name` file (e.g. `amdgpu`)."""
    path = Path(spec)
    if path.is_absolute():
        if not path.exists():
            raise SourceError(f"hwmon: {path} does not exist")
        return path
    for folder in sorted(root.glob("hwmon*")):
        name = folder / "name"
        if name.is_file() and name.read_text().strip() == spec:
            return folder
    raise SourceError(f"hwmon: no chip named {spec!r} under {root}")


def hwmon_source(spec: str, root: Path = HWMON) -> PowerSource:
    """An energy counter where the folder has one, else a power sensor; a file path picks one."""
    path = find(spec, root)
    if path.is_file():
        return (HwmonEnergy(path) if path.name.startswith("energy") else HwmonPower(path))
    for pattern, kind in (("energy*_input", HwmonEnergy), ("power*_average", HwmonPower),
                          ("power*_input", HwmonPower)):
        files = sorted(path.glob(pattern))
        if files:
            return kind(files[0])
    raise SourceError(f"hwmon: {path} has no energy*_input, power*_average or power*_input")


class HwmonEnergy(EnergyCounterSource):
    source = "hwmon"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._last_uj = read_int(path)

    def read_increase_j(self) -> float:
        raw = read_int(self.path)
        increase, self._last_uj = max(0, raw - self._last_uj), raw  # a reset counts nothing
        return increase / 1e6

    def describe(self) -> str:
        return f"hwmon {self.path}"


class HwmonPower(PowerGaugeSource):
    source = "hwmon"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.read_power_w()

    def read_power_w(self) -> float:
        return read_int(self.path) / 1e6

    def describe(self) -> str:
        return f"hwmon {self.path}"
