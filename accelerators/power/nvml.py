"""NVIDIA GPUs through NVML (nvidia-ml-py): the total energy counter (mJ since the driver
loaded, Volta and newer) where the GPU has one, else board power (mW) integrated over time."""

from __future__ import annotations

from accelerators.power.source import Integral, PowerSource, Sample, SourceError


def _nvml():
    try:
        import pynvml
    except ImportError as e:
        raise SourceError(f"nvml: nvidia-ml-py is not installed: {e}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise SourceError(f"nvml: cannot initialise NVML (no NVIDIA driver?): {e}") from None
    return pynvml


class NvmlSource(PowerSource):
    source = "nvml"

    def __init__(self, index: int = 0) -> None:
        nvml = self._nvml = _nvml()
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self.name = nvml.nvmlDeviceGetName(self._handle)
        except nvml.NVMLError as e:
            raise SourceError(f"nvml: no GPU {index}: {e}") from None
        self.index = index
        try:
            self._start_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self.counter = True
        except nvml.NVMLError:  # NOT_SUPPORTED before Volta
            self._start_mj, self.counter = 0, False
        self._integral = Integral()  # where it has no counter

    def sample(self, now: float, utilization: float) -> Sample:
        nvml = self._nvml
        try:
            power = nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3
            if self.counter:
                total = nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                return Sample((total - self._start_mj) / 1e3, power)
        except nvml.NVMLError as e:
            raise SourceError(f"nvml: GPU {self.index}: {e}") from None
        return Sample(self._integral.add(now, power), power)

    def describe(self) -> str:
        how = "energy counter" if self.counter else "power integrated"
        return f"nvml GPU {self.index} ({self.name}, {how})"
