"""Small ONNX graphs and the checks of the OpenCL engine's answers against ONNX Runtime or a
float64 reference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from tests.support.numerics import fresh_rng, rel_err


def agrees_with_onnxruntime(engine: OpenCLEngine, model: onnx.ModelProto,
                            feeds: dict[str, np.ndarray], tolerance: float) -> None:
    """Every graph output of `engine` has onnxruntime's shape and is within `tolerance`
    (rel_err) of its values, on the same feeds."""
    names = [o.name for o in model.graph.output]
    refs = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(names, feeds)
    got = engine.run(feeds, names)
    for name, ref in zip(names, refs):
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        err = rel_err(got[name], ref)
        assert err <= tolerance, f"{name}: relative error {err}"


def single_op(op: str, dynamic: dict[str, np.ndarray], consts: dict[str, np.ndarray],
              out_shape: tuple[int, ...], opset: int = 17, **attrs) -> onnx.ModelProto:
    """A one-node model: `dynamic` become graph inputs, `consts` initializers, in the order
    given (dynamic first), feeding `op` whose output is `y`."""
    names = list(dynamic) + list(consts)
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(a.shape))
                     for n, a in dynamic.items()],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return make_model(graph, opset)


def literal_qdq(path) -> ort.InferenceSession:
    """onnxruntime running each QuantizeLinear, DequantizeLinear and fp32 op as written."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def output_step(path, output: str) -> float:
    """The scale of the QuantizeLinear that produces the graph output."""
    model = onnx.load(str(path))
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if output in n.output)
    return float(consts[dq.input[1]])


TOL = 1e-4


def graph(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]],
          consts: dict[str, np.ndarray], outputs: list[str], opset: int = 17) -> onnx.ModelProto:
    model = make_model(helper.make_graph(
        nodes, "ops", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                       for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in consts.items()]), opset)
    return model


def check(engine_for, model: onnx.ModelProto, **arrays: np.ndarray):
    """Runs both and compares every graph output; returns the engine."""
    engine = engine_for(model)
    agrees_with_onnxruntime(engine, model, arrays, TOL)
    return engine


# n, c, h, w, out channels, kernel, stride, pads (top, left, bottom, right), dilation, groups
CONV = [
    (1, 3, 7, 9, 5, 3, 1, (1, 1, 1, 1), 1, 1),
    (2, 4, 11, 11, 8, 3, 2, (1, 1, 1, 1), 1, 1),
    (1, 8, 9, 9, 8, 3, 1, (1, 1, 1, 1), 1, 8),  # depthwise
    (2, 6, 10, 7, 9, 3, 1, (0, 1, 1, 0), 2, 3),  # groups, dilation, asymmetric pads
    (1, 16, 5, 5, 24, 1, 1, (0, 0, 0, 0), 1, 1),  # 1x1: the GEMM reads the input directly
    (3, 5, 13, 10, 17, 1, 2, (0, 0, 0, 0), 1, 1),  # 1x1 stride 2
    (1, 3, 23, 23, 16, 7, 2, (3, 3, 3, 3), 1, 1),
    (64, 1, 12, 12, 16, 5, 1, (2, 2, 2, 2), 1, 1),
    (64, 8, 9, 9, 12, 3, 2, (1, 1, 1, 1), 1, 2),
    (2, 6, 11, 11, 12, 5, 2, (2, 1, 2, 1), 1, 6),  # depthwise, two outputs per channel
]


def conv_model(case: tuple, relu: bool) -> tuple[np.ndarray, onnx.ModelProto, np.ndarray, int]:
    """A CONV case's input, its one-Conv model (+ Relu, which is fused into the same launch),
    the float64 reference and the random seed."""
    n, c, h, w, oc, k, s, pads, d, g = case
    rng, seed = fresh_rng()
    x = rng.standard_normal((n, c, h, w), np.float32)
    wt = rng.standard_normal((oc, c // g, k, k), np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    ref = conv_ref(x, wt, b, (s, s), pads, (d, d), g)
    model = single_op("Conv", {"x": x}, {"w": wt, "b": b}, ref.shape, kernel_shape=[k, k],
                      strides=[s, s], pads=list(pads), dilations=[d, d], group=g)
    if relu:
        model.graph.node[0].output[0] = "conv"
        model.graph.node.append(helper.make_node("Relu", ["conv"], ["y"]))
        ref = np.maximum(ref, 0)
    return x, model, ref, seed


def gelu_nodes(form: str, x: str = "x", y: str = "y") -> tuple[list, dict]:
    """GELU as torch exports it before opset 20: exact (Div by sqrt 2, Erf, Add 1, Mul x,
    Mul 0.5; `half_first`: x * 0.5 first) or tanh (with Pow(x, 3) or x * x * x)."""
    k = {"sqrt2": np.float32(math.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5),
         "c": np.float32(0.044715), "s": np.float32(math.sqrt(2 / math.pi)),
         "three": np.float32(3)}
    if form.startswith("erf"):
        core = [helper.make_node("Div", [x, "sqrt2"], ["g_div"]),
                helper.make_node("Erf", ["g_div"], ["g_core"])]
    else:
        cube = [helper.make_node("Pow", [x, "three"], ["g_cube"])] if form == "tanh_pow" else [
            helper.make_node("Mul", [x, x], ["g_sq"]), helper.make_node("Mul", [x, "g_sq"],
                                                                         ["g_cube"])]
        core = cube + [helper.make_node("Mul", ["c", "g_cube"], ["g_c"]),
                       helper.make_node("Add", [x, "g_c"], ["g_in"]),
                       helper.make_node("Mul", ["g_in", "s"], ["g_arg"]),
                       helper.make_node("Tanh", ["g_arg"], ["g_core"])]
    core.append(helper.make_node("Add", ["g_core", "one"], ["g_add"]))
    if form == "erf_half_first":
        core += [helper.make_node("Mul", [x, "half"], ["g_half"]),
                 helper.make_node("Mul", ["g_half", "g_add"], [y])]
    else:
        core += [helper.make_node("Mul", [x, "g_add"], ["g_mul"]),
                 helper.make_node("Mul", ["g_mul", "half"], [y])]
    return core, k


def check_fp16(engine_for, model, inputs: dict[str, np.ndarray], seed: int,
                local_tiles: bool | None = None) -> OpenCLEngine:
    engine = engine_for(model, local_tiles, precision="fp16")
    assert engine.build.half
    got = engine.run(inputs, ["y"])["y"]
    ref = fp32_reference(model, inputs)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert rel_err(got, ref) <= OP_TOL, f"relative error {rel_err(got, ref):.2e} (seed {seed})"
    return engine


def check_batches(engine_for, model, shapes: dict[str, tuple], batches=(1, 3), positive=False,
                  **load) -> None:
    """Runs both at each batch size (the graph's "n"), fresh inputs each time."""
    engine = engine_for(model, **load)
    names = [o.name for o in model.graph.output]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in batches:
        rng, seed = fresh_rng()
        arrays = {k: rng.standard_normal([n if d == "n" else d for d in s], np.float32)
                  for k, s in shapes.items()}
        if positive:
            arrays = {k: np.abs(v) + 0.1 for k, v in arrays.items()}
        got = engine.run(arrays, names)
        for name, ref in zip(names, session.run(names, arrays)):
            assert got[name].shape == ref.shape, (name, n, got[name].shape, ref.shape)
            assert rel_err(got[name], ref) <= TOL, (name, n, seed, rel_err(got[name], ref))


def conv_ref(x, w, b, strides, pads, dilations, groups):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oc, cg, kh, kw = w.shape
    extent = ((kh - 1) * dilations[0] + 1, (kw - 1) * dilations[1] + 1)
    win = sliding_window_view(x, extent, axis=(2, 3))[
        :, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]
    mg = oc // groups
    out = np.concatenate([np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg],
                                    w[g * mg:(g + 1) * mg].astype(np.float64))
                          for g in range(groups)], axis=1)
    return out + b[None, :, None, None]


OP_TOL = 5e-3


def fp32_reference(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # test_other_ops first declares a placeholder output shape
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(["y"], inputs)[0].astype(np.float64)


def symbolic_conv(path: Path) -> onnx.ModelProto:
    """A Conv over (n, 3, h, w), all but the channels symbolic, as detectors export."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4, "h", "w"])
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    model = make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "g", [x], [y], [w]), 17)
    onnx.save(model, str(path))
    return model


def sized_head(path: Path) -> None:
    """(n, 3, w), w symbolic, flattened into a classifier head whose weights fix w at 32."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, "w"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])
    w = numpy_helper.from_array(np.ones((96, 4), np.float32), "w")
    model = make_model(helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["y"])],
        "head", [x], [y], [w]), 17)
    onnx.save(model, str(path))
