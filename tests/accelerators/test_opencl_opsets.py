"""Constant and shape folding at every opset from 7 to 21: the ops whose inputs are known on the
host are evaluated by ONNX's reference evaluator at the model's own opset, so each op is read in
its version's spelling (Unsqueeze's, Squeeze's, ReduceSum's and Split's axes or sizes as
attributes before opset 13 and as inputs from it, Slice's bounds as attributes before 10).
Against onnxruntime at the same opset."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from accelerators.onnx_models import make_model
from tests.support.numerics import fresh_rng, rel_err


def _versioned(op: str, inputs: list[str], output: str, opset: int, since: int,
               consts: dict[str, np.ndarray], **attrs: list[int]) -> onnx.NodeProto:
    """`op` with its list attributes as attributes before opset `since`, as constant inputs
    from it (in the order given)."""
    if opset < since:
        return helper.make_node(op, inputs, [output], **attrs)
    names = []
    for key, value in attrs.items():
        names.append(f"{output}_{key}")
        consts[names[-1]] = np.array(value, np.int64)
    return helper.make_node(op, inputs + names, [output])


def _model(opset: int, w: np.ndarray) -> onnx.ModelProto:
    """x (1, 3, 4) reshaped to (1, 12) by shape code (Shape, Gather, Mul, Unsqueeze, Concat),
    plus a constant (1, 12) row folded through ReduceSum, Squeeze, Unsqueeze, Split, Concat and
    Slice."""
    consts = {"w": w, "two": np.array(2, np.int64), "three": np.array(3, np.int64),
              "one": np.array([1], np.int64)}
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["width"]),
        helper.make_node("Mul", ["width", "three"], ["flat"]),
        _versioned("Unsqueeze", ["flat"], "flat1", opset, 13, consts, axes=[0]),
        helper.make_node("Concat", ["one", "flat1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["rows"]),
        _versioned("ReduceSum", ["w"], "summed", opset, 13, consts, axes=[0]),
        _versioned("Squeeze", ["summed"], "row", opset, 13, consts, axes=[0]),
        _versioned("Unsqueeze", ["row"], "row2", opset, 13, consts, axes=[0]),
        _versioned("Split", ["row2"], "left", opset, 13, consts, split=[4, 8]),
        helper.make_node("Concat", ["left", "right"], ["joined"], axis=1),
        _versioned("Slice", ["joined"], "sliced", opset, 10, consts, starts=[0], ends=[12],
                   axes=[1]),
        helper.make_node("Add", ["rows", "sliced"], ["y"])]
    split = nodes[9]
    split.output.append("right")
    split.attribute.append(helper.make_attribute("axis", 1))
    nodes[6].attribute.append(helper.make_attribute("keepdims", 1))
    graph = helper.make_graph(
        nodes, f"opset{opset}", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                               [1, 3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 12])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return make_model(graph, opset)


@pytest.mark.parametrize("opset", range(7, 22))
def test_folding_reads_each_op_in_its_opsets_spelling(engine_for, opset) -> None:
    rng, seed = fresh_rng()
    model = _model(opset, rng.standard_normal((2, 12)).astype(np.float32))
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    engine = engine_for(model)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], ref) <= 1e-6, seed
    assert [la.kernel for la in engine.plan(1).launches] == ["binary4d"]  # the rest folded
