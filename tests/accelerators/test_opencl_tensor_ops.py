"""The ops transformers and exporters' shape code need, each in a small ONNX graph built with
onnx.helper, run by the engine and by ONNX Runtime on the same fresh random inputs (max relative
error 1e-4): shape subgraphs of any ops folded per batch size, numpy broadcasting of any rank,
one-input math, Expand and Gather of activations, MatMul of N-D activations."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from accelerators.opencl.ir import UnsupportedModelError
from tests.support.numerics import SMALL_GRID, fresh_rng
from tests.support.onnx_graphs import check, check_batches, graph


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def test_class_token_shape_code_folds_per_batch(engine_for) -> None:
    """torch's `class_token.expand(n, -1, -1)` then `cat`: Shape, Gather, Unsqueeze, Concat,
    Equal, Where, Expand evaluated on the host for each batch size; only the copies run."""
    d = 8
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),  # a scalar
             helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_ones"], ["target"], axis=0),
             helper.make_node("Equal", ["target", "minus_one"], ["is_free"]),
             helper.make_node("ConstantOfShape", ["three"], ["ones"],
                              value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
             helper.make_node("Where", ["is_free", "ones", "target"], ["expand_to"]),
             helper.make_node("Expand", ["cls", "expand_to"], ["tokens"]),
             helper.make_node("Concat", ["tokens", "x"], ["y"], axis=1)]
    consts = {"zero": ints(0)[0], "zero_axes": ints(0), "minus_ones": ints(-1, -1),
              "minus_one": ints(-1), "three": ints(3),
              "cls": fresh_rng()[0].standard_normal((1, 1, d), np.float32)}
    model = graph(nodes, {"x": ("n", 5, d)}, consts, ["y"])
    check_batches(engine_for, model, {"x": ("n", 5, d)})
    launches = engine_for(model).plan(2).launches
    assert {la.kernel for la in launches} == {"concat_parts"}


def test_constant_subgraphs_fold_once_at_load(engine_for) -> None:
    """A weight written as the Transpose of an initializer is a constant before the passes run:
    its MatMul still takes the bias into its one launch."""
    rng = fresh_rng()[0]
    nodes = [helper.make_node("Transpose", ["w_t"], ["w"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "bias"], ["y"])]
    consts = {"w_t": rng.standard_normal((9, 16), np.float32),
              "bias": rng.standard_normal(9, np.float32)}
    model = graph(nodes, {"x": ("n", 3, 16)}, consts, ["y"])
    check_batches(engine_for, model, {"x": ("n", 3, 16)})
    engine = engine_for(model)
    assert engine.graph.fused["constant folded"] == 1 and engine.graph.fused["MatMul+Add"] == 1
    assert len(engine.plan(2).launches) == 1


def test_ceil_range_and_min_of_shapes_fold(engine_for) -> None:
    """x[:, :ceil(t / 2)] (a "same" padding's arithmetic) and x[:, range(0, min(t, 6), 2)]."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
             helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["tf", "two"], ["half"]),
             helper.make_node("Ceil", ["half"], ["up"]),
             helper.make_node("Cast", ["up"], ["end"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["end", "zero_axes"], ["ends"]),
             helper.make_node("Slice", ["x", "zero_axes", "ends", "one_axes"], ["y"]),
             helper.make_node("Min", ["t", "six"], ["stop"]),
             helper.make_node("Range", ["zero", "stop", "two_int"], ["picked"]),
             helper.make_node("Gather", ["x", "picked"], ["z"], axis=1)]
    consts = {"one": ints(1)[0], "two": np.float32(2), "zero_axes": ints(0),
              "one_axes": ints(1), "six": ints(6)[0], "zero": ints(0)[0], "two_int": ints(2)[0]}
    model = graph(nodes, {"x": (2, 7, 3)}, consts, ["y", "z"])
    check(engine_for, model, x=fresh_rng()[0].standard_normal((2, 7, 3), np.float32))


@pytest.mark.parametrize("opset, amounts, axes, value", [
    (13, [0, 0, 1, 2, 0, 0, 2, 1], None, 0.0), (13, [0, 1, 0, 0, 0, 2, 0, 0], None, 0.5),
    (18, [1, -1], [-1], 0.0), (10, [0, 0, 1, 1, 0, 0, 1, 1], None, -1.0),
    (13, [0, 0, 0, 0, 0, 0, 0, 0], None, 0.0)], ids=str)
def test_pad_of_an_activation(engine_for, opset, amounts, axes, value) -> None:
    """Any axes, a value, negative amounts cropping, opset 10's attributes; zero amounts are a
    view."""
    if opset < 11:
        node, consts = helper.make_node("Pad", ["x"], ["y"], pads=amounts, value=value), {}
    else:
        consts = {"amounts": ints(*amounts), "value": np.float32(value)}
        if axes is not None:
            consts["axes"] = ints(*axes)
        node = helper.make_node("Pad", ["x", *consts], ["y"])
    model = graph([node], {"x": ("n", 3, 4, 5)}, consts, ["y"], opset)
    check_batches(engine_for, model, {"x": ("n", 3, 4, 5)})
    assert len(engine_for(model).plan(2).launches) == (1 if any(amounts) else 0)


def test_same_padding_computed_from_the_shape(engine_for) -> None:
    """timm's Conv2dSame as exported: the pads of "same" padding computed from the input's
    size (Ceil, Max, integer Div), then a Pad and an unpadded strided Conv."""
    k, stride = 3, 2
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
             helper.make_node("Cast", ["hw"], ["hw_f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["hw_f", "stride_f"], ["steps_f"]),
             helper.make_node("Ceil", ["steps_f"], ["steps_up"]),
             helper.make_node("Cast", ["steps_up"], ["steps"], to=TensorProto.INT64),
             helper.make_node("Sub", ["steps", "one"], ["last"]),
             helper.make_node("Mul", ["last", "stride"], ["reach"]),
             helper.make_node("Add", ["reach", "k"], ["span"]),
             helper.make_node("Sub", ["span", "hw"], ["excess"]),
             helper.make_node("Max", ["excess", "zero"], ["total"]),
             helper.make_node("Div", ["total", "two_int"], ["before"]),
             helper.make_node("Sub", ["total", "before"], ["after"]),
             helper.make_node("Concat", ["zeros", "before", "zeros", "after"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["padded"]),
             helper.make_node("Conv", ["padded", "w"], ["y"], strides=[stride, stride])]
    consts = {"two": ints(2), "four": ints(4), "stride_f": np.float32(stride), "one": ints(1),
              "stride": ints(stride), "k": ints(k), "zero": ints(0), "two_int": ints(2),
              "zeros": ints(0, 0), "w": fresh_rng()[0].standard_normal((4, 3, k, k), np.float32)}
    model = graph(nodes, {"x": ("n", 3, 10, 9)}, consts, ["y"])
    check_batches(engine_for, model, {"x": ("n", 3, 10, 9)})


BROADCASTS = [((2, 3, 4), (4,)), ((2, 3, 4, 5), (3, 1, 1)), ((1, 5), (4, 1)),
              ((2, 1, 4, 5, 6), (3, 1, 1, 6)), ((2, 3, 4, 5, 6, 7), (6, 7)),
              ((2, 12, 9, 9), (1, 12, 9, 9))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"])
@pytest.mark.parametrize("x_shape, y_shape", BROADCASTS[:2] if SMALL_GRID else BROADCASTS,
                         ids=str)
def test_broadcasting_of_any_rank(engine_for, op, x_shape, y_shape) -> None:
    """Both operands activations; axes merged into the kernel's four where numpy's strides
    allow (rank 5 and 6 here)."""
    model = graph([helper.make_node(op, ["x", "y"], ["z"])], {"x": x_shape, "y": y_shape}, {},
                  ["z"])
    check_batches(engine_for, model, {"x": x_shape, "y": y_shape}, batches=(None,),
                  positive=op == "Pow")


@pytest.mark.parametrize("slope", [(1, 6, 1, 1), (6, 1, 1), (1,)], ids=str)
def test_prelu(engine_for, slope) -> None:
    """PRelu with a slope per channel (face and other zoos' models) or one for all."""
    consts = {"slope": fresh_rng()[0].uniform(0, 0.5, slope).astype(np.float32)}
    model = graph([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": ("n", 6, 5, 4)},
                  consts, ["y"])
    check_batches(engine_for, model, {"x": ("n", 6, 5, 4)})


def test_broadcasting_that_does_not_merge_into_four_axes_is_refused(engine_for) -> None:
    model = graph([helper.make_node("Add", ["x", "y"], ["z"], name="odd")],
                  {"x": (2, 3, 2, 3, 2), "y": (2, 1, 2, 1, 2)}, {}, ["z"])
    with pytest.raises(UnsupportedModelError, match="'odd': Add broadcasting"):
        engine_for(model)


@pytest.mark.parametrize("op, exponent", [("Neg", None), ("Sqrt", None), ("Reciprocal", None),
                                          ("Erf", None), ("Tanh", None), ("Exp", None),
                                          ("Abs", None), ("Log", None), ("Softplus", None),
                                          ("Mish", None), ("Pow", 2.0), ("Pow", 0.5),
                                          ("Pow", 3.0)])
@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 4, 5, 6, 2)], ids=str)
def test_one_input_math(engine_for, op, exponent, shape) -> None:
    consts = {} if exponent is None else {"e": np.float32(exponent)}
    model = graph([helper.make_node(op, ["x"] + list(consts), ["y"])], {"x": shape}, consts,
                  ["y"], opset=18 if op == "Mish" else 17)
    check_batches(engine_for, model, {"x": shape}, batches=(None,),
                  positive=op in ("Sqrt", "Reciprocal", "Log", "Pow"))
    kernels = {la.kernel for la in engine_for(model).plan(shape[0]).launches}
    assert kernels == {"binary4d" if exponent == 3.0 else "unary"}


@pytest.mark.parametrize("x_shape, target", [(("n", 1, 4), ("n", 3, 4)), ((3, 1), (2, 3, 5)),
                                             ((2, 3), (1, 2, 3)), (("n", 4, 1, 1), (1, 1, 2, 3))],
                         ids=str)
def test_expand_of_an_activation(engine_for, x_shape, target) -> None:
    """Squeeze-excitation variants broadcast their gate with Expand; the shape may come from a
    shape computation (here the batch is read from x)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Max", ["n", "rest"], ["lead"]),  # the batch where target has n
             helper.make_node("Concat", ["lead", "tail"], ["target"], axis=0),
             helper.make_node("Expand", ["x", "target"], ["y"])]
    lead = 1 if target[0] == "n" else target[0]
    consts = {"zero": ints(0), "one": ints(1), "rest": ints(lead), "tail": ints(*target[1:])}
    check_batches(engine_for, graph(nodes, {"x": x_shape}, consts, ["y"]), {"x": x_shape},
                  batches=(1, 2) if "n" in x_shape else (None,))


@pytest.mark.parametrize("shape, axis, indices", [
    ((2, 5, 8), 1, 0), ((2, 5, 8), 1, -1), ((2, 5, 8), 2, [1, 3, 5]), ((3, 4, 2, 6), 0, 2),
    ((2, 5, 8), 1, [4, 2, 0])], ids=str)
def test_gather_of_an_activation(engine_for, shape, axis, indices) -> None:
    """A ViT's class token (x[:, 0]), attention's packed q, k, v (index 0..2 on axis 0)."""
    consts = {"i": np.array(indices, np.int64)}
    model = graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": shape},
                  consts, ["y"])
    check(engine_for, model, x=fresh_rng()[0].standard_normal(shape, np.float32))


def test_gather_of_uneven_indices_is_refused(engine_for) -> None:
    model = graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=1, name="pick")],
                  {"x": (2, 5)}, {"i": ints(0, 3, 4)}, ["y"])
    with pytest.raises(UnsupportedModelError, match="'pick': indices that do not step evenly"):
        engine_for(model)


MATMULS = [((2, 4, 5, 6), (2, 4, 6, 7)), ((2, 4, 5, 6), (1, 4, 6, 7)), ((2, 4, 5, 6), (6, 7)),
           ((6,), (2, 6, 7)), ((2, 5, 6), (6,)), ((2, 3, 17, 16), (2, 3, 16, 17)),
           ((3, 1, 5, 6), (1, 2, 6, 33))]


@pytest.mark.parametrize("a_shape, b_shape", MATMULS[:3] if SMALL_GRID else MATMULS, ids=str)
@pytest.mark.parametrize("local_tiles", [False, True])
def test_matmul_of_activations(engine_for, a_shape, b_shape, local_tiles) -> None:
    """Attention's Q x K^T and weights x V, with broadcast batch axes, 1-D operands; on the
    register tiles and on the local-memory tiles of GPUs and FPGAs."""
    model = graph([helper.make_node("MatMul", ["a", "b"], ["y"])],
                  {"a": a_shape, "b": b_shape}, {}, ["y"])
    check_batches(engine_for, model, {"a": a_shape, "b": b_shape}, batches=(None,),
                  local_tiles=local_tiles)


@pytest.mark.parametrize("constant, shape", [("b", ("n", 7, 24)), ("b", (1, 24)),
                                             ("a", ("n", 4, 6, 7))], ids=str)
def test_matmul_of_an_activation_and_a_constant(engine_for, constant, shape) -> None:
    """ViT's Linear layers on (n, tokens, dim) (and on a 1-D activation: one row), their bias
    added in the GEMM (MatMul + Add is one launch); a constant batch of matrices times an
    activation."""
    rng = fresh_rng()[0]
    if constant == "b":
        one_d = shape == (1, 24)
        nodes = [helper.make_node("Squeeze", ["x", "axes"], ["x1"])] * one_d + [
            helper.make_node("MatMul", ["x1" if one_d else "x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "bias"], ["xwb" if one_d else "y"])] + [
            helper.make_node("Unsqueeze", ["xwb", "axes"], ["y"])] * one_d
        consts = {"w": rng.standard_normal((24, 40), np.float32),
                  "bias": rng.standard_normal(40, np.float32)} | ({"axes": ints(0)} if one_d
                                                                  else {})
    else:
        nodes = [helper.make_node("MatMul", ["w", "x"], ["y"])]
        consts = {"w": rng.standard_normal((4, 5, 6), np.float32)}
    model = graph(nodes, {"x": shape}, consts, ["y"])
    check_batches(engine_for, model, {"x": shape}, batches=(1, 3) if "n" in shape else (1,))
    engine = engine_for(model)
    assert len(engine.plan(2 if "n" in shape else 1).launches) == 1

    assert engine.graph.fused["MatMul+Add"] == (constant == "b")


def test_matmul_whose_batch_axes_do_not_merge_is_refused(engine_for) -> None:
    model = graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                  {"a": (2, 3, 4, 5, 6), "b": (2, 1, 4, 6, 5)}, {}, ["y"])
    with pytest.raises(UnsupportedModelError, match="'mm': batch axes"):
        engine_for(model)


@pytest.mark.parametrize("shape", [(2, 3, 5, 17), (2, 197)], ids=str)
def test_softmax_over_the_last_axis_of_nd_tensors(engine_for, shape) -> None:
    model = graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": shape}, {}, ["y"])
    check(engine_for, model, x=3 * fresh_rng()[0].standard_normal(shape, np.float32))


@pytest.mark.parametrize("shape, repeats", [((2, 3, 4), (1, 2, 3)), ((2, 1, 5), (1, 4, 1)),
                                            ((2, 3), (1, 1))], ids=str)
def test_tile_of_an_activation(engine_for, shape, repeats) -> None:
    model = graph([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": shape},
                  {"r": ints(*repeats)}, ["y"])
    check(engine_for, model, x=fresh_rng()[0].standard_normal(shape, np.float32))


def test_cast_of_a_float_activation_is_itself(engine_for) -> None:
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["c"], ["y"])]
    model = graph(nodes, {"x": (2, 5)}, {}, ["y"])
    check(engine_for, model, x=fresh_rng()[0].standard_normal((2, 5), np.float32))
    refused = graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64, name="c")],
                    {"x": (2, 5)}, {}, ["y"])
    with pytest.raises(UnsupportedModelError, match="Cast node 'c': only to a float type"):
        engine_for(refused)


@pytest.mark.parametrize("local_tiles", [False, True])
def test_weights_whose_rows_span_whole_kilobytes_are_padded(engine_for, local_tiles) -> None:
    """256 columns (1 KiB rows) are stored with a padded row stride; one sample through the
    split-K GEMV (K >= 1024), three through the GEMM."""
    rng = fresh_rng()[0]
    model = graph([helper.make_node("Gemm", ["x", "w", "bias"], ["y"], transB=1)],
                  {"x": ("n", 1024)}, {"w": rng.standard_normal((256, 1024), np.float32),
                                       "bias": rng.standard_normal(256, np.float32)}, ["y"])
    check_batches(engine_for, model, {"x": ("n", 1024)}, local_tiles=local_tiles)
    engine = engine_for(model, local_tiles=local_tiles)
    assert engine.graph.derived["w:T"].shape == (1024, 256 + 16)
