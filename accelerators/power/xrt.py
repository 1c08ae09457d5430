"""AMD/Xilinx Alveo cards through XRT's sysfs: `xmc.*/xmc_power` under the card's PCI device,
in µW (what `xrt-smi examine -r electrical` reports), integrated over time."""

from __future__ import annotations

from pathlib import Path

from accelerators.power.source import PowerGaugeSource, SourceError, read_int

PCI_DEVICES = Path("/sys/bus/pci/devices")


def xmc_power_files(root: Path = PCI_DEVICES) -> list[Path]:
    return sorted(root.glob("*/xmc.*/xmc_power"))


class XrtSource(PowerGaugeSource):
    source = "xrt"

    def __init__(self, spec: str = "", root: Path = PCI_DEVICES) -> None:
        """`spec`: the card's PCI address (e.g. 0000:3b:00.1); empty takes the first card."""
        super().__init__()
        files = [f for f in xmc_power_files(root) if not spec or f.parent.parent.name == spec]
        if not files:
            raise SourceError(f"xrt: no xmc.*/xmc_power under {root}"
                              + (f"/{spec}" if spec else "") + " (no Alveo card or no XRT driver)")
        self.path = files[0]
        self.read_power_w()

    def read_power_w(self) -> float:
        return read_int(self.path) / 1e6

    def describe(self) -> str:
        return f"xrt {self.path}"
