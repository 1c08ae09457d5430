"""ONNX Runtime settings of one model, read from its config.pbtxt as Triton's onnxruntime backend
reads them, plus hetserve's precision switches and the simulated engine's curve:

    parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }   # or HEURISTIC
    parameters { key: "gpu_mem_limit" value: { string_value: "4294967296" } }   # bytes
    parameters { key: "arena_extend_strategy" value: { string_value: "1" } }    # kSameAsRequested
    parameters { key: "tf32" value: { string_value: "off" } }   # CUDA computes in TF32 by default
    parameters { key: "precision" value: { string_value: "fp16" } }  # converted, FP32 on the wire
    optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt"
        parameters { key: "precision_mode" value: "FP16" } } ] } }
    optimization { cuda { graphs: true } }   # a CUDA graph per bucket (needs fixed shapes)
    parameters { key: "simulated_curve" value: { string_value: "h200.curve" } }  # simulated:
    parameters { key: "uint8_inputs" value: { string_value: "image" } }  # input_normalization.py

Any other parameter that looks like a provider option (cudnn_*, cuda_*, gpu_*, arena_*, trt_*)
is an error naming the accepted ones, so that a typo never silently changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2

from accelerators import input_normalization
from accelerators.input_normalization import Normalization

# Triton's numeric values, and ONNX Runtime's names for them.
_CHOICES = {
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
}
CUDA_OPTIONS = (*_CHOICES, "gpu_mem_limit")
SWITCHES = {"tf32": ("on", "off"), "precision": ("fp32", "fp16")}
_PROVIDER_PREFIXES = ("cudnn_", "cuda_", "gpu_", "arena_", "trt_")
_ACCELERATORS = ("tensorrt",)
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

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> EngineOptions:
        params = {k: v.string_value.strip() for k, v in config.parameters.items()}
        cuda = {}
        for key, value in params.items():
            if key in _CHOICES:
                cuda[key] = _choice(key, value, _CHOICES[key])
            elif key == "gpu_mem_limit":
                if not value.isdigit() or int(value) == 0:
                    raise OptionError(f"parameters.gpu_mem_limit: {value!r} is not a positive "
                                      "number of bytes")
                cuda[key] = value
            elif key in SWITCHES and value not in SWITCHES[key]:
                raise OptionError(f"parameters.{key}: {value!r} is unknown; expected one of "
                                  f"{list(SWITCHES[key])}")
            elif key.startswith(_PROVIDER_PREFIXES):
                raise OptionError(f"parameters.{key}: not an ONNX Runtime provider option "
                                  f"hetserve passes on; accepted: {[*CUDA_OPTIONS, *SWITCHES]}")
        tensorrt = trt_fp16 = False
        field_name = "optimization.execution_accelerators.gpu_execution_accelerator"
        for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
            if accelerator.name not in _ACCELERATORS:
                raise OptionError(f"{field_name}: {accelerator.name!r} is unknown; expected one "
                                  f"of {list(_ACCELERATORS)}")
            tensorrt = True
            mode = accelerator.parameters.get("precision_mode", "FP32")
            if mode not in ("FP32", "FP16"):
                raise OptionError(f"{field_name} tensorrt: precision_mode {mode!r} is unknown; "
                                  "expected FP32 or FP16")
            trt_fp16 = mode == "FP16"
        return cls(cuda, params.get("tf32", "on") == "on", params.get("precision") == "fp16",
                   tensorrt, trt_fp16, config.optimization.cuda.graphs,
                   params.get("simulated_curve", ""), _uint8_inputs(params.get("uint8_inputs", "")))

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


def _uint8_inputs(text: str) -> dict[str, Normalization]:
    try:
        return input_normalization.parse(text)
    except ValueError as e:
        raise OptionError(str(e)) from None


def _choice(key: str, value: str, names: tuple[str, ...]) -> str:
    """Triton's number (0, 1, ...) or ONNX Runtime's name, as ONNX Runtime's name."""
    if value.isdigit() and int(value) < len(names):
        return names[int(value)]
    if value in names:
        return value
    raise OptionError(f"parameters.{key}: {value!r} is unknown; expected one of "
                      f"{[str(i) for i in range(len(names))]} or {list(names)}")
