"""ONNX Runtime as an engine: the CUDA (or TensorRT) provider on GPU `device_id` where
onnxruntime-gpu finds one, else the CPU.

A session re-plans its convolutions whenever its input shape changes (on CUDA by 60-120x per
run), so once the batch sizes are fixed (`fix_batch_sizes`, the model's buckets) each size gets
its own session, all built from one SessionOptions, and runs through IO binding: one copy of
each input to the device, one copy of each output back (accelerators/onnxruntime_binding.py;
CUDA graphs, where the config asks for them, replay on those fixed buffers)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np

from accelerators.engine import Device, TensorSignature, device_name
from accelerators.engine_options import EngineOptions, OptionError
from accelerators.onnxruntime_binding import BoundSession

log = logging.getLogger(__name__)

_WIRE_BY_ONNX = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
}
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


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
    def __init__(self, model_path: Path, intra_op_threads: int = 0, use_gpu: bool = True,
                 device_id: int = 0, options: EngineOptions | None = None) -> None:
        ort = self._ort = _import_ort()
        options = options or EngineOptions()
        self._options = ort.SessionOptions()
        self._options.intra_op_num_threads = intra_op_threads
        # Idle pool threads would spin for work, taking CPU from gRPC on small machines.
        self._options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._providers = options.providers(ort.get_available_providers(), device_id, use_gpu)
        self._model = _model(model_path, options)
        self._session = self._new_session()
        # onnxruntime-gpu lists CUDA even without a GPU and silently falls back: ask what it took.
        taken = self._session.get_providers()
        if options.tensorrt and use_gpu and "TensorrtExecutionProvider" not in taken:
            raise OptionError(
                "optimization.execution_accelerators.gpu_execution_accelerator asks for "
                "tensorrt, but ONNX Runtime could not start its TensorrtExecutionProvider "
                f"(it took {taken}); the TensorRT libraries (libnvinfer) are missing or do not "
                "match this onnxruntime-gpu")
        on_gpu = taken[0] in _GPU_PROVIDERS
        self.device = Device(device_name("gpu", device_id), "gpu", "onnxruntime") if on_gpu \
            else Device("cpu0", "cpu", "onnxruntime")
        self.tolerance = options.tolerance(on_gpu)  # relative, against exact FP32 results
        self._bind_to = ("cuda", device_id) if on_gpu else ("cpu", 0)
        self._cuda_graphs = options.cuda_graphs and on_gpu
        self._sessions: dict[int, BoundSession] = {}  # batch size -> its own session
        self.inputs = tuple(_signature(a) for a in self._session.get_inputs())
        self.outputs = tuple(_signature(a) for a in self._session.get_outputs())
        log.info("onnxruntime session for %s on %s (%s)", model_path, self.device.name,
                 ", ".join(taken))

    def _new_session(self):
        return self._ort.InferenceSession(self._model, self._options, providers=self._providers)

    def fix_batch_sizes(self, sizes: tuple[int, ...]) -> None:
        """One session per batch size from now on, where the model's other dimensions are
        fixed (the first size reuses the loading session)."""
        if not all(BoundSession.possible(self._session, size) for size in sizes):
            if self._cuda_graphs:
                raise OptionError("optimization.cuda.graphs: the model leaves a dimension other "
                                  "than the batch free; CUDA graphs need fixed shapes")
            log.warning("model inputs or outputs have free dimensions besides the batch: one "
                        "session serves every batch size")
            return
        self._sessions = {size: BoundSession(self._ort, self._session if i == 0
                                             else self._new_session(), size, self._bind_to,
                                             self._cuda_graphs)
                          for i, size in enumerate(sizes)}

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        session = self._sessions.get(len(next(iter(inputs.values())))) if self._sessions \
            else None
        if session is None:
            return dict(zip(outputs, self._session.run(outputs, inputs)))
        return session.run(inputs, outputs)


def _model(path: Path, options: EngineOptions) -> str | bytes:
    """The model file's path, or the model as the options change it: converted to FP16 by
    onnxconverter-common (inputs and outputs kept FP32), uint8 inputs normalised first."""
    if not options.fp16 and not options.uint8_inputs:
        return str(path)
    import onnx

    from accelerators.input_normalization import normalized

    model = onnx.load(str(path))
    if options.fp16:
        from onnxconverter_common import float16

        with warnings.catch_warnings():  # one warning per weight clipped to FP16's range
            warnings.simplefilter("ignore", UserWarning)
            model = float16.convert_float_to_float16(model, keep_io_types=True)
    if options.uint8_inputs:
        model = normalized(model, options.uint8_inputs)
    return model.SerializeToString()


def _signature(arg) -> TensorSignature:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSignature(arg.name, _WIRE_BY_ONNX.get(arg.type, arg.type), shape)
