"""ONNX Runtime as an engine: the CUDA provider where onnxruntime-gpu finds a GPU, else the CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from accelerators.engine import Device, TensorSignature

log = logging.getLogger(__name__)

_WIRE_BY_ONNX = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
}


def _import_ort():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError("ONNX Runtime is missing: install hetserve[cpu] or, on GPU nodes, "
                          "hetserve[gpu]") from e
    return onnxruntime


def providers() -> list[str]:
    return _import_ort().get_available_providers()


class OnnxRuntimeEngine:
    def __init__(self, model_path: Path, intra_op_threads: int = 0,
                 use_gpu: bool = True) -> None:
        ort = _import_ort()
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        # Idle pool threads would spin for work, taking CPU from gRPC on small machines.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        wanted = ["CPUExecutionProvider"]
        if use_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
            wanted.insert(0, "CUDAExecutionProvider")
        self._session = ort.InferenceSession(str(model_path), options, providers=wanted)
        # onnxruntime-gpu lists CUDA even without a GPU and silently falls back: ask what it took.
        on_gpu = self._session.get_providers()[0] == "CUDAExecutionProvider"
        self.device = Device("gpu0", "gpu", "onnxruntime") if on_gpu \
            else Device("cpu0", "cpu", "onnxruntime")
        self.inputs = tuple(_signature(a) for a in self._session.get_inputs())
        self.outputs = tuple(_signature(a) for a in self._session.get_outputs())
        log.info("onnxruntime session for %s on %s (%s)", model_path, self.device.name,
                 ", ".join(self._session.get_providers()))

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        return dict(zip(outputs, self._session.run(outputs, inputs)))


def _signature(arg) -> TensorSignature:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSignature(arg.name, _WIRE_BY_ONNX.get(arg.type, arg.type), shape)
