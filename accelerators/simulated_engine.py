"""A simulated device: takes a batch for as long as a measured per-batch time curve says, off the
GIL, copying its inputs as a device would, and answers zeros of the model's output shapes. It
holds the scheduler to a device's speed on any machine (bench/simulated_device.py): a GPU node's
curve on a 2-core box shows whether the daemon can feed that GPU.

A model selects it with `devices: "simulated:gpu0"` and names its curve, a file in the model's
folder, with `parameters { key: "simulated_curve" value: { string_value: "h200.curve" } }`.
The curve is one `<batch size> <seconds>` pair per line, sizes rising; `#` starts a comment.
Between two sizes the time is interpolated; below the first it is the first's; above the last
it grows with the size at the last one's seconds per sample."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accelerators import safe_files
from accelerators.engine import Device, TensorSignature, parse_device_name
from accelerators.engine_options import EngineOptions
from accelerators.onnxruntime_engine import OnnxRuntimeEngine

_NUMPY = {"FP16": "float16", "FP32": "float32", "FP64": "float64"}  # else the name, lower-case


@dataclass(frozen=True)
class BatchCurve:
    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def parse(cls, text: str, source: str) -> BatchCurve:
        """ValueError names `source`, the line and what it expected."""
        sizes: list[int] = []
        seconds: list[float] = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.partition("#")[0].split()
            if not fields:
                continue
            where = f"{source}:{number}: {line.strip()!r}"
            try:
                size, took = int(fields[0]), float(fields[1])
                if len(fields) != 2:
                    raise ValueError
            except (ValueError, IndexError):
                raise ValueError(f"{where}: expected '<batch size> <seconds>'") from None
            if size < 1 or (sizes and size <= sizes[-1]):
                raise ValueError(f"{where}: batch size {size} must be 1 or more and above the "
                                 f"line before's ({sizes[-1] if sizes else 0})")
            if not (took > 0 and math.isfinite(took)):
                raise ValueError(f"{where}: {took} seconds; expected a positive number")
            sizes.append(size)
            seconds.append(took)
        if not sizes:
            raise ValueError(f"{source}: no '<batch size> <seconds>' line")
        return cls(tuple(sizes), tuple(seconds))

    @classmethod
    def read(cls, folder: Path, name: str) -> BatchCurve:
        """The curve file `name` in `folder`: a plain name there, never read through a link."""
        if not name or Path(name).name != name or name in (".", ".."):
            raise ValueError(f"parameters.simulated_curve: {name!r} is not a file name in the "
                             f"model's folder {folder}")
        with safe_files.folder(folder, force=True, flag=None) as fd:
            return cls.parse(safe_files.read_at(fd, name).decode(), str(folder / name))

    def seconds_for(self, size: int) -> float:
        last = self.sizes[-1]
        if size >= last:
            return self.seconds[-1] * size / last
        return float(np.interp(size, self.sizes, self.seconds))


class SimulatedEngine:
    def __init__(self, device: str, model_path: Path, curve: BatchCurve,
                 options: EngineOptions) -> None:
        parsed = parse_device_name(device)
        if parsed is None:
            raise ValueError(f"simulated:{device}: name the device it stands for, as in "
                             "'simulated:gpu0'")
        self.device = Device(device, parsed[0], "simulated")
        # The model's signature only (with its uint8 inputs, where the options say so).
        signature = OnnxRuntimeEngine(model_path, 1, use_gpu=False,
                                      options=EngineOptions(uint8_inputs=options.uint8_inputs))
        self.inputs, self.outputs = signature.inputs, signature.outputs
        for output in self.outputs:
            if any(d < 0 for d in output.shape[1:]):
                raise ValueError(f"output {output.name!r} has the shape {list(output.shape)}: "
                                 "the simulated engine answers fixed shapes after the batch only")
        self._curve = curve
        self._device_memory: dict[str, np.ndarray] = {}

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        size = len(next(iter(inputs.values())))
        for name, array in inputs.items():  # the host-to-device copy (numpy drops the GIL)
            memory = self._device_memory.get(name)
            if memory is None or memory.size < array.size or memory.dtype != array.dtype:
                memory = self._device_memory[name] = np.empty(array.size, array.dtype)
            np.copyto(memory[:array.size].reshape(array.shape), array)
        time.sleep(max(0.0, start + self._curve.seconds_for(size) - time.perf_counter()))
        wanted = [o for o in self.outputs if o.name in outputs]
        return {o.name: _zeros(o, size) for o in wanted}


def _zeros(output: TensorSignature, size: int) -> np.ndarray:
    return np.zeros((size, *output.shape[1:]),
                    np.dtype(_NUMPY.get(output.datatype, output.datatype.lower())))
