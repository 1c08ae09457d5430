"""Graphs in the spelling of exporters that tests/accelerators/exporters/ lacks, generated
here (no downloads): tf2onnx's channels-last input, paddle2onnx 2.x's shape code and `pd_op`
names, PyTorch's Constant-node literals, onnxruntime's static quantiser, and a model whose
batch is not axis 0. Each runs on the OpenCL engine as on ONNX Runtime, and its FLOPs match a
hand count and are within 2x of onnx-tool's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_tool
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from accelerators.flops import count_flops
from accelerators.onnx_models import make_model
from tests.support.daemon import Daemon
from tests.support.numerics import rel_err

RNG = np.random.default_rng(45)
# conv 1->4 3x3 pad 1 on 8x8, bias, ReLU; fully connected 256 -> 3 with bias.
CONV, FC = 2 * 8 * 8 * 4 * 9 + 8 * 8 * 4, 2 * 256 * 3 + 3
HAND_COUNT = CONV + 8 * 8 * 4 + FC


def _array(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(a, name)


def _const(output: str, value: list[int] | int) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [output], value=_array(output, np.array(
        value, np.int64)))


def _weights() -> list[onnx.TensorProto]:
    return [_array("conv_w", RNG.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)),
            _array("conv_b", RNG.normal(0, 0.1, 4).astype(np.float32)),
            _array("fc_w", RNG.normal(0, 0.1, (256, 3)).astype(np.float32)),
            _array("fc_b", RNG.normal(0, 0.1, 3).astype(np.float32))]


def _conv(x: str, prefix: str = "") -> list[onnx.NodeProto]:
    return [helper.make_node("Conv", [x, "conv_w", "conv_b"], ["conv"], prefix + "conv",
                             pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["relu"], prefix + "relu")]


def _model(nodes: list[onnx.NodeProto], shape: list, opset: int,
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        _weights() + (inits or []))
    return make_model(graph, opset)


def tf2onnx_nhwc() -> onnx.ModelProto:
    """tf.keras through tf2onnx: an NHWC input transposed to NCHW for the Conv, back to NHWC
    after it, Flatten as a Reshape to [-1, 256] from an initializer, MatMul and Add."""
    return _model([helper.make_node("Transpose", ["x"], ["nchw"], "conv2d__6",
                                     perm=[0, 3, 1, 2]),
                   *_conv("nchw", "sequential/conv2d/"),
                   helper.make_node("Transpose", ["relu"], ["nhwc"], "conv2d__8",
                                    perm=[0, 2, 3, 1]),
                   helper.make_node("Reshape", ["nhwc", "const_fold_opt__9"], ["flat"],
                                    "sequential/flatten/Reshape"),
                   helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], "dense/MatMul"),
                   helper.make_node("Add", ["mm", "fc_b"], ["y"], "dense/BiasAdd")],
                  ["unk__10", 8, 8, 1], 13,
                  [_array("const_fold_opt__9", np.array([-1, 256], np.int64))])


def paddle2onnx_2x() -> onnx.ModelProto:
    """paddle2onnx 2.x (PIR): `p2o.pd_op.*` names, flatten as Shape -> Slice -> Concat ->
    Reshape, the Linear as MatMul and Add."""
    inits = [_array(n, np.array(v, np.int64)) for n, v in (
        ("p2o.helper.constant.0", [0]), ("p2o.helper.constant.1", [1]),
        ("p2o.helper.constant.2", [-1]))]
    return _model([*_conv("x", "p2o.pd_op.conv2d.0/"),
                   helper.make_node("Shape", ["relu"], ["shape"], "p2o.pd_op.shape.0"),
                   helper.make_node("Slice", ["shape", "p2o.helper.constant.0",
                                              "p2o.helper.constant.1"], ["batch"],
                                    "p2o.pd_op.slice.0"),
                   helper.make_node("Concat", ["batch", "p2o.helper.constant.2"], ["target"],
                                    "p2o.pd_op.concat.0", axis=0),
                   helper.make_node("Reshape", ["relu", "target"], ["flat"],
                                    "p2o.pd_op.flatten.0"),
                   helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], "p2o.pd_op.matmul.0"),
                   helper.make_node("Add", ["mm", "fc_b"], ["y"], "p2o.pd_op.add.0")],
                  ["p2o.DynamicDimension.0", 1, 8, 8], 11, inits)


def torch_constants() -> onnx.ModelProto:
    """torch.onnx.export's literals as Constant nodes: x.view(x.size(0), -1) as Shape ->
    Gather(Constant) -> Unsqueeze(Constant) -> Concat(Constant) -> Reshape, and the bias
    broadcast by an Expand to a Constant shape."""
    return _model([*_conv("x", "/conv/"),
                   _const("/Constant_output_0", 0), _const("/Constant_1_output_0", [0]),
                   _const("/Constant_2_output_0", [-1]), _const("/Constant_3_output_0", [1, 3]),
                   helper.make_node("Shape", ["relu"], ["shape"], "/Shape"),
                   helper.make_node("Gather", ["shape", "/Constant_output_0"], ["n"], "/Gather",
                                    axis=0),
                   helper.make_node("Unsqueeze", ["n", "/Constant_1_output_0"], ["n1"],
                                    "/Unsqueeze"),
                   helper.make_node("Concat", ["n1", "/Constant_2_output_0"], ["target"],
                                    "/Concat", axis=0),
                   helper.make_node("Reshape", ["relu", "target"], ["flat"], "/Reshape"),
                   helper.make_node("Expand", ["fc_b", "/Constant_3_output_0"], ["bias"],
                                    "/Expand"),
                   helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], "/fc/MatMul"),
                   helper.make_node("Add", ["mm", "bias"], ["y"], "/fc/Add")],
                  ["batch_size", 1, 8, 8], 17)


def ort_quantized(tmp_path: Path) -> onnx.ModelProto:
    """onnxruntime.quantization.quantize_static (QDQ, int8 weights and activations) of the
    float model, calibrated on a few random images: offline, nothing downloaded."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            self._left = [{"x": RNG.random((1, 1, 8, 8), np.float32)} for _ in range(8)]

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self._left.pop() if self._left else None

    src, dst = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    onnx.save(paddle2onnx_2x(), str(src))
    quantize_static(src, dst, Images(), quant_format=QuantFormat.QDQ)
    return onnx.load(str(dst))


STYLES: dict[str, Callable[[Path], onnx.ModelProto]] = {
    "tf2onnx_nhwc": lambda _: tf2onnx_nhwc(), "paddle2onnx_2x": lambda _: paddle2onnx_2x(),
    "torch_constants": lambda _: torch_constants(), "ort_quantized": ort_quantized}


def _images(model: onnx.ModelProto, batch: int) -> np.ndarray:
    images = RNG.random((batch, 1, 8, 8), np.float32)
    channels_last = model.graph.input[0].type.tensor_type.shape.dim[3].dim_value == 1
    return images.transpose(0, 2, 3, 1) if channels_last else images


def onnx_tool_flops(path: Path, feeds: dict[str, np.ndarray]) -> int:
    """onnx-tool's count: multiply-accumulates, two FLOPs each."""
    model = onnx_tool.Model(str(path))
    model.graph.shape_infer(feeds)
    model.graph.profile()
    return 2 * int(sum(node.macs[0] for node in model.graph.nodemap.values()))


@pytest.mark.parametrize("style", STYLES)
def test_an_exporter_style_runs_on_the_opencl_engine_as_on_onnxruntime(
        engine_for, tmp_path, style) -> None:
    model = STYLES[style](tmp_path)
    engine = engine_for(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = _images(model, batch)
        ref = session.run(None, {"x": x})[0]
        got = engine.run({"x": x}, ["y"])["y"]
        # int8: the engine and onnxruntime may round a few values to neighbouring levels
        assert rel_err(got, ref) <= (0.05 if style == "ort_quantized" else 1e-4), batch


@pytest.mark.parametrize("style", STYLES)
def test_an_exporter_styles_flops_match_a_hand_count_and_onnx_tool(tmp_path, style) -> None:
    model = STYLES[style](tmp_path)
    path = tmp_path / f"{style}.onnx"
    onnx.save(model, str(path))
    count = count_flops(path)
    assert not count.partial, count.uncounted
    if style == "ort_quantized":
        # The quantiser drops the ReLU (the conv's output grid clips it) and puts a Quantize
        # and a Dequantize on each activation (x, conv, flat, mm, y); weights' Dequantizes fold.
        assert count.total == HAND_COUNT - 8 * 8 * 4 + 2 * (64 + 256 + 256 + 3 + 3), \
            count.by_op()
    else:
        assert count.total == HAND_COUNT, count.by_op()
    theirs = onnx_tool_flops(path, {"x": _images(model, 1)})
    assert theirs / 2 <= count.total <= 2 * theirs, (count.total, theirs)


def time_major(path: Path) -> None:
    """A sequence model whose batch is axis 1 ([time, batch, features], as recurrent exports
    are): a per-step projection, MatMul 6 -> 5 and ReLU, both leading dims symbolic."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["time", "batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["time", "batch", 5])],
        [_array("w", RNG.normal(0, 0.5, (6, 5)).astype(np.float32))])
    path.parent.mkdir(parents=True)
    onnx.save(make_model(graph, 17), str(path))


def test_a_model_whose_batch_is_not_axis_0_is_served_whole_and_counted_whole(tmp_path) -> None:
    """max_batch_size 0: a request of shape [4, 2, 6] is one sample, run whole on the OpenCL
    engine, and its reply's FLOPs are the count at that whole shape, not one row's times 1."""
    repo = tmp_path / "models"
    path = repo / "time_major" / "1" / "model.onnx"
    time_major(path)
    (repo / "time_major" / "config.pbtxt").write_text(
        'name: "time_major"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, 2, 6 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4, 2, 5 ] } ]\n'
        'parameters { key: "devices" value: { string_value: "opencl:cpu0" } }\n')
    hand = 2 * 4 * 2 * 5 * 6 + 4 * 2 * 5
    count = count_flops(path, {"x": (4, 2, 6)}, batched=False)
    assert (count.total, count.partial) == (hand, False)
    x = RNG.normal(size=(4, 2, 6)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    daemon = Daemon(tmp_path, repo)
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            tensor = grpcclient.InferInput("x", [4, 2, 6], "FP32")
            tensor.set_data_from_numpy(x)
            reply = client.infer("time_major", [tensor])
            assert rel_err(reply.as_numpy("y"), ref) <= 1e-5
            parameters = reply.get_response().parameters
            assert parameters["device"].string_param == "opencl:cpu0"
            assert parameters["flops"].int64_param == hand
    finally:
        assert daemon.stop() == 0
