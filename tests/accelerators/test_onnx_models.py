"""Models the project writes carry the oldest IR version of their opsets, which every ONNX
Runtime the project supports reads (onnxruntime-gpu 1.31 refuses onnx 1.23's default IR 14)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from accelerators.onnx_models import make_model
from tools.cnn_architectures import ARCHITECTURES

# ONNX Runtime 1.20, the oldest the project installs, reads IR 10 at most.
OLDEST_RUNTIME_IR = 10


@pytest.mark.parametrize("opset, ir", [(9, 4), (13, 7), (17, 8), (21, 10)])
def test_a_model_takes_the_oldest_ir_version_of_its_opset(opset, ir) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = make_model(graph, opset)
    onnx.checker.check_model(model)
    assert model.ir_version == ir and model.opset_import[0].version == opset
    assert onnx.IR_VERSION > OLDEST_RUNTIME_IR  # what onnx would have written instead


def test_every_architecture_the_tools_build_is_readable_by_the_oldest_runtime() -> None:
    for name, build in ARCHITECTURES.items():
        model = build(0, 32) if "size" in build.__code__.co_varnames else build(0)
        assert model.ir_version <= OLDEST_RUNTIME_IR, name
