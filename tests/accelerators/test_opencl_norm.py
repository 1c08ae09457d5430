"""The normalizations (LayerNormalization, also spelled out as exporters before opset 17 emit it;
InstanceNormalization; GroupNorm as torch exports it and as opset 18's op) on both tilings, GELU
in its exact and tanh forms, ReduceSum, ReduceL2, ReduceMax and ReduceMean of adjacent axes, and
Resize, each in a small ONNX graph built with onnx.helper, run by the engine and by ONNX Runtime
on the same fresh random inputs (max relative error 1e-4); the fusions they get, and the
load-time refusals of what the engine does not handle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from accelerators.opencl.ir import UnsupportedModelError
from tests.support.numerics import SMALL_GRID, fresh_rng
from tests.support.onnx_graphs import check, check_fp16, gelu_nodes, graph

LN_SHAPES = [(2, 5, 7), (3, 96)] if SMALL_GRID else [(2, 5, 7), (3, 4, 96), (2, 3, 2, 130),
                                                     (1, 1, 1000)]


def _kernels(engine, batch: int) -> list[str]:
    return [la.kernel for la in engine.plan(batch).launches]


# The normalization kernel each tiling runs: a work-group per row on GPUs and FPGAs (the local
# tiles), a work-item per row on CPUs.
NORM_KERNEL = {False: "norm_rows_serial", True: "norm_rows"}
TILINGS = pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])


def _tiled(engine_for, local_tiles: bool):
    return lambda model: engine_for(model, local_tiles)


@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
@pytest.mark.parametrize("axis, eps", [(-1, 1e-5), (-1, 1e-6), (-2, 1e-3)])
@TILINGS
def test_layer_normalization(engine_for, shape, axis, eps, local_tiles) -> None:
    rng, seed = fresh_rng()
    normalized = shape[axis % len(shape):]
    consts = {"scale": rng.uniform(0.5, 1.5, normalized).astype(np.float32),
              "bias": rng.uniform(-1, 1, normalized).astype(np.float32)}
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=axis,
                            epsilon=eps)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    engine = check(_tiled(engine_for, local_tiles), graph([node], {"x": shape}, consts, ["y"]),
                   x=x)
    assert _kernels(engine, shape[0]) == [NORM_KERNEL[local_tiles]], seed


def _decomposed_layer_norm(opset: int, affine: bool, square: str) -> list:
    """torch's LayerNorm export before opset 17 (keras' uses Mul(d, d) for the square)."""
    def mean(src: str, dst: str):
        if opset >= 18:
            return helper.make_node("ReduceMean", [src, "axes"], [dst])
        return helper.make_node("ReduceMean", [src], [dst], axes=[-1])
    nodes = [mean("x", "m"), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow"
             else helper.make_node("Mul", ["d", "d"], ["sq"]),
             mean("sq", "v"), helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n" if affine else "y"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]),
                  helper.make_node("Add", ["g", "beta"], ["y"])]
    return nodes


@pytest.mark.parametrize("opset, affine, square", [(13, True, "Pow"), (18, True, "Mul"),
                                                   (13, False, "Pow")])
def test_decomposed_layer_norm_is_one_op(engine_for, opset, affine, square) -> None:
    rng, seed = fresh_rng()
    c = 48
    consts = {"two": np.float32(2.0), "eps": np.float32(1e-6),
              "gamma": rng.uniform(0.5, 1.5, c).astype(np.float32),
              "beta": rng.uniform(-1, 1, c).astype(np.float32), "axes": np.array([-1])}
    x = rng.standard_normal((2, 9, c)).astype(np.float32)
    engine = check(engine_for, graph(_decomposed_layer_norm(opset, affine, square),
                                     {"x": x.shape}, consts, ["y"], opset), x=x)
    assert engine.graph.fused["LayerNormalization(decomposed)"] == 1, seed
    assert _kernels(engine, 2) == [NORM_KERNEL[engine.build.tiling is not None]]


@TILINGS
def test_channels_first_layer_norm(engine_for, local_tiles) -> None:
    """The ConvNeXt authors' LayerNorm of NCHW tensors: the decomposed form over axis 1, scale
    and bias of shape (c, 1, 1); each (n, h, w) normalized over c, its values h * w apart."""
    rng, seed = fresh_rng()
    c = 24
    nodes = _decomposed_layer_norm(13, True, "Pow")
    for n in nodes:
        if n.op_type == "ReduceMean":
            n.attribute[0].ints[:] = [1]
    consts = {"two": np.float32(2.0), "eps": np.float32(1e-6),
              "gamma": rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32),
              "beta": rng.uniform(-1, 1, (c, 1, 1)).astype(np.float32)}
    x = rng.standard_normal((2, c, 5, 7)).astype(np.float32)
    engine = check(_tiled(engine_for, local_tiles), graph(nodes, {"x": x.shape}, consts, ["y"],
                                                          13), x=x)
    assert _kernels(engine, 2) == [NORM_KERNEL[local_tiles]], seed


def test_decomposed_layer_norm_over_axes_apart_is_refused(engine_for) -> None:
    """The fused op keeps the ReduceMeans' axes; over axes that are not adjacent it is no row
    normalization."""
    nodes = _decomposed_layer_norm(13, False, "Pow")
    for n in nodes:
        if n.op_type == "ReduceMean":
            n.attribute[0].ints[:] = [1, 3]
    model = graph(nodes, {"x": (2, 3, 4, 5)}, {"two": np.float32(2), "eps": np.float32(1e-5)},
                  ["y"], 13)
    with pytest.raises(UnsupportedModelError, match=r"LayerNormalization node .*only adjacent "
                                                    r"axes .*axes \[1, 3\]"):
        engine_for(model)


@pytest.mark.parametrize("form", ["erf", "erf_half_first", "tanh_pow", "tanh_mul"])
def test_gelu_is_one_activation(engine_for, form) -> None:
    nodes, consts = gelu_nodes(form)
    x = (fresh_rng()[0].standard_normal((3, 5, 17)) * 3).astype(np.float32)
    engine = check(engine_for, graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    approximate = "none" if form.startswith("erf") else "tanh"
    assert engine.graph.fused[f"Gelu({approximate})"] == 1
    assert _kernels(engine, 3) == ["activation"]


@pytest.mark.parametrize("producer", ["Gemm", "Conv"])
def test_gelu_fuses_into_the_op_before_it(engine_for, producer) -> None:
    rng, _ = fresh_rng()
    if producer == "Gemm":
        shape, consts = (4, 24), {"w": rng.standard_normal((24, 40)).astype(np.float32) * 0.3,
                                  "b": rng.standard_normal(40).astype(np.float32)}
    else:
        shape, consts = (2, 3, 9, 9), {"w": rng.standard_normal((8, 3, 3, 3)).astype(
            np.float32) * 0.3, "b": rng.standard_normal(8).astype(np.float32)}
    nodes, k = gelu_nodes("erf", "h")
    nodes.insert(0, helper.make_node(producer, ["x", "w", "b"], ["h"]))
    x = rng.standard_normal(shape).astype(np.float32)
    engine = check(engine_for, graph(nodes, {"x": shape}, consts | k, ["y"]), x=x)
    assert engine.graph.fused[f"{producer}+Gelu"] == 1
    assert "activation" not in _kernels(engine, shape[0])


def test_gelu_opset_20_op(engine_for) -> None:
    x = fresh_rng()[0].standard_normal((2, 33)).astype(np.float32)
    for approximate in ("none", "tanh"):
        node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
        check(engine_for, graph([node], {"x": x.shape}, {}, ["y"], 20), x=x)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 4, 30), (1, 2, 1, 300)], ids=str)
@TILINGS
def test_instance_normalization(engine_for, shape, local_tiles) -> None:
    rng, _ = fresh_rng()
    c = shape[1]
    consts = {"scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
              "bias": rng.uniform(-1, 1, c).astype(np.float32)}
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["h"],
                            epsilon=1e-4)
    nodes = [node, helper.make_node("Relu", ["h"], ["y"])]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    engine = check(_tiled(engine_for, local_tiles), graph(nodes, {"x": shape}, consts, ["y"]),
                   x=x)
    assert _kernels(engine, shape[0]) == [NORM_KERNEL[local_tiles]]  # the ReLU fused


@TILINGS
def test_group_norm_as_torch_exports_it(engine_for, local_tiles) -> None:
    """nn.GroupNorm(4, 12): Reshape (n, 4, -1), InstanceNormalization (unit scale from torch;
    any here), Reshape back (a shape read from the input), per-channel Mul and Add: one op."""
    rng, _ = fresh_rng()
    g, c = 4, 12
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["i"],
                              epsilon=1e-5),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Reshape", ["i", "shape"], ["back"]),
             helper.make_node("Mul", ["back", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["y"])]
    consts = {"grouped": np.array([0, g, -1]),
              "ones": rng.uniform(0.5, 1.5, g).astype(np.float32),
              "zeros": rng.uniform(-1, 1, g).astype(np.float32),
              "gamma": rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32),
              "beta": rng.uniform(-1, 1, (c, 1, 1)).astype(np.float32)}
    x = rng.standard_normal((2, c, 5, 6)).astype(np.float32)
    engine = check(_tiled(engine_for, local_tiles), graph(nodes, {"x": x.shape}, consts, ["y"]),
                   x=x)
    assert _kernels(engine, 2) == [NORM_KERNEL[local_tiles]]


@pytest.mark.parametrize("per", ["group", "channel"])
def test_group_normalization_op(engine_for, per) -> None:
    """Opset 18's op (scale and bias per group) and opset 21's (per channel)."""
    rng, _ = fresh_rng()
    g, c = 3, 6
    size, opset = (g, 18) if per == "group" else (c, 21)
    consts = {"scale": rng.uniform(0.5, 1.5, size).astype(np.float32),
              "bias": rng.uniform(-1, 1, size).astype(np.float32)}
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=g,
                            epsilon=1e-5)
    x = rng.standard_normal((2, c, 4, 5)).astype(np.float32)
    check(engine_for, graph([node], {"x": x.shape}, consts, ["y"], opset), x=x)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2", "ReduceMax", "ReduceMean"])
@pytest.mark.parametrize("shape, axes, keepdims", [
    ((2, 3, 5, 100), [-1], 1), ((4, 7, 9), [1, 2], 0), ((3, 70), None, 1),
    ((2, 49, 24), [1], 0),  # MLP-Mixer's mean over tokens
    ((2, 3, 2, 8, 5), [1], 1),  # ResNeSt's sum over the radix
    ((3, 2, 10), [0], 0),  # CrossViT's mean over its branches
    ((2, 6, 7, 16), [1, 2], 1)], ids=str)  # ConvNeXt V2's GRN: the L2 norm over h and w
@TILINGS
def test_reduction_of_adjacent_axes(engine_for, op, shape, axes, keepdims, local_tiles) -> None:
    # Centred away from 0: a sum of standard normals can land near 0 (a full reduction is one
    # number), where any order of float additions differs from ONNX Runtime's by more than the
    # relative tolerance.
    x = (fresh_rng()[0].standard_normal(shape) + 3).astype(np.float32)
    inputs, consts = ["x"], {}
    if axes is not None:
        inputs.append("axes")
        consts["axes"] = np.array(axes, np.int64)
    node = helper.make_node(op, inputs, ["y"], keepdims=keepdims)
    engine = check(_tiled(engine_for, local_tiles), graph([node], {"x": shape}, consts, ["y"],
                                                          18), x=x)
    # ReduceMean of trailing axes named: the global pool's kernel (torchvision's x.mean([2, 3]))
    trailing = axes is not None and sorted(a % len(shape) for a in axes)[-1] == len(shape) - 1
    row_kernel = "reduce_rows" if local_tiles else "reduce_rows_serial"
    assert _kernels(engine, shape[0]) == [
        "global_avg_pool" if op == "ReduceMean" and trailing else row_kernel]


RESIZES = [  # (mode, coordinate_transformation_mode, nearest_mode or cubic's option, target)
    ("nearest", "asymmetric", "floor", [1, 1, 2, 2]),  # torch's Upsample(scale_factor=2)
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 1.5, 0.5]),
    ("nearest", "align_corners", "round_prefer_ceil", (2, 3, 4, 11)),
    ("linear", "half_pixel", "", [1, 1, 2, 2]),
    ("linear", "pytorch_half_pixel", "", (2, 3, 1, 5)),
    ("linear", "align_corners", "", (2, 3, 13, 4)),
    ("linear", "asymmetric", "", [1, 1, 0.6, 3]),
    ("cubic", "half_pixel", "", [1, 1, 2, 2]),  # torch's bicubic interpolate (A = -0.75)
    ("cubic", "align_corners", "", (2, 3, 9, 4)),
    ("cubic", "asymmetric", "exclude_outside", [1, 1, 1.7, 0.5]),
]


@pytest.mark.parametrize("mode, coordinates, nearest, target", RESIZES, ids=str)
def test_resize(engine_for, mode, coordinates, nearest, target) -> None:
    x = fresh_rng()[0].standard_normal((2, 3, 7, 6)).astype(np.float32)
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    if nearest == "exclude_outside":
        attrs |= {"exclude_outside": 1, "cubic_coeff_a": -0.5}
    elif nearest:
        attrs["nearest_mode"] = nearest
    if isinstance(target, list):
        inputs, consts = ["x", "", "scales"], {"scales": np.array(target, np.float32)}
    else:
        inputs, consts = ["x", "", "", "sizes"], {"sizes": np.array(target, np.int64)}
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    engine = check(engine_for, graph([node], {"x": x.shape}, consts, ["y"]), x=x)
    assert _kernels(engine, 2) == ["resize2d"]


@pytest.mark.parametrize("node, shape, consts, message", [
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1,
                      name="down"), (1, 2, 4, 4),
     {"scales": np.array([1, 1, 0.5, 0.5], np.float32)},
     r"Resize node 'down': attribute antialias 1"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="crop",
                      coordinate_transformation_mode="tf_crop_and_resize"),
     (1, 2, 4, 4), {"scales": np.array([1, 1, 2, 2], np.float32)},
     r"Resize node 'crop': attribute coordinate_transformation_mode 'tf_crop_and_resize'"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], name="deep"), (1, 2, 4, 4),
     {"scales": np.array([1, 2, 2, 2], np.float32)}, r"Resize node 'deep': resizes the batch or "
     r"channel axis"),
    (helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="flat"), (2, 3),
     {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32)},
     r"InstanceNormalization node 'flat': input of rank 2"),
    (helper.make_node("LayerNormalization", ["x", "x"], ["y"], name="ln"), (2, 3), {},
     r"LayerNormalization node 'ln': input 'x' is not constant"),
], ids=["antialias", "crop", "channels", "rank2", "scale"])
def test_what_is_refused_at_load(engine_for, node, shape, consts, message) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        engine_for(graph([node], {"x": shape}, consts, ["y"]))


@pytest.mark.parametrize("node, shape, consts", [
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear"), (2, 3, 7, 6),
     {"scales": np.array([1, 1, 2, 1.5], np.float32)}),
    (helper.make_node("ReduceL2", ["x", "axes"], ["y"]), (3, 5, 40),
     {"axes": np.array([-1], np.int64)}),
    (helper.make_node("Gelu", ["x"], ["y"]), (4, 33), {}),
    (helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2), (2, 4, 5, 5),
     {"s": np.full(4, 1.5, np.float32), "b": np.full(4, 0.5, np.float32)})],
    ids=["Resize", "ReduceL2", "Gelu", "GroupNormalization"])
@TILINGS
def test_half_storage(engine_for, node, shape, consts, local_tiles) -> None:
    """fp16 models (docs/opencl.md's Precisions): within test_opencl_fp16's bound of FP32."""
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    check_fp16(engine_for, graph([node], {"x": shape}, consts, ["y"], 21), {"x": x}, seed,
                local_tiles)
