"""The FPGA pipeline (kernels/fpga/pipeline.cl) on Intel's emulator, against ONNX Runtime: a sweep
of convolution shapes (kernel sizes 1 to 11, strides, padding, groups and depthwise, channels
that fill neither VEC nor LANE, several blocks of output channels, batches), fused max pools,
fully connected layers, the epilogue's activations, the nodes the host takes (and why), layers
the board's buffers cannot hold, and the MNIST example in fp32, fp16 and int8. The emulator runs
single work-item loops one iteration at a time, so the shapes are small; the whole models run in
`make fpga-check`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from accelerators.engine_options import TOLERANCE
from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.fpga.lowering import STAGES
from accelerators.opencl.launch import HOST
from accelerators.opencl.program_cache import ProgramCache
from tests.support.daemon import MODEL, MODELS
from tests.support.numerics import fresh_rng, rel_err
from tests.support.onnx_graphs import literal_qdq, output_step
from tests.support.opencl_devices import NO_EMULATOR, emulated_fpga
from tools import quantize_int8

pytestmark = pytest.mark.skipif(emulated_fpga() is None, reason=NO_EMULATOR)
MNIST = MODELS / MODEL / "1" / "model.onnx"


def _model(nodes: list, shape: tuple[int, ...], consts: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return make_model(graph, opset)


def _load(tmp_path: Path, model: onnx.ModelProto, cache: ProgramCache,
          precision: str = "fp32", board: str | None = None) -> tuple[OpenCLEngine, Path]:
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(model, str(path))
    return OpenCLEngine(path, "fpga0", cache, precision=precision, board=board), path


def _reference(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _kernels(engine: OpenCLEngine, batch: int) -> list[str]:
    return [la.kernel for la in engine.plan(batch).launches]


# n, c, h, w, m, k, stride, pad, groups
CONVS = [(1, 3, 9, 9, 5, 3, 1, 1, 1), (2, 10, 12, 11, 20, 3, 2, 1, 1),
         (1, 5, 8, 8, 70, 1, 2, 0, 1), (1, 3, 30, 30, 16, 11, 4, 2, 1),
         (3, 16, 7, 7, 16, 3, 1, 1, 16), (1, 12, 10, 10, 8, 5, 1, 2, 2),
         (1, 9, 6, 6, 4, 3, 3, 0, 1), (2, 4, 5, 9, 6, 1, 1, 0, 1)]


@pytest.mark.parametrize("shape", CONVS, ids=lambda s: "x".join(map(str, s)))
def test_convolutions_run_on_the_pipeline(tmp_path, program_cache, shape) -> None:
    n, c, h, w, m, k, s, p, g = shape
    rng, seed = fresh_rng()
    consts = {"w": rng.standard_normal((m, c // g, k, k), np.float32),
              "b": rng.standard_normal(m, np.float32)}
    model = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[s, s],
                                     pads=[p] * 4, group=g),
                    helper.make_node("Relu", ["c"], ["y"])], (n, c, h, w), consts)
    engine, path = _load(tmp_path, model, program_cache)
    assert _kernels(engine, n) == list(STAGES)  # one pass, nothing on the host
    x = rng.standard_normal((n, c, h, w), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


def test_uneven_padding_runs_on_the_pipeline(tmp_path, program_cache) -> None:
    """tf2onnx's SAME padding: more at the bottom and right, which the read stage pads as the
    rows and columns past the input."""
    rng, seed = fresh_rng()
    consts = {"w": rng.standard_normal((7, 5, 3, 3), np.float32)}
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2],
                                     pads=[0, 1, 2, 1])], (2, 5, 9, 8), consts)
    engine, path = _load(tmp_path, model, program_cache)
    assert _kernels(engine, 2) == list(STAGES)
    x = rng.standard_normal((2, 5, 9, 8), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


# kernel, stride, pad
POOLS = [(2, 2, 0), (3, 2, 1), (3, 2, 0), (2, 1, 0), (3, 3, 1)]


@pytest.mark.parametrize("pool", POOLS, ids=lambda s: "k{}s{}p{}".format(*s))
def test_a_max_pool_after_a_convolution_runs_in_the_pool_stage(tmp_path, program_cache,
                                                               pool) -> None:
    k, s, p = pool
    rng, seed = fresh_rng()
    consts = {"w": rng.standard_normal((9, 6, 3, 3), np.float32)}
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
                    helper.make_node("Relu", ["c"], ["r"]),
                    helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[k, k],
                                     strides=[s, s], pads=[p] * 4)], (2, 6, 11, 13), consts)
    engine, path = _load(tmp_path, model, program_cache)
    assert _kernels(engine, 2) == list(STAGES)  # the pool fused: still one pass
    x = rng.standard_normal((2, 6, 11, 13), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


@pytest.mark.parametrize("form", ["gemm", "gemm_transB", "matmul_add"])
def test_fully_connected_layers_run_as_1x1_convolutions(tmp_path, program_cache, form) -> None:
    rng, seed = fresh_rng()
    k, n = 300, 70  # neither fills VEC nor LANE: zero-filled words and lanes
    w = rng.standard_normal((k, n), np.float32)
    bias = rng.standard_normal(n, np.float32)
    if form == "matmul_add":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
                 helper.make_node("Add", ["p", "b"], ["y"])]
    else:
        trans = form == "gemm_transB"
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=int(trans),
                                  alpha=0.5, beta=2.0)]
        w = w.T.copy() if trans else w
    engine, path = _load(tmp_path, _model(nodes, (3, k), {"w": w, "b": bias}), program_cache)
    assert _kernels(engine, 3) == list(STAGES)
    x = rng.standard_normal((3, k), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


def test_activations_without_an_epilogue_and_other_ops_run_on_the_host(
        tmp_path, program_cache, caplog) -> None:
    """ReLU6 (Clip) and LeakyRelu in the epilogue; a Sigmoid after the pass; a residual Add,
    a BatchNormalization no convolution takes in (opset 13, which onnx's reference evaluator
    gets wrong), a global average pool and a Softmax between and after the passes; each host
    node named with its reason at load."""
    rng, seed = fresh_rng()
    consts = {"w1": rng.standard_normal((8, 4, 3, 3), np.float32),
              "w2": rng.standard_normal((8, 8, 3, 3), np.float32),
              "w3": 0.05 * rng.standard_normal((8, 8, 1, 1), np.float32),
              "lo": np.float32(0), "hi": np.float32(6), "fc": rng.standard_normal((8, 5),
                                                                                   np.float32),
              **{k: rng.random(8, np.float32) + 0.5 for k in ("s", "sh", "m", "v")}}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
             helper.make_node("Clip", ["a", "lo", "hi"], ["a6"]),
             helper.make_node("Conv", ["a6", "w2"], ["b"], pads=[1] * 4),
             helper.make_node("LeakyRelu", ["b"], ["bl"], alpha=0.1),
             helper.make_node("Conv", ["bl", "w3"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["cs"]),
             helper.make_node("Add", ["cs", "a6"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "sh", "m", "v"], ["rn"]),
             helper.make_node("GlobalAveragePool", ["rn"], ["gp"]),
             helper.make_node("Flatten", ["gp"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    with caplog.at_level("INFO", logger="accelerators.opencl.engine"):
        engine, path = _load(tmp_path, _model(nodes, (2, 4, 8, 8), consts, opset=13),
                             program_cache)
    kernels = _kernels(engine, 2)
    assert kernels.count("fpga_conv") == 4 and kernels.count(HOST) == 5
    assert "-DACT_LEAKY" in engine.build.defines
    log = caplog.text
    assert "5 nodes on the host" in log and "activation Sigmoid has no FPGA epilogue" in log
    assert "op Add has no FPGA kernel" in log and "op Softmax has no FPGA kernel" in log
    x = rng.standard_normal((2, 4, 8, 8), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


def test_a_layer_the_board_cannot_hold_runs_on_the_host_saying_why(
        tmp_path, program_cache) -> None:
    """On a board's FIFO depth (8), which the stages stream through without deadlock."""
    board = tmp_path / "small.toml"
    text = (Path(__file__).parents[2] / "kernels" / "boards" / "emulator.toml").read_text()
    board.write_text(text.replace("weight_buffer = 1152", "weight_buffer = 8").replace(
        "channel_depth = 1024", "channel_depth = 8"))
    rng, seed = fresh_rng()
    consts = {"w1": rng.standard_normal((6, 8, 1, 1), np.float32),
              "w2": rng.standard_normal((6, 6, 3, 3), np.float32)}  # 9 words: too many
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["y"], pads=[1] * 4)]
    engine, path = _load(tmp_path, _model(nodes, (1, 8, 6, 6), consts), program_cache,
                         board=str(board))
    assert "-DCHANNEL_DEPTH=8" in engine.build.defines
    plan = engine.plan(1)
    assert [la.kernel for la in plan.launches] == [*STAGES, HOST]
    (node, reason), = engine.on_host.items()
    assert "exceeds the weight buffer's 8" in reason
    x = rng.standard_normal((1, 8, 6, 6), np.float32)
    assert rel_err(engine.run({"x": x}, ["y"])["y"], _reference(path, x)) < 1e-5, seed


def test_the_mnist_example_in_fp32_and_fp16(program_cache, holdout) -> None:
    images, labels = holdout[0][:64], holdout[1][:64]
    ref = ort.InferenceSession(str(MNIST), providers=["CPUExecutionProvider"]).run(
        None, {"image": images})[0]
    for precision, bound in (("fp32", 1e-5), ("fp16", TOLERANCE["fp16"])):
        engine = OpenCLEngine(MNIST, "fpga0", program_cache, precision=precision)
        assert _kernels(engine, 64) == list(STAGES) * 4  # every layer on the board
        got = engine.run({"image": images}, ["logits"])["logits"]
        assert rel_err(got, ref) < bound, precision
        assert (got.argmax(1) == labels).mean() >= (ref.argmax(1) == labels).mean() - 0.02


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_the_mnist_example_in_int8_within_one_output_step(tmp_path, program_cache, holdout,
                                                          activations) -> None:
    path = quantize_int8.quantize(
        MNIST, tmp_path / "int8.onnx", "image", holdout[0][:quantize_int8.CALIBRATION],
        {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}[activations])
    engine = OpenCLEngine(path, "fpga0", program_cache)
    assert "-DQ8" in engine.build.defines and "-DPIPE_DEPTH=1" in engine.build.defines
    assert _kernels(engine, 32).count("fpga_conv") == 4
    images = holdout[0][quantize_int8.CALIBRATION:quantize_int8.CALIBRATION + 32]
    got = engine.run({"image": images}, ["logits"])["logits"]
    ref = literal_qdq(path).run(["logits"], {"image": images})[0]
    assert np.abs(got - ref).max() <= 1.01 * output_step(path, "logits")
