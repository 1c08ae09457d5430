"""One ONNX Runtime session for one batch size, run through IO binding: inputs and outputs live
in buffers on the session's device, bound once (fixed addresses, as the CUDA provider's graphs
need); each run copies every input in once and every output out once."""

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
    def __init__(self, ort, session, batch: int, device: tuple[str, int]) -> None:
        self._session = session
        self._binding = session.io_binding()
        self._on_cpu = device[0] == "cpu"  # CPU buffers are shared with numpy: copy outputs
        self._inputs: dict[str, Any] = {}  # name -> onnxruntime.OrtValue
        self._outputs: dict[str, Any] = {}
        for args, values, bind in ((session.get_inputs(), self._inputs,
                                    self._binding.bind_ortvalue_input),
                                   (session.get_outputs(), self._outputs,
                                    self._binding.bind_ortvalue_output)):
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
        for name, array in inputs.items():
            self._inputs[name].update_inplace(np.ascontiguousarray(array))
        self._session.run_with_iobinding(self._binding)
        return {name: self._outputs[name].numpy().copy() if self._on_cpu
                else self._outputs[name].numpy() for name in outputs}
