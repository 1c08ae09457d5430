"""An engine that records the batch shapes it is given, for the bucket and warm-up tests. It
computes with real ONNX Runtime on the CPU (forwarding `fix_batch_sizes`, so the per-bucket
sessions and IO binding of the ONNX Runtime engine run too) and names itself after the device of
its spec, so `recording:gpu0` is a GPU to the daemon's bucket rules. The daemon imports this
module (`--engine-modules`), which registers `recording:<device>`.

Each run appends {"engine": instance number, "rows": batch rows} as a JSON line to the file named
by HETSERVE_TEST_ENGINE_RECORD."""

from __future__ import annotations

import itertools
import json
import os
import threading
from pathlib import Path

import numpy as np

from accelerators.engine import Device
from accelerators.engine_factory import DeviceSpec, register_engine
from accelerators.onnxruntime_engine import OnnxRuntimeEngine

RECORD_ENV = "HETSERVE_TEST_ENGINE_RECORD"
_numbers = itertools.count()
_lock = threading.Lock()


class RecordingEngine:
    def __init__(self, spec: DeviceSpec, model_path: Path, intra_op_threads: int) -> None:
        self._inner = OnnxRuntimeEngine(model_path, intra_op_threads, use_gpu=False)
        self.device = Device(spec.device or "gpu0", spec.kind or "gpu", "recording")
        self.inputs, self.outputs = self._inner.inputs, self._inner.outputs
        self.number = next(_numbers)
        self._record = Path(os.environ[RECORD_ENV])

    def fix_batch_sizes(self, sizes: tuple[int, ...]) -> None:
        self._inner.fix_batch_sizes(sizes)

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        rows = len(next(iter(inputs.values())))
        with _lock, self._record.open("a") as f:
            f.write(json.dumps({"engine": self.number, "rows": rows}) + "\n")
        return self._inner.run(inputs, outputs)


def records(path: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


register_engine("recording", RecordingEngine)
