"""The engine part of a model's settings (service/core/model_settings.py): its ONNX Runtime
options, read from its config.pbtxt as Triton's onnxruntime backend reads them, plus hetserve's
precision switches and the simulated engine's curve, as accelerators' own typed EngineOptions:

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

from tritonclient.grpc import model_config_pb2

from accelerators import input_normalization
from accelerators.engine_options import EngineOptions, OptionError
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


def parse_engine_options(config: model_config_pb2.ModelConfig) -> EngineOptions:
    """OptionError names the field, the value and what is accepted."""
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
    return EngineOptions(cuda, params.get("tf32", "on") == "on",
                         params.get("precision") == "fp16", tensorrt, trt_fp16,
                         config.optimization.cuda.graphs, params.get("simulated_curve", ""),
                         _uint8_inputs(params.get("uint8_inputs", "")))


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
