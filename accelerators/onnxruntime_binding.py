"""One ONNX Runtime session for one batch size, run through IO binding: outputs live in buffers on
the session's device, bound once; each run copies every input in once and every output out once.
Inputs are handed to ONNX Runtime as host arrays, which it copies on its own stream, in order with
the compute. A copy into a bound device buffer (OrtValue.update_inplace) is not in that order: on an
H200, a node the CUDA provider leaves to the CPU read the input before it arrived (184 of 200 runs
wrong). Only CUDA graphs, which need fixed input addresses and hold every node on the GPU, keep
such buffers."""

from __future__ import annotations

from typing import Any

import numpy as np


def _numpy_dtype(onnx_type: str) -> np.dtype:
    """`tensor(float)` -> float32."""
    name = onnx_type.removeprefix("tensor(").removesuffix(")")
    return np.dtype({"float": "float32", "double": "float64"}.get(name, name))


def fixed_shape(shape: list, batch: int) -> tuple[int, ...] | None:
    """The shape at `batch` rows; None when another dimension is left free by the model."""
    dims = (batch, *shape[1:])
    return dims if all(isinstance(d, int) and d >= 0 for d in dims) else None


class BoundSession:
    def __init__(self, ort, session, batch: int, device: tuple[str, int],
                 graphs: bool = False) -> None:
        self._session = session
        self._binding = session.io_binding()
        self._on_cpu = device[0] == "cpu"  # CPU buffers are shared with numpy: copy outputs
        self._inputs: dict[str, Any] = {}  # name -> onnxruntime.OrtValue, for CUDA graphs
        self._outputs: dict[str, Any] = {}
        bound = [(session.get_outputs(), self._outputs, self._binding.bind_ortvalue_output)]
        if graphs:
            bound.append((session.get_inputs(), self._inputs, self._binding.bind_ortvalue_input))
        for args, values, bind in bound:
            for arg in args:
                values[arg.name] = ort.OrtValue.ortvalue_from_shape_and_type(
                    fixed_shape(arg.shape, batch), _numpy_dtype(arg.type), *device)
                bind(arg.name, values[arg.name])

    @staticmethod
    def possible(session, batch: int) -> bool:
        """Whether every input and output has a fixed shape at `batch` rows."""
        return all(fixed_shape(a.shape, batch) for a in (*session.get_inputs(),
                                                         *session.get_outputs()))

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        arrays = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        for name, array in arrays.items():  # held until the run has read them
            if self._inputs:
                self._inputs[name].update_inplace(array)
            else:
                self._binding.bind_cpu_input(name, array)
        self._session.run_with_iobinding(self._binding)
        return {name: self._outputs[name].numpy().copy() if self._on_cpu
                else self._outputs[name].numpy() for name in outputs}
