"""Intel FPGA cards through OPAE: the board power that `fpgainfo power` prints, in watts,
integrated over time."""

from __future__ import annotations

import re
import shutil
import subprocess

from accelerators.power.source import PowerGaugeSource, SourceError

# e.g. "Board Power                      : 68.53 Watts" or "( 1) Total Input Power : 70.1 Watts"
_LINE = re.compile(r"^\s*(?:\(\s*\d+\)\s*)?(?P<label>[^:]*power[^:]*?)\s*:\s*"
                   r"(?P<watts>[0-9]+(?:\.[0-9]+)?)\s*(?:watts|w)\b", re.IGNORECASE | re.MULTILINE)
_PREFERRED = ("board power", "total input power")


def parse_power(text: str) -> float:
    """The board's total power: 'Board Power' or 'Total Input Power', else the first watts line."""
    found = {m["label"].strip().lower(): float(m["watts"]) for m in _LINE.finditer(text)}
    for label in _PREFERRED:
        if label in found:
            return found[label]
    if found:
        return next(iter(found.values()))
    raise SourceError(f"opae: no power in watts in `fpgainfo power` output: {text[:200]!r}")


class OpaeSource(PowerGaugeSource):
    source = "opae"

    def __init__(self, bus: str = "", command: str = "fpgainfo") -> None:
        """`bus`: the card's PCI bus (fpgainfo -B), needed where a node holds several cards."""
        super().__init__()
        exe = shutil.which(command)
        if exe is None:
            raise SourceError(f"opae: `{command}` is not on PATH (install OPAE's tools)")
        self.argv = [exe, "power"] + (["-B", bus] if bus else [])
        self.read_power_w()

    def read_power_w(self) -> float:
        try:
            done = subprocess.run(self.argv, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SourceError(f"opae: {' '.join(self.argv)}: {e}") from None
        if done.returncode != 0:
            raise SourceError(f"opae: {' '.join(self.argv)} exited {done.returncode}: "
                              f"{done.stderr.strip()[:200]}")
        return parse_power(done.stdout)

    def describe(self) -> str:
        return "opae " + " ".join(self.argv)
