"""Joules per inference of a device worker, the quantity the `efficiency` routing policy ranks
devices by. Until power sensors are wired in, it is an estimate (source "model"): a configured
busy power for the device's kind times the measured seconds per sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# Typical board power while busy, by device kind: a mid-range FPGA card, a T4-class GPU, and a
# server CPU socket's share. Figures for ranking devices only, never reported as measured.
BUSY_WATTS = {"fpga": 25.0, "gpu": 70.0, "cpu": 65.0}


class EnergyMeter(Protocol):
    source: str  # "model" for an estimate; a sensor's name ("nvml", "rapl", ...) when measured

    def record_batch(self, samples: int, busy_s: float) -> None:
        """Called after each batch the worker ran."""
        ...

    def joules_per_inference(self) -> float | None:
        """None until the first batch has run."""
        ...


class EstimatedEnergy:
    """Busy watts times the worker's measured seconds per sample."""

    source = "model"

    def __init__(self, busy_watts: float,
                 seconds_per_sample: Callable[[], float | None]) -> None:
        self.busy_watts = busy_watts
        self._seconds_per_sample = seconds_per_sample

    def record_batch(self, samples: int, busy_s: float) -> None:
        """Nothing to read: the worker already measures its time per sample."""

    def joules_per_inference(self) -> float | None:
        seconds = self._seconds_per_sample()
        return None if seconds is None else self.busy_watts * seconds
