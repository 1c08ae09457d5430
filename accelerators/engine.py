"""The small interface every execution engine implements (ONNX Runtime, OpenCL)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

_NAME = re.compile(r"([a-z]+)(\d+)")


def device_name(kind: str, index: int) -> str:
    """The n-th device of a kind, as specs, metrics and logs name it: `gpu1`."""
    return f"{kind}{index}"


def parse_device_name(name: str) -> tuple[str, int] | None:
    """(kind, index) of `gpu1`; None when the name is not of that form."""
    match = _NAME.fullmatch(name)
    return (match[1], int(match[2])) if match else None


@dataclass(frozen=True)
class Device:
    """A device as metrics and logs name it: `cpu0` of kind `cpu`, run by `onnxruntime`."""

    name: str
    kind: str  # "fpga" | "gpu" | "cpu"
    engine: str  # "onnxruntime" | "opencl"
    emulated: bool = False  # an FPGA emulator: the kernels run, on the CPU, at no board's speed

    @property
    def kind_label(self) -> str:
        """The kind as metrics and replies report it: an emulator is never counted as an FPGA."""
        return f"{self.kind}-emulator" if self.emulated else self.kind


@dataclass(frozen=True)
class TensorSignature:
    name: str
    datatype: str  # protocol name, e.g. "FP32"
    shape: tuple[int, ...]  # -1 where the model leaves a dimension free


class Engine(Protocol):
    device: Device
    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Runs one batch; one instance runs one batch at a time."""
        ...


@runtime_checkable
class PlansPerShape(Protocol):
    """An engine whose runtime plans per input shape (ONNX Runtime's CUDA provider re-plans
    whenever it changes): told the batch sizes it will see (its buckets) before its first run,
    it keeps one plan per size."""

    def fix_batch_sizes(self, sizes: tuple[int, ...]) -> None:
        ...


@runtime_checkable
class PreparesPlans(Protocol):
    """An engine whose binary takes every batch size at run time (an FPGA's pipeline): a new
    size costs only its launch plan, which it can build without running it."""

    def prepare(self, batch: int) -> None:
        """Builds the plan for `batch` samples (a no-op where plans are per request shape)."""
        ...


@runtime_checkable
class ReportsPlans(Protocol):
    """An engine that compiles launch plans as batch sizes and request shapes come (OpenCL),
    keeping a bounded number: reports each plan built and each evicted, so that operators see a
    cache that thrashes."""

    def report_plans(self, listener: Callable[[str, int], None]) -> None:
        """`listener(event, count)`, event "built" or "evicted", from now on; the plans so far
        (load's) at once."""
        ...
