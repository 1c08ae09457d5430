"""ONNX models as the project writes them (tools, benchmarks, tests): with the oldest IR version
that carries their opsets, so that every ONNX Runtime that runs those opsets reads them. onnx
writes its own newest IR by default (1.23: IR 14), which older runtimes refuse at load
(onnxruntime-gpu 1.31 reads IR 13 at most)."""

from __future__ import annotations

import onnx
from onnx import helper


def make_model(graph: onnx.GraphProto, opset: int, **kwargs: object) -> onnx.ModelProto:
    """`graph` in a model importing the default domain at `opset`."""
    imports = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=imports,
                             ir_version=helper.find_min_ir_version_for(imports), **kwargs)
