"""The `model` estimate for devices without a readable sensor: configured idle and busy watts,
blended by the device's measured utilization (its workers' busy time over wall time)."""

from __future__ import annotations

from accelerators.power.source import PowerSource, Sample, SourceError


class ModelEstimate(PowerSource):
    source = "model"

    def __init__(self, idle_w: float, busy_w: float, reason: str = "",
                 priced: bool = True) -> None:
        """`priced` False: the figures are not the device's own (an emulated FPGA without
        configured figures gets its host CPU's), so routing by energy must not rank by them."""
        if not 0 <= idle_w <= busy_w:
            raise SourceError(f"model estimate: need 0 <= idle watts <= busy watts, got "
                              f"idle {idle_w} W and busy {busy_w} W")
        self.idle_w, self.busy_w = idle_w, busy_w
        self.reason = reason  # why no sensor is used, shown to operators
        self.priced = priced
        self._energy_j = 0.0
        self._last: float | None = None

    def power_w(self, utilization: float) -> float:
        return self.idle_w + (self.busy_w - self.idle_w) * min(1.0, max(0.0, utilization))

    def sample(self, now: float, utilization: float) -> Sample:
        power = self.power_w(utilization)
        if self._last is not None:  # utilization was measured over exactly this interval
            self._energy_j += power * max(0.0, now - self._last)
        self._last = now
        return Sample(self._energy_j, power)

    def describe(self) -> str:
        return (f"model estimate ({self.idle_w:g} W idle, {self.busy_w:g} W busy)"
                + (f": {self.reason}" if self.reason else ""))
