"""An engine with the example model's signature that computes nothing (its outputs are zeros):
the serving path alone, as when the model runs on an accelerator and costs the host no CPU.
Importing this module registers it as `null:<device>` (`hetserve serve --engine-modules
bench.null_engine`, from the repository root): `null:cpu0` is the CPU's, any other name
(`null:gpu0`, `null:fpga1`) a device of that name and kind. $NULL_ENGINE_BATCH_S makes every
batch take that long without holding the GIL, as a device of a fixed speed would: seconds for
every device, or per device, e.g. `gpu0=0.002,fpga0=0.008`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from accelerators.engine import Device
from accelerators.engine_factory import DeviceSpec, register_engine
from accelerators.onnxruntime_engine import OnnxRuntimeEngine


class NullEngine:
    def __init__(self, spec: DeviceSpec, model_path: Path, intra_op_threads: int) -> None:
        real = OnnxRuntimeEngine(model_path, 1, use_gpu=False)  # for the signature only
        self.device, self.inputs, self.outputs = real.device, real.inputs, real.outputs
        if spec.device and spec.device != real.device.name:
            self.device = Device(spec.device, spec.kind, "null")
        self._logits = np.zeros((1024, 10), np.float32)
        self._batch_s = _batch_s(os.environ.get("NULL_ENGINE_BATCH_S", "0"), self.device.name)

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._batch_s:
            time.sleep(self._batch_s)
        return {"logits": self._logits[:len(inputs["image"])]}


def _batch_s(text: str, device: str) -> float:
    if "=" not in text:
        return float(text)
    per_device = dict(entry.split("=") for entry in text.split(","))
    return float(per_device.get(device, 0))


register_engine("null", NullEngine)
