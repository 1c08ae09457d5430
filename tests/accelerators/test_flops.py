"""FLOP counting: the example CNN by hand and against onnx-tool, and a generated graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_tool
import pytest
from onnx import TensorProto, helper, numpy_helper

from accelerators.flops import count_flops
from accelerators.onnx_models import make_model
from tests.support.daemon import MODELS

MNIST = MODELS / "mnist_cnn" / "1" / "model.onnx"


def test_mnist_cnn_matches_a_hand_count() -> None:
    # conv 1->32 3x3 on 28x28 -> 26x26; conv 32->64 3x3 -> 24x24; maxpool 2x2 -> 12x12;
    # fc 9216->128; fc 128->10. A multiply-add is 2 FLOPs, a bias add 1, elementwise 1.
    conv1 = 2 * 26 * 26 * 32 * (1 * 3 * 3) + 26 * 26 * 32
    conv2 = 2 * 24 * 24 * 64 * (32 * 3 * 3) + 24 * 24 * 64
    fc1, fc2 = 2 * 9216 * 128 + 128, 2 * 128 * 10 + 10
    relus = 26 * 26 * 32 + 24 * 24 * 64 + 128
    pool = 12 * 12 * 64 * 4
    normalize = 2 * 28 * 28  # (x - mean) / std
    count = count_flops(MNIST)
    assert count.uncounted == ()
    # Its Constant nodes fold (free, and no longer nodes of the count).
    assert count.by_op() == {"Sub": 784, "Div": 784, "Conv": conv1 + conv2,
                             "Relu": relus, "MaxPool": pool, "Flatten": 0, "Gemm": fc1 + fc2}
    assert count.total == conv1 + conv2 + fc1 + fc2 + relus + pool + normalize


def test_mnist_cnn_agrees_with_onnx_tool() -> None:
    """onnx-tool counts multiply-accumulates, with a bias add as one more MAC: per node,
    Conv/Gemm FLOPs are twice its MACs less one per output; pooling and Relu are equal."""
    model = onnx_tool.Model(str(MNIST))
    model.graph.shape_infer({"image": np.zeros((1, 1, 28, 28), np.float32)})
    model.graph.profile()
    theirs = {name: node.macs[0] for name, node in model.graph.nodemap.items()}
    outputs = {name: int(np.prod(model.graph.tensormap[node.output[0]].get_shape()))
               for name, node in model.graph.nodemap.items()}
    compared = 0
    for node in count_flops(MNIST).nodes:
        if node.op_type in ("Conv", "Gemm"):
            assert node.flops == 2 * theirs[node.name] - outputs[node.name], node
        elif node.op_type in ("Relu", "MaxPool", "Sub", "Flatten"):
            assert node.flops == theirs[node.name], node
        else:
            continue
        compared += 1
    assert compared == 10  # every node but Div (onnx-tool prices it at 4 MACs) and the folded
    # Constants


def test_generated_graph_with_matmul_pooling_softmax_and_an_uncounted_op(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    w = numpy_helper.from_array(np.ones((8, 3), np.float32), "w")
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    graph = helper.make_graph([
        helper.make_node("GlobalAveragePool", ["x"], ["g"]),            # 8*5*5 = 200
        helper.make_node("Flatten", ["g"], ["f"]),                      # free
        helper.make_node("MatMul", ["f", "w"], ["m"]),                  # 2*3*8 = 48
        helper.make_node("Softmax", ["m"], ["y"]),                      # 3*3 = 9
        helper.make_node("TopK", ["y", "k"], ["v", "i"]),               # not counted
    ], "g", [x], [y], [w, k])
    onnx.save(make_model(graph, 17),
              tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    assert count.by_op() == {"GlobalAveragePool": 200, "Flatten": 0, "MatMul": 48,
                             "Softmax": 9, "TopK": 0}
    assert count.uncounted == ("TopK",)
    assert count.total == 257


def test_a_node_whose_shapes_are_unknown_is_uncounted(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, None)  # a runtime weight
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("MatMul", ["r", "w"], ["y"])], "g", [x, w], [y])
    onnx.save(make_model(graph, 17),
              tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    assert (count.by_op(), count.uncounted) == ({"Relu": 4, "MatMul": 0}, ("MatMul",))


def _symbolic_conv(path: Path) -> None:
    """A Conv over (n, 3, h, w), all but the channels symbolic, as detectors export."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, "h", "w"])
    w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], "g",
                              [x], [y], [w])
    onnx.save(make_model(graph, 17), path)


def test_symbolic_dims_are_counted_at_the_served_shape(tmp_path: Path) -> None:
    _symbolic_conv(tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx", {"x": (3, 32, 48)})
    assert count.total == 2 * 8 * 32 * 48 * 27 and not count.partial
    # Left variable (-1 in the config, or no config): unknown, so partial, never negative.
    for served in ({"x": (3, -1, -1)}, None):
        count = count_flops(tmp_path / "model.onnx", served)
        assert (count.total, count.uncounted, count.partial) == (0, ("Conv",), True)


def test_a_graph_shape_inference_cannot_read_is_counted_as_far_as_it_goes(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("Reshape", ["r", "r"], ["y"])], "g", [x], [y])
    onnx.save(make_model(graph, 17),
              tmp_path / "model.onnx")  # Reshape by a float tensor: shape inference refuses
    count = count_flops(tmp_path / "model.onnx")
    assert count.total >= 0 and count.by_op()["Reshape"] == 0


def test_decoder_attention_normalization_and_reduction_ops_match_a_hand_count(tmp_path) -> None:
    """ConvTranspose (a decoder's upsampling), Resize, an attention product as Einsum,
    LayerNormalization, ReduceMean and ReduceL2, at the served shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    consts = {"wt": np.ones((4, 2, 3, 3), np.float32), "scale": np.ones(16, np.float32),
              "roi": np.zeros(0, np.float32), "up": np.array([1, 1, 2, 2], np.float32)}
    nodes = [
        # (n, 4, 8, 8) -> (n, 2, 16, 16): each of 4 * 8 * 8 inputs into 2 * 3 * 3 outputs
        helper.make_node("ConvTranspose", ["x", "wt"], ["d"], strides=[2, 2], pads=[1, 1, 0, 0]),
        helper.make_node("Resize", ["d", "roi", "up"], ["r"], mode="linear"),  # (n, 2, 32, 32)
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[3], keepdims=0),     # (n, 2, 32)
        helper.make_node("Reshape", ["m", "shape"], ["t"]),                     # (n, 4, 16)
        helper.make_node("Einsum", ["t", "t"], ["s"], equation="bid,bjd->bij"),  # (n, 4, 4)
        helper.make_node("ReduceL2", ["t"], ["l"], axes=[1], keepdims=0),        # (n, 16)
        helper.make_node("LayerNormalization", ["l", "scale"], ["y"], axis=-1),
        helper.make_node("TopK", ["s", "k"], ["v", "i"], axis=-1)]               # uncounted
    consts |= {"shape": np.array([1, 4, 16], np.int64), "k": np.array([2], np.int64)}
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k)
                                                      for k, v in consts.items()])
    onnx.save(make_model(graph, 17),
              tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx", {"x": (4, 8, 8)})
    assert count.by_op() == {
        "ConvTranspose": 2 * (4 * 8 * 8) * (2 * 3 * 3), "Resize": 2 * 4 * (2 * 32 * 32),
        "ReduceMean": 2 * 32 * 32, "Reshape": 0, "Einsum": 2 * (4 * 4) * 16,
        "ReduceL2": 2 * 4 * 16, "LayerNormalization": 8 * 16, "TopK": 0}
    assert count.uncounted == ("TopK",) and count.partial


@pytest.mark.parametrize("equation, summed", [
    ("...id,...jd->...ij", 16), ("...id,...jd", 16), ("b...d,b...d->b...", 16)])
def test_einsum_with_an_ellipsis_is_counted(tmp_path, equation, summed) -> None:
    """Explicit, implicit (the output `...ij`) and a dot product over heads: 2 x outputs x the
    summed size, at attention's shapes (n, heads 3, tokens 4, 16)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    onnx.save(make_model(helper.make_graph(
        [helper.make_node("Einsum", ["x", "x"], ["y"], equation=equation)], "g", [x], [y]),
        17), tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx", {"x": (3, 4, 16)})
    outputs = 3 * 4 * (4 if "j" in equation else 1)
    assert (count.by_op(), count.partial) == ({"Einsum": 2 * outputs * summed}, False)


def test_variable_dims_are_counted_per_request_shape_and_named_once(tmp_path, caplog) -> None:
    from accelerators.flops import FlopCounter
    _symbolic_conv(tmp_path / "model.onnx")
    counter = FlopCounter(tmp_path / "model.onnx", {"x": (3, -1, -1)})
    assert counter.served.partial  # no size to count at before a request comes
    for h, w in ((32, 48), (7, 9), (32, 48)):
        count = counter.per_sample({"x": np.zeros((2, 3, h, w), np.float32)})
        assert count.total == 2 * 8 * h * w * 27 and not count.partial
    assert counter._at.cache_info().misses == 2  # each shape counted once
    fixed = FlopCounter(tmp_path / "model.onnx", {"x": (3, 4, 4)})
    assert fixed.per_sample({"x": np.zeros((1, 3, 4, 4))}) is fixed.served  # counted once
    assert caplog.text.count("FLOPs of ['Conv'] are not counted") == 1


def test_shape_code_from_constant_nodes_folds_as_pytorch_exports_it(tmp_path: Path) -> None:
    """x.view(x.size(0), -1) before a Linear, as torch.onnx writes it: Shape -> Gather(Constant
    0) -> Unsqueeze -> Concat(Constant [-1]) -> Reshape. Without the Constants folded shape
    inference stops at the Reshape and the Linear goes uncounted."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((36, 10), np.float32), "w")
    graph = helper.make_graph([
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(
            np.array(0, np.int64))),
        helper.make_node("Constant", [], ["minus_one"], value=numpy_helper.from_array(
            np.array([-1], np.int64))),
        helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(
            np.array([0], np.int64))),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),  # 2 * 10 * 36 = 720
    ], "g", [x], [y], [w])
    onnx.save(make_model(graph, 17), tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    assert count.uncounted == () and count.by_op()["MatMul"] == 720


@pytest.mark.parametrize("op, gates, directions, layout", [
    ("LSTM", 4, 1, 0), ("GRU", 3, 2, 0), ("RNN", 1, 1, 1)])
def test_recurrent_layers_are_counted_per_step_direction_and_gate(tmp_path, op, gates,
                                                                  directions, layout) -> None:
    steps, inputs, hidden = 7, 5, 6
    shape = [1, steps, inputs] if layout else [steps, 1, inputs]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((directions, gates * hidden, inputs), np.float32), "w")
    r = numpy_helper.from_array(np.ones((directions, gates * hidden, hidden), np.float32), "r")
    graph = helper.make_graph([helper.make_node(
        op, ["x", "w", "r"], ["y"], hidden_size=hidden, layout=layout,
        direction="bidirectional" if directions == 2 else "forward")], "g", [x], [y], [w, r])
    onnx.save(make_model(graph, 14), tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    per_step = 2 * gates * hidden * (inputs + hidden) + 4 * gates * hidden
    assert count.uncounted == () and count.total == directions * steps * per_step


def test_the_counter_folds_what_the_opencl_engine_folds(tmp_path: Path) -> None:
    """One rule for both (accelerators/onnx_folding): any ONNX op on constants or shapes folds,
    not a list of shape-code ops and not only small values. A Reshape target built with Tile
    and Abs, and a weight that is the Transpose of a 36x10 initializer: the counter folds
    them, so the MatMul after them is counted and they are free, as on the engine."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(a, name) for name, a in (
        ("w_t", np.ones((10, 36), np.float32)), ("one", np.array([1], np.int64)),
        ("ones", np.array([1], np.int64)), ("starts", np.array([0], np.int64)))]
    graph = helper.make_graph([
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "starts", "one"], ["n"]),
        helper.make_node("Tile", ["ones", "one"], ["tiled"]),
        helper.make_node("Neg", ["tiled"], ["rest"]),
        helper.make_node("Abs", ["n"], ["n_abs"]),
        helper.make_node("Concat", ["n_abs", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Transpose", ["w_t"], ["w"], perm=[1, 0]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),  # 2 * 10 * 36 = 720
    ], "g", [x], [y], inits)
    onnx.save(make_model(graph, 17), tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    assert count.uncounted == () and count.by_op() == {"Reshape": 0, "MatMul": 720}


def test_a_counter_without_a_batch_axis_counts_each_request_whole(tmp_path: Path) -> None:
    """max_batch_size 0: config dims cover every axis, and a request's first dim is not a
    batch: its whole shape is counted, variable dims included."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "n", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(make_model(graph, 17), tmp_path / "model.onnx")
    from accelerators.flops import FlopCounter
    counter = FlopCounter(tmp_path / "model.onnx", {"x": (-1, 2, 6)}, batched=False)
    assert counter.per_sample({"x": np.zeros((5, 2, 6), np.float32)}).total == 5 * 2 * 6
    fixed = FlopCounter(tmp_path / "model.onnx", {"x": (4, 2, 6)}, batched=False)
    assert fixed.served.total == 4 * 2 * 6


@pytest.mark.parametrize("op, domain, shapes, attrs, flops", [
    # packed QKV projection 2*4*8*24 and its bias 4*24, then 4x4 scores over 2 heads:
    # 4*4*(2*8 + 3*2 + 2*8)
    ("Attention", "com.microsoft", {"x": (1, 4, 8), "w": (8, 24), "b": (24,)},
     {"num_heads": 2}, 2 * 4 * 8 * 24 + 4 * 24 + 4 * 4 * 38),
    ("MultiHeadAttention", "com.microsoft", {"q": (1, 4, 8), "k": (1, 6, 8), "v": (1, 6, 8)},
     {"num_heads": 2}, 4 * 6 * 38),
    ("Attention", "", {"q": (1, 2, 4, 4), "k": (1, 2, 6, 4), "v": (1, 2, 6, 4)}, {},
     4 * 6 * 38),
])
def test_attention_blocks_are_counted_from_their_inputs_shapes(
        tmp_path: Path, op: str, domain: str, shapes: dict, attrs: dict, flops: int) -> None:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
              for n, s in shapes.items()]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node(op, list(shapes), ["y"], domain=domain or None,
                                                **attrs)], "g", inputs, [y])
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), tmp_path / "model.onnx")
    count = count_flops(tmp_path / "model.onnx")
    assert (count.total, count.uncounted) == (flops, ())
