"""The small interface every execution engine implements (ONNX Runtime now, OpenCL next)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Device:
    """A device as metrics and logs name it: `cpu0` of kind `cpu`, run by `onnxruntime`."""

    name: str
    kind: str  # "fpga" | "gpu" | "cpu"
    engine: str  # "onnxruntime" | "opencl"


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
        """Runs one batch; called from one worker thread at a time."""
        ...
