"""The ops of the mobile and densely connected classifiers (MobileNetV2/V3, EfficientNet,
DenseNet, ShuffleNet), each in a small ONNX graph built with onnx.helper, run by the engine and by
ONNX Runtime on the same fresh random inputs: max relative error 1e-4. Also what the graph
simplification does with them (fusions), since that decides the kernels that run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.support.numerics import fresh_rng
from tests.support.onnx_graphs import check, graph


def _bn_params(rng, c: int) -> dict[str, np.ndarray]:
    return {"gamma": rng.uniform(0.5, 1.5, c).astype(np.float32),
            "beta": rng.uniform(-0.5, 0.5, c).astype(np.float32),
            "mean": rng.uniform(-0.5, 0.5, c).astype(np.float32),
            "var": rng.uniform(0.5, 1.5, c).astype(np.float32)}


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (64, 12)])
@pytest.mark.parametrize("then", [None, "Relu"])
def test_batch_norm_on_its_own(engine_for, shape, then) -> None:
    """DenseNet's BN -> ReLU -> Conv: a BN no convolution precedes, its ReLU fused into it."""
    rng, seed = fresh_rng()
    bn = helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"],
                          ["y" if then is None else "bn"], epsilon=1e-3)
    nodes = [bn] + ([helper.make_node(then, ["bn"], ["y"])] if then else [])
    x = rng.standard_normal(shape, np.float32)
    engine = check(engine_for, graph(nodes, {"x": shape}, _bn_params(rng, shape[1]), ["y"]), x=x)
    assert {la.kernel for la in engine.plan(shape[0]).launches} == {"channel_affine"}, seed
    assert engine.graph.fused["BatchNormalization+Relu"] == (then is not None)


@pytest.mark.parametrize("shape, perm", [((2, 3, 4), (2, 0, 1)), ((3, 4, 5, 6), None),
                                         ((2, 2, 3, 5, 4), (0, 2, 1, 3, 4))], ids=str)
def test_transpose(engine_for, shape, perm) -> None:
    x = fresh_rng()[0].standard_normal(shape, np.float32)
    attrs = {} if perm is None else {"perm": list(perm)}
    check(engine_for, graph([helper.make_node("Transpose", ["x"], ["y"], **attrs)],
                            {"x": shape}, {}, ["y"]), x=x)


def test_channel_shuffle(engine_for) -> None:
    """ShuffleNet: Reshape (n, groups, c / groups, h, w), swap the two channel axes, Reshape
    back; the reshapes are views, the transpose one launch."""
    n, c, h, w = 2, 12, 5, 3
    nodes = [helper.make_node("Reshape", ["x", "split_shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "back"], ["y"])]
    consts = {"split_shape": np.array([0, 2, c // 2, h, w], np.int64),
              "back": np.array([0, -1, h, w], np.int64)}
    x = fresh_rng()[0].standard_normal((n, c, h, w), np.float32)
    engine = check(engine_for, graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    assert [la.kernel for la in engine.plan(n).launches] == ["gather_strided"]


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([0], [3], [1], [1]), ([1, -4], [5, 100], [2, 3], [2, 1]),
    ([4, 0], [-100, 2], [1, 0], [-2, 1]), ([0, 0, 1], [1, 3, 4], None, None)], ids=str)
def test_slice_of_an_activation(engine_for, starts, ends, axes, steps) -> None:
    x = fresh_rng()[0].standard_normal((2, 6, 7, 5), np.float32)
    consts = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
    inputs = ["x", "starts", "ends"]
    if axes is not None:
        consts["axes"], consts["steps"] = np.array(axes, np.int64), np.array(steps, np.int64)
        inputs += ["axes", "steps"]
    check(engine_for, graph([helper.make_node("Slice", inputs, ["y"])], {"x": x.shape}, consts,
                            ["y"]), x=x)


@pytest.mark.parametrize("opset, how", [(13, "sizes"), (13, "equal"), (18, "num_outputs"),
                                        (11, "attribute")])
def test_split(engine_for, opset, how) -> None:
    """ShuffleNet's channel split (torch's chunk), in each opset's spelling."""
    x = fresh_rng()[0].standard_normal((2, 7, 3, 4), np.float32)
    inputs, consts, attrs = ["x"], {}, {"axis": 1}
    if how == "sizes":
        inputs.append("parts")
        consts["parts"] = np.array([2, 4, 1], np.int64)
    elif how == "num_outputs":
        attrs["num_outputs"] = 3
    elif how == "attribute":
        attrs["split"] = [2, 4, 1]
    parts = 2 if how == "equal" else 3
    if how == "equal":
        x = x[:, :6].copy()
    outputs = [f"y{i}" for i in range(parts)]
    node = helper.make_node("Split", inputs, outputs, **attrs)
    check(engine_for, graph([node], {"x": x.shape}, consts, outputs, opset), x=x)


ACTIVATIONS = [("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
               ("Sigmoid", {}), ("Clip", {})]


@pytest.mark.parametrize("op, attrs", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize("after", ["input", "Conv", "depthwise Conv"])
def test_activation_alone_and_fused_into_a_convolution(engine_for, op, attrs, after) -> None:
    """MobileNet's HardSwish and ReLU6 (Clip 0..6), HardSigmoid of its squeeze-excitation."""
    rng, _ = fresh_rng()
    x = (rng.standard_normal((2, 4, 9, 9)) * 4).astype(np.float32)
    consts = {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    act_in = ["a", "lo", "hi"] if op == "Clip" else ["a"]
    nodes = [helper.make_node(op, act_in, ["y"], **attrs)]
    if after == "input":
        nodes[0].input[0] = "x"
    else:
        group = 4 if after.startswith("depthwise") else 1
        consts["w"] = rng.standard_normal((4, 4 // group, 3, 3), np.float32)
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4, group=group))
    engine = check(engine_for, graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    assert engine.graph.fused[f"Conv+{op}"] == (after != "input")


@pytest.mark.parametrize("gate, op", [("Sigmoid", "Silu"), ("HardSigmoid", "HardSwish")])
def test_gated_activations_are_recognised_and_fused(engine_for, gate, op) -> None:
    """EfficientNet's SiLU as exported (Conv -> Sigmoid -> Mul with the Conv's output), and
    HardSwish as opsets before 14 spell it: one launch."""
    rng, _ = fresh_rng()
    x = rng.standard_normal((1, 3, 8, 8), np.float32)
    w = rng.standard_normal((5, 3, 1, 1), np.float32)
    attrs = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node(gate, ["c"], ["g"], **attrs),
             helper.make_node("Mul", ["g", "c"], ["y"])]
    engine = check(engine_for, graph(nodes, {"x": x.shape}, {"w": w}, ["y"]), x=x)
    assert engine.graph.fused[f"Conv+{op}"] == 1
    assert len(engine.plan(1).launches) == 1


def test_squeeze_excitation(engine_for) -> None:
    """EfficientNet / MobileNetV3: GlobalAveragePool -> 1x1 Conv -> ReLU -> 1x1 Conv ->
    HardSigmoid, the result scaling each channel of the input (Mul broadcast over h, w)."""
    rng, _ = fresh_rng()
    n, c, s = 3, 8, 2
    consts = {"w1": rng.standard_normal((s, c, 1, 1), np.float32),
              "b1": rng.standard_normal(s).astype(np.float32),
              "w2": rng.standard_normal((c, s, 1, 1), np.float32),
              "b2": rng.standard_normal(c).astype(np.float32)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["s1"]),
             helper.make_node("Relu", ["s1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["s2"]),
             helper.make_node("HardSigmoid", ["s2"], ["e"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["x", "e"], ["y"])]
    x = rng.standard_normal((n, c, 7, 7), np.float32)
    engine = check(engine_for, graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    assert [la.kernel for la in engine.plan(n).launches if "gemm" not in la.kernel] == [
        "global_avg_pool", "binary4d"]


@pytest.mark.parametrize("opset, axes, keepdims", [(13, [2, 3], 0), (13, [-1, -2], 1),
                                                   (18, [3], 0), (13, [1, 2, 3], 1)], ids=str)
def test_reduce_mean_over_trailing_axes(engine_for, opset, axes, keepdims) -> None:
    """torchvision's ShuffleNetV2 pools globally with `x.mean([2, 3])`."""
    x = fresh_rng()[0].standard_normal((3, 5, 4, 6), np.float32)
    consts, inputs, attrs = {}, ["x"], {"keepdims": keepdims}
    if opset >= 18:
        consts["axes"] = np.array(axes, np.int64)
        inputs.append("axes")
    else:
        attrs["axes"] = axes
    node = helper.make_node("ReduceMean", inputs, ["y"], **attrs)
    check(engine_for, graph([node], {"x": x.shape}, consts, ["y"], opset), x=x)


def test_reduce_mean_over_axes_apart_is_refused(engine_for) -> None:
    """Over adjacent axes anywhere it runs (test_opencl_norm.py); over axes apart it does not."""
    from accelerators.opencl.graph import UnsupportedModelError
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, 2], name="odd_mean")
    with pytest.raises(UnsupportedModelError, match="'odd_mean': only adjacent axes"):
        engine_for(graph([node], {"x": (2, 3, 4)}, {}, ["y"], 13))


@pytest.mark.parametrize("opset", [13, 10])
def test_zero_pad_before_a_convolution_becomes_its_padding(engine_for, opset) -> None:
    """tf2onnx writes SAME padding as an explicit Pad before the Conv."""
    rng, _ = fresh_rng()
    x = rng.standard_normal((2, 3, 8, 9), np.float32)
    amounts = [0, 0, 1, 2, 0, 0, 2, 1]
    consts = {"w": rng.standard_normal((4, 3, 3, 3), np.float32)}
    if opset >= 11:
        consts["amounts"] = np.array(amounts, np.int64)
        pad = helper.make_node("Pad", ["x", "amounts"], ["p"], mode="constant")
    else:
        pad = helper.make_node("Pad", ["x"], ["p"], mode="constant", pads=amounts)
    conv = helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 1])
    engine = check(engine_for, graph([pad, conv], {"x": x.shape}, consts, ["y"], opset), x=x)
    assert engine.graph.fused["Pad+Conv"] == 1


def test_a_reflection_wider_than_its_axis_is_refused(engine_for) -> None:
    from accelerators.opencl.graph import UnsupportedModelError
    consts = {"amounts": np.array([0, 0, 5, 1, 0, 0, 1, 1], np.int64),
              "w": np.ones((1, 1, 3, 3), np.float32)}
    pad = helper.make_node("Pad", ["x", "amounts"], ["p"], mode="reflect", name="mirror")
    conv = helper.make_node("Conv", ["p", "w"], ["y"])
    with pytest.raises(UnsupportedModelError, match="Pad node 'mirror': .*a reflection wider"):
        engine_for(graph([pad, conv], {"x": (1, 1, 5, 5)}, consts, ["y"]))


@pytest.mark.parametrize("pads, folded", [([0, 0, 0, 0], 3), ([1, 1, 1, 1], 0)])
def test_an_input_normalization_folds_into_an_unpadded_convolution(engine_for, pads,
                                                                   folded) -> None:
    """(x - mean[c]) / std * gain before a Conv (MNIST's normalization, per-channel ones):
    exact in the Conv's weights and bias only without padding."""
    rng, _ = fresh_rng()
    x = rng.standard_normal((2, 3, 7, 6), np.float32)
    consts = {"mean": rng.standard_normal((1, 3, 1, 1), np.float32),
              "std": np.array(0.3, np.float32), "gain": rng.uniform(0.5, 2, (3, 1, 1)),
              "w": rng.standard_normal((4, 3, 3, 3), np.float32),
              "b": rng.standard_normal(4).astype(np.float32)}
    consts["gain"] = consts["gain"].astype(np.float32)
    nodes = [helper.make_node("Sub", ["x", "mean"], ["centred"]),
             helper.make_node("Div", ["centred", "std"], ["scaled"]),
             helper.make_node("Mul", ["scaled", "gain"], ["z"]),
             helper.make_node("Conv", ["z", "w", "b"], ["y"], pads=pads)]
    engine = check(engine_for, graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    assert sum(engine.graph.fused[f"{op}+Conv"] for op in ("Sub", "Div", "Mul")) == folded
    conv = 1 if engine.build.tiling else 2  # conv_local, or im2col + GEMM
    assert len(engine.plan(2).launches) == (conv if folded else conv + 3)


@pytest.mark.parametrize("count, axis", [(11, 1), (3, 1), (9, -1), (8, 0)])
def test_concat_of_many_inputs_takes_one_launch_per_eight(engine_for, count, axis) -> None:
    """DenseNet's dense blocks concatenate up to 25 inputs along the channels; a constant
    among them (a learned token) is uploaded and copied like the others."""
    rng, _ = fresh_rng()
    shapes = [[2, 2, 3, 4] for _ in range(count)]
    for i, shape in enumerate(shapes):
        shape[axis] += i % 3
    arrays = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    const = arrays.pop(f"x{count - 1}")
    model = graph([helper.make_node("Concat", list(arrays) + ["c"], ["c_out"], axis=axis),
                   helper.make_node("Relu", ["c_out"], ["y"])],
                  {n: a.shape for n, a in arrays.items()}, {"c": const}, ["y"])
    engine = check(engine_for, model, **arrays)
    assert [la.kernel for la in engine.plan(2).launches].count("concat_parts") == \
        -(-count // 8)
