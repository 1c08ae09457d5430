"""Variable dims (-1 in config.pbtxt) on the OpenCL engine: planned per request shape and agreeing
with ONNX Runtime at each, the plans of a bounded number of shapes kept (the least recently used
evicted, and counted), and a model that cannot be planned at other sizes refused at load naming
the dim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.ir import UnsupportedModelError
from tests.support.numerics import rel_err
from tests.support.onnx_graphs import sized_head


def recognizer(path: Path) -> onnx.ModelProto:
    """(n, 1, 6, w), w symbolic, as a text recognizer's line: Conv and Relu, a linear Resize
    (tables sized by the width: a constant per shape) and exporters' shape code reshaping to
    (n, 4, -1) (folded per shape)."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 1, 6, "w"])
    z = helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["n", 4, "l"])
    inits = [numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "k"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "rest")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="linear"),
             helper.make_node("Shape", ["y"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["lead"]),
             helper.make_node("Concat", ["lead", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["z"])]
    model = make_model(helper.make_graph(nodes, "recognizer", [x], [z], inits), 17)
    onnx.save(model, str(path))
    return model


def test_variable_dims_are_planned_per_request_shape(tmp_path, opencl_device,
                                                     program_cache) -> None:
    model = recognizer(tmp_path / "m.onnx")
    engine = OpenCLEngine(tmp_path / "m.onnx", opencl_device, program_cache,
                          served={"x": (1, 6, -1)})
    assert engine.inputs[0].shape == (-1, 1, 6, -1)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, width in ((1, 5), (3, 17), (2, 9), (1, 5), (14, 9)):  # 14: CPUs run slices
        x = rng.standard_normal((batch, 1, 6, width)).astype(np.float32)
        got = engine.run({"x": x}, ["z"])["z"]
        ref = session.run(None, {"x": x})[0]
        assert got.shape == ref.shape == (batch, 4, 12 * 2 * width)
        assert rel_err(got, ref) < 1e-5, (batch, width)
    assert engine.plan_counts["evicted"] == 0


def test_the_plans_of_the_least_recently_used_shape_are_evicted_and_counted(
        tmp_path, opencl_device, program_cache) -> None:
    recognizer(tmp_path / "m.onnx")
    engine = OpenCLEngine(tmp_path / "m.onnx", opencl_device, program_cache, max_shapes=2)
    events: list[tuple[str, int]] = []
    engine.report_plans(lambda event, count: events.append((event, count)))

    def run(width: int) -> np.ndarray:
        return engine.run({"x": np.ones((1, 1, 6, width), np.float32)}, ["z"])["z"]

    first = run(4)
    run(6)
    assert engine.plan_counts == {"built": 2, "evicted": 0}
    run(8)  # a third shape: width 4's plan goes
    assert engine.plan_counts == {"built": 3, "evicted": 1}
    np.testing.assert_array_equal(run(4), first)  # planned again (evicting width 6's)
    run(8)  # kept
    assert engine.plan_counts == {"built": 4, "evicted": 2}
    assert events == [("built", 1)] * 2 + [("evicted", 1), ("built", 1)] * 2


def test_plans_built_at_load_are_reported_once_a_listener_comes(tmp_path, opencl_device,
                                                                program_cache) -> None:
    recognizer(tmp_path / "m.onnx")
    engine = OpenCLEngine(tmp_path / "m.onnx", opencl_device, program_cache,
                          served={"x": (1, 6, 10)})  # fixed: batch 1 planned at load
    events: list[tuple[str, int]] = []
    engine.report_plans(lambda event, count: events.append((event, count)))
    engine.run({"x": np.ones((2, 1, 6, 10), np.float32)}, ["z"])
    assert events == [("built", 1), ("built", 1)]


def test_a_dim_the_model_cannot_be_planned_at_other_sizes_is_refused_by_name(
        tmp_path, opencl_device, program_cache) -> None:
    """A width declared variable in front of a head that fixes it."""
    sized_head(tmp_path / "head.onnx")
    with pytest.raises(UnsupportedModelError, match=r"input 'x': dim 2 is variable .* "
                                                    r"last axis has 192 values, the matrix 96"):
        OpenCLEngine(tmp_path / "head.onnx", opencl_device, program_cache, served={"x": (3, -1)})
    engine = OpenCLEngine(tmp_path / "head.onnx", opencl_device, program_cache,
                          served={"x": (3, 32)})
    np.testing.assert_allclose(engine.run({"x": np.ones((1, 3, 32), np.float32)}, ["y"])["y"],
                               np.full((1, 4), 96.0))
