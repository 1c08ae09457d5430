"""ONNX Runtime settings of one model (service/core/engine_settings.py reads them from its
config.pbtxt), hetserve's precision switches and the simulated engine's curve: the engines' own
typed options."""

from __future__ import annotations

from dataclasses import dataclass, field

from accelerators.input_normalization import Normalization

# Relative tolerance of results against the same engine's FP32 run, by what the engine computes
# in: TF32 keeps 10 mantissa bits (as FP16 does), FP16 also stores activations in 16 bits.
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-2}


class OptionError(ValueError):
    """A model's ONNX Runtime setting that cannot be honoured; the message names the field."""


@dataclass(frozen=True)
class EngineOptions:
    cuda: dict[str, str] = field(default_factory=dict)  # CUDA provider options
    tf32: bool = True
    fp16: bool = False
    tensorrt: bool = False
    tensorrt_fp16: bool = False
    cuda_graphs: bool = False
    simulated_curve: str = ""  # a file in the model's folder (accelerators/simulated_engine.py)
    # uint8 inputs normalised on the device (accelerators/input_normalization.py)
    uint8_inputs: dict[str, Normalization] = field(default_factory=dict)

    def providers(self, available: list[str], device_id: int,
                  use_gpu: bool) -> list[str | tuple[str, dict[str, str]]]:
        """The provider list for a session, best first; CPU always last."""
        if not use_gpu:
            return ["CPUExecutionProvider"]
        wanted: list = []
        if self.tensorrt:
            if "TensorrtExecutionProvider" not in available:
                raise OptionError(
                    "optimization.execution_accelerators.gpu_execution_accelerator asks for "
                    "tensorrt, but ONNX Runtime's TensorrtExecutionProvider is missing (providers "
                    f"here: {available}); install onnxruntime-gpu with the TensorRT libraries "
                    "(libnvinfer) or remove the accelerator")
            wanted.append(("TensorrtExecutionProvider", {
                "device_id": str(device_id), "trt_fp16_enable": str(self.tensorrt_fp16)}))
        if "CUDAExecutionProvider" in available:
            wanted.append(("CUDAExecutionProvider", {
                "device_id": str(device_id), "use_tf32": "1" if self.tf32 else "0",
                **({"enable_cuda_graph": "1"} if self.cuda_graphs else {}), **self.cuda}))
        return wanted + ["CPUExecutionProvider"]

    def tolerance(self, on_gpu: bool) -> float:
        """Relative tolerance of this engine's results against an exact FP32 computation."""
        if self.fp16 or (on_gpu and self.tensorrt_fp16):
            return TOLERANCE["fp16"]
        return TOLERANCE["tf32"] if on_gpu and self.tf32 else TOLERANCE["fp32"]
