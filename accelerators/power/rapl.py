"""Intel/AMD RAPL through powercap: `energy_uj` counters of the package zones.

Package zones (`intel-rapl:N`, named `package-N`) contain their core and uncore subzones, so only
packages are summed; `psys` contains the packages and is left out too. Counters wrap at
`max_energy_range_uj`. Since Linux 5.10 (CVE-2020-8694) `energy_uj` is readable only by root.
"""

from __future__ import annotations

import re
from pathlib import Path

from accelerators.power.source import EnergyCounterSource, SourceError, read_int

POWERCAP = Path("/sys/class/powercap")
_TOP_ZONE = re.compile(r"^[a-z-]+-rapl:\d+$")


class RaplZone:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.max_uj = read_int(path / "max_energy_range_uj")
        self._last_uj: int | None = None

    def read_increase_uj(self) -> int:
        try:
            raw = read_int(self.path / "energy_uj")
        except SourceError as e:
            if "permission denied" in str(e):
                raise SourceError(
                    f"rapl: {self.path / 'energy_uj'} is readable only by root since Linux "
                    f"5.10 (CVE-2020-8694): run the daemon as root or grant read access, e.g. "
                    f"`chmod o+r {self.path}/energy_uj` from a udev rule") from None
            raise
        last, self._last_uj = self._last_uj, raw
        if last is None:
            return 0
        return raw - last if raw >= last else raw + self.max_uj - last  # wrapped


def package_zones(root: Path = POWERCAP) -> list[Path]:
    zones = sorted(p for p in root.glob("*-rapl:*") if _TOP_ZONE.match(p.name))
    return [p for p in zones if (p / "name").read_text().strip().startswith("package")]


class RaplSource(EnergyCounterSource):
    source = "rapl"

    def __init__(self, root: Path = POWERCAP) -> None:
        super().__init__()
        paths = package_zones(root) if root.is_dir() else []
        if not paths:
            raise SourceError(f"rapl: no package zone under {root} (no RAPL driver, or a "
                              f"virtual machine that does not expose it)")
        self.zones = [RaplZone(p) for p in paths]
        self.read_increase_j()  # fails now, at start-up, if the counters are unreadable

    def read_increase_j(self) -> float:
        return sum(z.read_increase_uj() for z in self.zones) / 1e6

    def describe(self) -> str:
        return "rapl " + ", ".join(str(z.path) for z in self.zones)
