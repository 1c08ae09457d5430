"""Every kernel against a float64 numpy reference on fresh random inputs over a grid of shapes
(odd sizes, padding, stride 2, groups and depthwise, batch 1 and 64): max relative error 1e-4.
Each case is a one-node ONNX model run through the engine, so the lowering's arguments are
checked along with the kernels."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper

from tests.support.numerics import SMALL_GRID, fresh_rng, rel_err
from tests.support.onnx_graphs import CONV, conv_model, single_op

TOL = 1e-4


def _grid(cases: list, small: int) -> list:
    """Under Oclgrind, the first `small` cases only."""
    return cases[:small] if SMALL_GRID else cases


def _check(engine, inputs: dict[str, np.ndarray], ref: np.ndarray, seed: int) -> None:
    got = engine.run(inputs, ["y"])["y"]
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert rel_err(got, ref) <= TOL, f"relative error {rel_err(got, ref):.2e} (seed {seed})"


# GEMMs with register tiles (CPUs) and through local memory (GPUs, FPGAs).
TILES = pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])


@pytest.mark.parametrize("case", _grid(CONV, 4), ids=str)
@pytest.mark.parametrize("activation", ["none", "Relu"])
@TILES
def test_conv(engine_for, case, activation, local_tiles) -> None:
    n, c, _, _, _, k, _, _, _, g = case
    x, model, ref, seed = conv_model(case, relu=activation == "Relu")
    engine = engine_for(model, local_tiles)
    kernels = [la.kernel for la in engine.plan(n).launches]
    if c == g > 1 and local_tiles:  # depthwise on GPUs and FPGAs: a direct kernel
        assert kernels == ["conv_depthwise"]
    elif local_tiles and k > 1:  # an implicit GEMM: no im2col buffer
        assert kernels == ["conv_local"]
    _check(engine, {"x": x}, ref, seed)


@pytest.mark.parametrize("m, k, n, trans_b, alpha, beta", _grid([
    (1, 37, 19, 1, 1.0, 1.0), (1, 2500, 37, 1, 1.0, 1.0),  # the second splits K
    (64, 300, 130, 1, 1.0, 1.0), (9, 16, 16, 0, 0.5, 2.0), (3, 1, 5, 0, 1.0, 1.0),
    (64, 9216, 128, 1, 1.0, 1.0), (8, 33, 1000, 1, 1.0, 0.0)], 4))
@TILES
def test_gemm(engine_for, m, k, n, trans_b, alpha, beta, local_tiles) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((n, k) if trans_b else (k, n), np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ref = alpha * x.astype(np.float64) @ (w.T if trans_b else w).astype(np.float64) + beta * b
    model = single_op("Gemm", {"x": x}, {"w": w, "b": b}, ref.shape, transB=trans_b,
                      alpha=alpha, beta=beta)
    _check(engine_for(model, local_tiles), {"x": x}, ref, seed)


def test_matmul(engine_for) -> None:
    rng, seed = fresh_rng()
    x, w = rng.standard_normal((5, 21), np.float32), rng.standard_normal((21, 17), np.float32)
    _check(engine_for(single_op("MatMul", {"x": x}, {"w": w}, (5, 17))), {"x": x},
           x.astype(np.float64) @ w, seed)


def pool_ref(x, kind, k, s, pads, ceil, count_pad):
    n, c, h, w = x.shape
    out = []
    for size, p0, p1 in ((h, pads[0], pads[2]), (w, pads[1], pads[3])):
        o = (size + p0 + p1 - k + (s - 1 if ceil else 0)) // s + 1
        if ceil and (o - 1) * s >= size + p0:
            o -= 1
        out.append(o)
    extra = [max(0, (out[0] - 1) * s + k - (h + pads[0] + pads[2])),
             max(0, (out[1] - 1) * s + k - (w + pads[1] + pads[3]))]
    widths = ((0, 0), (0, 0), (pads[0], pads[2] + extra[0]), (pads[1], pads[3] + extra[1]))
    fill = -np.inf if kind == "MaxPool" else 0.0
    xp = np.pad(x.astype(np.float64), widths, constant_values=fill)
    counted = np.pad(np.ones((h, w)), ((pads[0], pads[2]), (pads[1], pads[3])),
                     constant_values=1.0 if count_pad else 0.0)
    counted = np.pad(counted, ((0, extra[0]), (0, extra[1])))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s][:, :, :out[0], :out[1]]
    if kind == "MaxPool":
        return win.max(axis=(4, 5))
    cnt = sliding_window_view(counted, (k, k))[::s, ::s][:out[0], :out[1]].sum(axis=(2, 3))
    return win.sum(axis=(4, 5)) / cnt


@pytest.mark.parametrize("kind, shape, k, s, pads, ceil, count_pad", _grid([
    ("MaxPool", (1, 3, 13, 13), 3, 2, (0, 0, 0, 0), 1, 0),  # AlexNet/GoogLeNet style
    ("AveragePool", (2, 5, 9, 7), 3, 1, (1, 1, 1, 1), 0, 0),
    ("MaxPool", (2, 4, 11, 10), 3, 2, (1, 1, 1, 1), 0, 0),
    ("AveragePool", (1, 3, 9, 9), 2, 2, (0, 0, 0, 0), 1, 0),
    ("AveragePool", (64, 6, 7, 7), 3, 2, (1, 1, 1, 1), 0, 1),
    ("MaxPool", (64, 8, 24, 24), 2, 2, (0, 0, 0, 0), 0, 0),
    ("AveragePool", (2, 3, 7, 7), 7, 1, (0, 0, 0, 0), 0, 0),
], 3), ids=str)
@TILES
def test_pool(engine_for, kind, shape, k, s, pads, ceil, count_pad, local_tiles) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape, np.float32)
    ref = pool_ref(x, kind, k, s, pads, ceil, count_pad)
    attrs = {"count_include_pad": count_pad} if kind == "AveragePool" else {}
    model = single_op(kind, {"x": x}, {}, ref.shape, kernel_shape=[k, k], strides=[s, s],
                      pads=list(pads), ceil_mode=ceil, **attrs)
    engine = engine_for(model, local_tiles)
    inside = not any(pads) and (ref.shape[2] - 1) * s + k <= shape[2] \
        and (ref.shape[3] - 1) * s + k <= shape[3]  # no window reaches past the input
    valid = "pool2d_valid" if local_tiles else "pool2d_rows"  # GPUs/FPGAs vs CPUs
    assert [la.kernel for la in engine.plan(shape[0]).launches] == [
        valid if inside else "pool2d"]
    _check(engine, {"x": x}, ref, seed)


@pytest.mark.parametrize("shape", [(1, 7, 5, 5), (64, 16, 3, 3)])
def test_global_average_pool(engine_for, shape) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape, np.float32)
    ref = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    _check(engine_for(single_op("GlobalAveragePool", {"x": x}, {}, ref.shape)), {"x": x}, ref,
           seed)


@pytest.mark.parametrize("shape, size", _grid([((1, 7, 5, 3), 5), ((2, 16, 4, 4), 4),
                                               ((64, 6, 3, 3), 3)], 2))
def test_lrn(engine_for, shape, size) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape, np.float32)
    alpha, beta, bias = 1e-2, 0.75, 2.0
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    window = sliding_window_view(sq, size, axis=1).sum(axis=-1)
    ref = x / (bias + alpha / size * window) ** beta
    model = single_op("LRN", {"x": x}, {}, shape, size=size, alpha=alpha, beta=beta, bias=bias)
    _check(engine_for(model), {"x": x}, ref, seed)


@pytest.mark.parametrize("op, a_shape, b_shape, b_const", _grid([
    ("Add", (2, 3, 4, 5), (3, 1, 1), False), ("Mul", (4, 1, 5), (1, 5), True),
    ("Sub", (64, 10), (), True), ("Div", (1, 3, 5, 5), (1, 3, 5, 5), False),
    ("Sum", (64, 8, 3, 3), (64, 8, 3, 3), False), ("Add", (5,), (7, 1), True),
], 3), ids=str)
def test_binary(engine_for, op, a_shape, b_shape, b_const) -> None:
    rng, seed = fresh_rng()
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = (rng.random(b_shape) + 0.5).astype(np.float32)  # away from 0: Div
    f = {"Add": np.add, "Sum": np.add, "Sub": np.subtract, "Mul": np.multiply,
         "Div": np.divide}[op]
    ref = f(a.astype(np.float64), b)
    dynamic, consts = ({"a": a}, {"b": b}) if b_const else ({"a": a, "b": b}, {})
    _check(engine_for(single_op(op, dynamic, consts, ref.shape)), dynamic, ref, seed)


@pytest.mark.parametrize("op, attrs, ref", [
    ("Relu", {}, lambda x: np.maximum(x, 0)),
    ("LeakyRelu", {"alpha": 0.1}, lambda x: np.where(x >= 0, x, 0.1 * x)),
    ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x))),
])
@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (64, 37)])
def test_activation(engine_for, op, attrs, ref, shape) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape, np.float32)
    _check(engine_for(single_op(op, {"x": x}, {}, shape, **attrs)), {"x": x},
           ref(x.astype(np.float64)), seed)


def test_clip_and_fused_add_relu(engine_for) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal((2, 9), np.float32)
    lo, hi = np.array(-0.5, np.float32), np.array(0.25, np.float32)
    model = single_op("Clip", {"x": x}, {"lo": lo, "hi": hi}, x.shape)
    _check(engine_for(model), {"x": x}, np.clip(x, -0.5, 0.25).astype(np.float64), seed)
    y = rng.standard_normal((2, 9), np.float32)
    model = single_op("Add", {"x": x, "z": y}, {}, x.shape)
    model.graph.node[0].output[0] = "sum"
    model.graph.node.append(helper.make_node("Relu", ["sum"], ["y"]))
    engine = engine_for(model)
    assert engine.graph.fused["Add+Relu"] == 1
    _check(engine, {"x": x, "z": y}, np.maximum(x.astype(np.float64) + y, 0), seed)


@pytest.mark.parametrize("axis, shapes", [
    (1, [(2, 3, 4, 5), (2, 1, 4, 5), (2, 7, 4, 5)]), (2, [(1, 3, 2, 5), (1, 3, 6, 5)]),
    (1, [(64, 16, 3, 3), (64, 8, 3, 3)])])
def test_concat(engine_for, axis, shapes) -> None:
    rng, seed = fresh_rng()
    xs = {f"x{i}": rng.standard_normal(s, np.float32) for i, s in enumerate(shapes)}
    ref = np.concatenate(list(xs.values()), axis=axis).astype(np.float64)
    _check(engine_for(single_op("Concat", xs, {}, ref.shape, axis=axis)), xs, ref, seed)


@pytest.mark.parametrize("shape", [(1, 10), (64, 1000), (3, 4, 7)])
def test_softmax(engine_for, shape) -> None:
    rng, seed = fresh_rng()
    x = rng.standard_normal(shape, np.float32) * 4
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    _check(engine_for(single_op("Softmax", {"x": x}, {}, shape, axis=-1)), {"x": x},
           e / e.sum(axis=-1, keepdims=True), seed)
