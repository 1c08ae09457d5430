"""Creates engines from device specs: `onnxruntime` (its best device), `onnxruntime:cpu0`,
`onnxruntime:gpu0`, and `opencl` (its preferred device: fpga, then gpu, then cpu), `opencl:fpga0`,
`opencl:gpu1`, `opencl:cpu0` (the n-th OpenCL device of that kind); and `simulated:gpu0`, a device
of a measured speed that computes nothing (accelerators/simulated_engine.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accelerators.devices import device_ids, gpu_count
from accelerators.engine import Engine, device_name, parse_device_name
from accelerators.engine_options import EngineOptions
from accelerators.onnxruntime_engine import OnnxRuntimeEngine

ENGINES = ("onnxruntime", "opencl", "simulated")
DEFAULT_DEVICES = "onnxruntime"
# Engines from outside this package (a site's own, or a test double), by name.
_REGISTERED: dict[str, Callable[[DeviceSpec, Path, int], Engine]] = {}


def register_engine(name: str, factory: Callable[[DeviceSpec, Path, int], Engine]) -> None:
    """Makes `name:device` usable in a model's `devices` parameter; `factory(spec, model_path,
    intra_op_threads)` builds the engine or raises saying why the model cannot run there."""
    _REGISTERED[name] = factory


@dataclass(frozen=True)
class DeviceSpec:
    engine: str
    device: str = ""  # e.g. "gpu0"; empty: the engine's best device

    @classmethod
    def parse(cls, text: str) -> DeviceSpec:
        engine, _, device = text.strip().partition(":")
        if engine not in ENGINES and engine not in _REGISTERED:
            raise ValueError(f"device {text.strip()!r}: engine {engine!r} is unknown; expected "
                             f"one of {[*ENGINES, *_REGISTERED]}, as in 'onnxruntime:cpu0'")
        return cls(engine, device)

    @property
    def kind(self) -> str:
        """"gpu" of "gpu1"; empty when the engine picks the device."""
        parsed = parse_device_name(self.device)
        return parsed[0] if parsed else ""

    def __str__(self) -> str:
        return f"{self.engine}:{self.device}" if self.device else self.engine


def parse_devices(text: str) -> list[DeviceSpec]:
    """An ordered, comma-separated list: the model's `devices` parameter."""
    return [DeviceSpec.parse(part) for part in text.split(",") if part.strip()]


def create_engine(spec: DeviceSpec, model_path: Path, intra_op_threads: int = 0,
                  ort_options: EngineOptions | None = None,
                  served: dict[str, tuple[int, ...]] | None = None,
                  max_shapes: int | None = None) -> Engine:
    """`ort_options`: the model's settings from its config; the OpenCL engine takes its
    `precision` (fp16: half storage, FP32 on the wire) as ONNX Runtime does. `served`: each
    input's dims after the batch axis in the config, which fix the OpenCL engine's shapes
    (ONNX Runtime takes any); where they leave dims variable, the OpenCL engine keeps the plans
    of `max_shapes` request shapes (None: its default)."""
    if spec.engine in _REGISTERED:
        return _REGISTERED[spec.engine](spec, model_path, intra_op_threads)
    if spec.engine == "simulated":
        from accelerators.simulated_engine import BatchCurve, SimulatedEngine

        if not ort_options or not ort_options.simulated_curve:
            raise ValueError(f"device {str(spec)!r}: the model names no parameters."
                             "simulated_curve, the file of its per-batch times")
        curve = BatchCurve.read(model_path.parent.parent, ort_options.simulated_curve)
        return SimulatedEngine(spec.device, model_path, curve, ort_options)
    if spec.engine == "opencl":
        if ort_options is not None and ort_options.uint8_inputs:
            raise ValueError("parameters.uint8_inputs: ONNX Runtime normalises uint8 inputs; "
                             "the OpenCL engine takes the model's float inputs")
        from accelerators.opencl.engine import OpenCLEngine  # needs onnx and a device
        from accelerators.opencl.plans import DEFAULT_SHAPES

        fp16 = ort_options is not None and ort_options.fp16
        return OpenCLEngine(model_path, spec.device, precision="fp16" if fp16 else "fp32",
                            served=served, max_shapes=max_shapes or DEFAULT_SHAPES)
    parsed = parse_device_name(spec.device)
    index = parsed[1] if parsed else 0
    if spec.kind == "gpu" and index >= (count := gpu_count()):
        gpus = ", ".join(f"onnxruntime:{device_name('gpu', i)}" for i in range(count))
        raise ValueError(f"no such device: {spec}; this node has "
                         + (gpus if count else "no GPU that ONNX Runtime can use")
                         + " (`hetserve devices` lists every device)")
    engine = OnnxRuntimeEngine(model_path, intra_op_threads, use_gpu=spec.kind != "cpu",
                               device_id=index, options=ort_options)
    if spec.device and engine.device.name != spec.device:
        raise ValueError(f"device {str(spec)!r} is not available: onnxruntime runs this model "
                         f"on {engine.device.name}")
    return engine


def device_specs(found: dict) -> list[DeviceSpec]:
    """One spec per device of an inventory (accelerators.devices.inventory), by its id."""
    return [DeviceSpec.parse(i) for i in device_ids(found)]


def can_run(spec: DeviceSpec, model_path: Path,
            served: dict[str, tuple[int, ...]] | None = None) -> str:
    """"yes", or why the device cannot run the model: the check the daemon's loading does."""
    try:
        create_engine(spec, model_path, intra_op_threads=1, served=served)
    except Exception as e:  # engines raise their own types for models they cannot run
        return f"no: {e}"
    return "yes"
