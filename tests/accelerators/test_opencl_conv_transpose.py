"""ConvTranspose on activations (decoders, segmentation heads, super-resolution, text
detectors' upsampling), one op at a time against onnxruntime: strides, pads, output_padding,
dilations, groups, output_shape and auto_pad, 1-D and 2-D, with bias and a fused ReLU; and its
refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from accelerators.opencl.ir import UnsupportedModelError
from tests.support.numerics import fresh_rng, rel_err
from tests.support.onnx_graphs import single_op

# (input shape, weight shape (C_in, C_out / group, *kernel), attributes)
CASES = [
    ((1, 4, 5, 5), (4, 3, 3, 3), {}),
    ((2, 4, 5, 6), (4, 3, 2, 2), {"strides": [2, 2]}),  # 2x upsampling, as decoders do
    ((1, 4, 7, 5), (4, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [1, 1]}),
    ((1, 6, 4, 4), (6, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 4, 4, 5), (4, 2, 3, 2), {"dilations": [2, 1], "strides": [1, 3]}),
    ((1, 8, 4, 4), (8, 1, 4, 4), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 10]}),
    ((1, 4, 5, 5), (4, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 5, 5), (4, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 9), (3, 4, 4), {"strides": [2], "pads": [1, 1]}),  # 1-D
]


def _reference(model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose_matches_onnxruntime(engine_for, case, bias) -> None:
    shape, wshape, attrs = case
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    consts = {"w": rng.standard_normal(wshape).astype(np.float32)}
    if bias:
        consts["b"] = rng.standard_normal(wshape[1] * attrs.get("group", 1)).astype(np.float32)
    model = single_op("ConvTranspose", {"x": x}, consts, (1,), **attrs)
    model.graph.output[0].type.tensor_type.ClearField("shape")
    ref = _reference(model, x)
    engine = engine_for(model)
    assert [la.kernel for la in engine.plan(shape[0]).launches] == ["conv_transpose"]
    got = engine.run({"x": x}, ["y"])["y"]
    assert got.shape == ref.shape and rel_err(got, ref) <= 1e-4, seed


def test_a_relu_after_it_is_fused(engine_for) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    model = single_op("ConvTranspose", {"x": x}, {"w": rng.standard_normal(
        (4, 2, 2, 2)).astype(np.float32)}, (1, 2, 10, 10), strides=[2, 2])
    from onnx import helper
    model.graph.node[0].output[0] = "t"
    model.graph.node.append(helper.make_node("Relu", ["t"], ["y"]))
    engine = engine_for(model)
    assert engine.graph.fused["ConvTranspose+Relu"] == 1
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(model, x)) <= 1e-4, seed


def test_weights_that_are_activations_are_refused(engine_for) -> None:
    x = np.zeros((1, 2, 3, 3), np.float32)
    model = single_op("ConvTranspose", {"x": x, "w": np.zeros((2, 2, 3, 3), np.float32)}, {},
                      (1, 2, 5, 5))
    with pytest.raises(UnsupportedModelError, match="ConvTranspose node .* constant weights"):
        engine_for(model)
