"""An engine with the example model's signature that computes nothing (its outputs are zeros):
the serving path alone, as when the model runs on an accelerator and costs the host no CPU.
Importing this module registers it as `null:<device>` (`hetserve serve --engine-modules
null_engine`, with bench/ on PYTHONPATH). $NULL_ENGINE_BATCH_S makes every batch take that long
without holding the GIL, as a device of a fixed speed would."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from accelerators.engines import DeviceSpec, register_engine
from accelerators.onnxruntime_engine import OnnxRuntimeEngine


class NullEngine:
    def __init__(self, spec: DeviceSpec, model_path: Path, intra_op_threads: int) -> None:
        real = OnnxRuntimeEngine(model_path, 1, use_gpu=False)  # for the signature only
        self.device, self.inputs, self.outputs = real.device, real.inputs, real.outputs
        self._logits = np.zeros((1024, 10), np.float32)
        self._batch_s = float(os.environ.get("NULL_ENGINE_BATCH_S", 0))

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        if self._batch_s:
            time.sleep(self._batch_s)
        return {"logits": self._logits[:len(inputs["image"])]}


register_engine("null", NullEngine)
