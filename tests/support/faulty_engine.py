"""A device that can be slowed down or made to fail mid-batch, for fault and overload tests
(a real device fault cannot be produced on these machines). It computes with real ONNX Runtime,
implements the same Engine protocol and is plugged in the way any extra engine is: the daemon
imports this module (`--engine-modules`), which registers `faulty:<device>`, e.g. `faulty:fpga0`,
and `faulty-opencl:<device>`: the real OpenCL engine on that device (the emulated fpga0), with
the same faults injected.

Each batch reads the JSON file named by HETSERVE_TEST_ENGINE_CONTROL:
{"delay_s": seconds to add per batch, "fail": true to raise after computing, and optionally
"delays": {device name: its own seconds per batch}, for devices of different speeds}.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from accelerators.engine import Device
from accelerators.engine_factory import DeviceSpec, register_engine
from accelerators.onnxruntime_engine import OnnxRuntimeEngine

CONTROL_ENV = "HETSERVE_TEST_ENGINE_CONTROL"


class FaultyEngine:
    def __init__(self, spec: DeviceSpec, model_path: Path, intra_op_threads: int) -> None:
        self._inner = OnnxRuntimeEngine(model_path, intra_op_threads, use_gpu=False)
        name = spec.device or "fpga0"
        self.device = Device(name, spec.kind or "fpga", "faulty")
        self.inputs, self.outputs = self._inner.inputs, self._inner.outputs
        self._control = Path(os.environ[CONTROL_ENV])

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        control = json.loads(self._control.read_text()) if self._control.exists() else {}
        time.sleep(control.get("delays", {}).get(self.device.name, control.get("delay_s", 0.0)))
        result = self._inner.run(inputs, outputs)
        if control.get("fail"):
            raise RuntimeError(f"{self.device.name}: simulated device fault mid-batch")
        return result


class FaultyOpenCLEngine(FaultyEngine):
    def __init__(self, spec: DeviceSpec, model_path: Path, intra_op_threads: int) -> None:
        from accelerators.opencl.engine import OpenCLEngine

        self._inner = OpenCLEngine(model_path, spec.device)
        self.device = self._inner.device
        self.inputs, self.outputs = self._inner.inputs, self._inner.outputs
        self._control = Path(os.environ[CONTROL_ENV])


register_engine("faulty", FaultyEngine)
register_engine("faulty-opencl", FaultyOpenCLEngine)
