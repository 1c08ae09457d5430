"""The least size of each variable input dim (accelerators/input_minimums.py) is exact: both
engines run a request at the minimum, and neither gives a non-empty answer one below it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accelerators.input_minimums import minimum_sizes
from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from tests.support.onnx_graphs import agrees_with_onnxruntime

RNG = np.random.default_rng(45)


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.normal(0, 0.5, shape).astype(np.float32), name)


def _model(nodes: list[onnx.NodeProto], shape: list, inits: list[onnx.TensorProto]
           ) -> onnx.ModelProto:
    return make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits), 17)


def strided_stack() -> onnx.ModelProto:
    """Conv 3x3 stride (2, 1) padded on the height only, MaxPool 2x2 stride 2, Conv 3x3
    dilation 2: the height needs (5 - 1) * 2 + 2 = 10 after the first conv, so 19; the width
    10 + 2 = 12."""
    return _model([helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 1],
                                    pads=[1, 0, 1, 0]),
                   helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2],
                                    strides=[2, 2]),
                   helper.make_node("Conv", ["p", "w2"], ["y"], dilations=[2, 2])],
                  ["n", 2, "h", "w"], [_weight("w1", (4, 2, 3, 3)), _weight("w2", (3, 4, 3, 3))])


def nhwc_with_shape_code() -> onnx.ModelProto:
    """tf2onnx's channels-last input transposed for an unpadded 5x5 Conv, then an average pool
    3x3 stride 2 with ceil_mode, flattened by PyTorch-style shape code (Shape, Gather,
    Constant, Concat, Reshape). ceil_mode keeps a window that starts inside and overhangs, so
    the pool takes 1: 5 + 1 = 6 on both spatial dims, axes 1 and 2."""
    const = [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(
        np.array(v, np.int64), n)) for n, v in (("zero", 0), ("minus", [-1]), ("axes", [0]))]
    return _model([*const,
                   helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]),
                   helper.make_node("Conv", ["nchw", "w"], ["c"]),
                   helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 3],
                                    strides=[2, 2], ceil_mode=1),
                   helper.make_node("Shape", ["p"], ["s"]),
                   helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                   helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
                   helper.make_node("Concat", ["n1", "minus"], ["target"], axis=0),
                   helper.make_node("Reshape", ["p", "target"], ["y"])],
                  ["n", "h", "w", 3], [_weight("w", (2, 3, 5, 5))])


def padded() -> onnx.ModelProto:
    """A padded 3x3 Conv and a global pool take any size."""
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("GlobalAveragePool", ["c"], ["y"])],
                  ["n", 1, "h", "w"], [_weight("w", (2, 1, 3, 3))])


CASES = {  # model, config dims after the batch axis, the minimums expected
    "strided_stack": (strided_stack, (2, -1, -1), {"x": {2: 19, 3: 12}}),
    "nhwc_with_shape_code": (nhwc_with_shape_code, (-1, -1, 3), {"x": {1: 6, 2: 6}}),
    "padded": (padded, (1, -1, -1), {}),
}


def _onnxruntime_answers(model: onnx.ModelProto, shape: tuple[int, ...]) -> bool:
    """Whether ONNX Runtime runs `shape` to non-empty outputs."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusals below the minimum are expected
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    try:
        outputs = session.run(None, {"x": np.ones(shape, np.float32)})
    except Exception:  # onnxruntime's own error types
        return False
    return all(o.size > 0 for o in outputs)


def _opencl_answers(engine: OpenCLEngine, shape: tuple[int, ...]) -> bool:
    try:
        return engine.run({"x": np.ones(shape, np.float32)}, ["y"])["y"].size > 0
    except Exception:  # the lowering's refusal, whichever type
        return False


@pytest.mark.parametrize("case", CASES)
def test_the_minimum_runs_on_both_engines_and_one_less_does_not(
        tmp_path: Path, case: str, opencl_device: str, program_cache) -> None:
    build, dims, expected = CASES[case]
    model = build()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    found = minimum_sizes(path, {"x": dims}, batched=True)
    assert found == expected
    least = tuple(found.get("x", {}).get(axis, 1) for axis in range(1, 4))
    shape = (2, *(d if d != -1 else m for d, m in zip(dims, least)))
    engine = OpenCLEngine(path, opencl_device, program_cache, served={"x": dims})
    agrees_with_onnxruntime(engine, model, {"x": RNG.normal(size=shape).astype(np.float32)},
                            1e-4)
    for axis, size in found.get("x", {}).items():
        smaller = shape[:axis] + (size - 1,) + shape[axis + 1:]
        assert not _onnxruntime_answers(model, smaller), smaller
        assert not _opencl_answers(engine, smaller), smaller


def test_axes_count_from_the_request_shape_where_there_is_no_batch_axis(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(strided_stack(), str(path))
    assert minimum_sizes(path, {"x": (1, 2, -1, 16)}, batched=False) == {"x": {2: 19}}
