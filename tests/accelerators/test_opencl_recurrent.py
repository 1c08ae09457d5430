"""LSTM, GRU and RNN on the OpenCL engine (recurrent_lowering.py, kernels/recurrent.cl) against
ONNX Runtime on the same fresh random inputs, relative error at most 1e-4: each op in each
direction, bare and with every optional input (B, sequence_lens with padding steps, initial
states, LSTM's peepholes), layout 1, outputs read in part, the local tiles' GEMM and fp16
storage (5e-3); the refusals of what the kernels do not have, naming op, node, attribute and
value; and a CRNN-style text recogniser (convolutions, the feature map as a sequence, a
bidirectional LSTM, per-step class scores) whole on the engine, and on the emulated FPGA."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accelerators.onnx_models import make_model
from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.ir import UnsupportedOpError
from accelerators.opencl.launch import HOST
from accelerators.opencl.recurrent_lowering import GATES
from tests.support.numerics import fresh_rng, rel_err
from tests.support.onnx_graphs import agrees_with_onnxruntime
from tests.support.opencl_devices import NO_EMULATOR, emulated_fpga

TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3}  # fp16: test_opencl_fp16's per-op bound
# Batch 6: a full tile of the kernels' 4 samples and a partial one.
STEPS, BATCH, INPUTS, HIDDEN = 5, 6, 4, 6
OUTPUTS = {"LSTM": ["y", "y_h", "y_c"], "GRU": ["y", "y_h"], "RNN": ["y", "y_h"]}
KERNELS = {"LSTM": {"lstm_step"}, "GRU": {"gru_reset", "gru_step"}, "RNN": {"rnn_step"}}


def recurrent_model(op: str, consts: dict[str, np.ndarray], x_shape: tuple[int, ...],
                    inputs: list[str], outputs: list[str], dynamic: tuple[str, ...] = ("x",),
                    **attrs) -> onnx.ModelProto:
    """One recurrent node: `inputs` in ONNX's order ("" for omitted ones), the `dynamic` ones
    graph inputs (x, and initial states where a test makes them so), the rest initializers."""
    node = helper.make_node(op, inputs, outputs, name=f"the_{op.lower()}", hidden_size=HIDDEN,
                            **attrs)
    shapes = {"x": x_shape, **{k: v.shape for k, v in consts.items()}}
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shapes[n]))
                     for n in dynamic],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if k not in dynamic])
    return make_model(graph, 17)


def weights(rng: np.random.Generator, op: str, directions: int) -> dict[str, np.ndarray]:
    gh = GATES[op] * HIDDEN
    return {"w": rng.uniform(-0.6, 0.6, (directions, gh, INPUTS)).astype(np.float32),
            "r": rng.uniform(-0.6, 0.6, (directions, gh, HIDDEN)).astype(np.float32)}


def check(engine_for, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
          local_tiles: bool | None = None, precision: str = "fp32"):
    """Runs both and compares every graph output; returns the engine."""
    engine = engine_for(model, local_tiles, precision)
    agrees_with_onnxruntime(engine, model, feeds, TOLERANCE[precision])
    return engine


VARIANTS = {"bare": ("x", "w", "r"),
            "all inputs": ("x", "w", "r", "b", "lens", "h0", "c0"),
            "bias and lengths": ("x", "w", "r", "b", "lens"),
            "initial state fed": ("x", "w", "r", "", "", "h0", "c0")}
CELLS = {"LSTM": ("LSTM", {}), "GRU": ("GRU", {}),
         "GRU linear_before_reset": ("GRU", {"linear_before_reset": 1}), "RNN": ("RNN", {})}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_each_op_direction_and_optional_inputs(engine_for, cell, direction, variant) -> None:
    """Lengths from 0 to 5 steps: padding steps give zeros in Y and carry the state to Y_h
    and Y_c; "initial state fed": initial_h and initial_c are graph inputs, not constants."""
    op, attrs = CELLS[cell]
    rng, seed = fresh_rng()
    directions = 2 if direction == "bidirectional" else 1
    consts = weights(rng, op, directions)
    consts["b"] = rng.uniform(-0.5, 0.5, (directions, 2 * GATES[op] * HIDDEN)).astype(np.float32)
    consts["lens"] = np.array([STEPS, 2, 0, 3, STEPS, 1], np.int32)
    for state in ("h0", "c0"):
        consts[state] = rng.standard_normal((directions, BATCH, HIDDEN)).astype(np.float32)
    names = list(VARIANTS[variant])[:7 if op == "LSTM" else 6]
    dynamic = ("x", "h0", "c0")[:len(OUTPUTS[op])] if variant == "initial state fed" else ("x",)
    x = rng.standard_normal((STEPS, BATCH, INPUTS)).astype(np.float32)
    model = recurrent_model(op, {k: v for k, v in consts.items() if k in names}, x.shape,
                            names, OUTPUTS[op], dynamic, direction=direction, **attrs)
    feeds = {"x": x, **{k: consts[k] for k in dynamic[1:]}}
    engine = check(engine_for, model, feeds)
    kernels = {la.kernel for la in engine.plan(1).launches}
    expected = KERNELS[op] - ({"gru_reset"} if attrs else set())
    assert kernels - {"gemm_tile", "gemm1"} == expected, (kernels, seed)


@pytest.mark.parametrize("op", list(GATES))
def test_fp16_storage(engine_for, op) -> None:
    """Tensors and weights stored as halves, the gates computed in float."""
    rng, seed = fresh_rng()
    consts = weights(rng, op, 2)
    consts["b"] = rng.uniform(-0.5, 0.5, (2, 2 * GATES[op] * HIDDEN)).astype(np.float32)
    consts["lens"] = np.array([STEPS, 2, 4, 1, 3, STEPS], np.int32)
    x = rng.standard_normal((STEPS, BATCH, INPUTS)).astype(np.float32)
    model = recurrent_model(op, consts, x.shape, ["x", "w", "r", "b", "lens"], OUTPUTS[op],
                            direction="bidirectional")
    check(engine_for, model, {"x": x}, precision="fp16")


@pytest.mark.parametrize("op", list(GATES))
def test_layout_1_and_outputs_read_in_part(engine_for, op) -> None:
    """Batch first (layout 1: X, Y and the states), bidirectional, explicitly default
    activations, only Y and Y_h read; against ONNX Runtime (which has no layout 1) on the
    same node in layout 0, inputs and outputs transposed."""
    rng, seed = fresh_rng()
    consts = weights(rng, op, 2)
    consts["lens"] = np.array([1, STEPS, 3, 2, STEPS, 4], np.int32)
    consts["h0"] = rng.standard_normal((BATCH, 2, HIDDEN)).astype(np.float32)
    x = rng.standard_normal((BATCH, STEPS, INPUTS)).astype(np.float32)
    inputs, outputs = ["x", "w", "r", "", "lens", "h0"], ["y", "y_h"]
    acts = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
    engine = engine_for(recurrent_model(op, consts, x.shape, inputs, outputs, layout=1,
                                        direction="bidirectional", activations=acts[op] * 2))
    got = engine.run({"x": x}, outputs)
    seq_first = recurrent_model(op, {**consts, "h0": consts["h0"].transpose(1, 0, 2)},
                                (STEPS, BATCH, INPUTS), inputs, outputs,
                                direction="bidirectional")
    y, y_h = ort.InferenceSession(seq_first.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(
        outputs, {"x": x.transpose(1, 0, 2)})
    assert rel_err(got["y"], y.transpose(2, 0, 1, 3)) <= TOLERANCE["fp32"], seed
    assert rel_err(got["y_h"], y_h.transpose(1, 0, 2)) <= TOLERANCE["fp32"], seed


@pytest.mark.parametrize("local_tiles", [False, True])
def test_lstm_peepholes(engine_for, local_tiles) -> None:
    """Also on GPUs' and FPGAs' local tiles (the input projection's gemm_local)."""
    rng, _ = fresh_rng()
    consts = weights(rng, "LSTM", 2)
    consts["p"] = rng.uniform(-0.5, 0.5, (2, 3 * HIDDEN)).astype(np.float32)
    x = rng.standard_normal((STEPS, BATCH, INPUTS)).astype(np.float32)
    model = recurrent_model("LSTM", consts, x.shape, ["x", "w", "r", "", "", "", "", "p"],
                            ["y", "", "y_c"], direction="bidirectional")
    engine = check(engine_for, model, {"x": x}, local_tiles)
    assert ("gemm_local" in {la.kernel for la in engine.plan(1).launches}) == local_tiles


@pytest.mark.parametrize("op, attribute, value", [
    ("LSTM", "activations", ["Sigmoid", "Relu", "Tanh"]),
    ("GRU", "activations", ["HardSigmoid", "Tanh"]),
    ("RNN", "activations", ["Relu"]),
    ("LSTM", "clip", 3.0),
    ("LSTM", "input_forget", 1),
    ("RNN", "clip", 1.5)])
def test_refusals_name_op_node_attribute_and_value(engine_for, op, attribute, value) -> None:
    rng, _ = fresh_rng()
    model = recurrent_model(op, weights(rng, op, 1), (STEPS, BATCH, INPUTS), ["x", "w", "r"],
                            ["y"], **{attribute: value})
    with pytest.raises(UnsupportedOpError) as e:
        engine_for(model)
    message = str(e.value)
    assert f"op {op!r}" in message and f"node 'the_{op.lower()}'" in message
    assert f"attribute {attribute} = {value!r}" in message


def test_sequence_lengths_computed_by_the_model_are_refused(engine_for) -> None:
    rng, _ = fresh_rng()
    consts = weights(rng, "GRU", 1)
    node = helper.make_node("GRU", ["x", "w", "r", "", "lens"], ["y"], name="the_gru")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, BATCH, INPUTS]),
         helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    with pytest.raises(UnsupportedOpError, match="node 'the_gru': input sequence_lens"):
        engine_for(make_model(graph, 17))


@pytest.mark.parametrize("op", list(GATES))
def test_only_the_final_state_read(engine_for, op) -> None:
    """Y omitted (an empty output name): its steps go to a scratch buffer."""
    rng, _ = fresh_rng()
    x = rng.standard_normal((STEPS, BATCH, INPUTS)).astype(np.float32)
    check(engine_for, recurrent_model(op, weights(rng, op, 1), x.shape, ["x", "w", "r"],
                                      ["", "y_h"], direction="reverse"), {"x": x})


# The recogniser: 1 x 16 x 32 text-line images, three conv blocks down to a 1-row feature map
# of 8 columns (the steps), a bidirectional LSTM over them, per-step scores of 11 classes
# (10 characters and CTC's blank).
LINE, CLASSES, CRNN_HIDDEN = (1, 16, 32), 11, 12


def crnn(rng: np.random.Generator, variable_width: bool = False) -> onnx.ModelProto:
    """`variable_width`: lines of any width (a multiple of 4), one step per 4 columns."""
    def conv(c_in: int, c_out: int) -> np.ndarray:
        return rng.normal(0, (2 / (9 * c_in)) ** 0.5, (c_out, c_in, 3, 3)).astype(np.float32)

    consts = {"w1": conv(1, 8), "w2": conv(8, 16), "w3": conv(16, 16),
              "b3": rng.uniform(-0.1, 0.1, 16).astype(np.float32),
              "seq": np.array([0, 16, -1 if variable_width else 8], np.int64),
              "lw": rng.uniform(-0.3, 0.3, (2, 4 * CRNN_HIDDEN, 16)).astype(np.float32),
              "lr": rng.uniform(-0.3, 0.3, (2, 4 * CRNN_HIDDEN, CRNN_HIDDEN)).astype(np.float32),
              "lb": rng.uniform(-0.2, 0.2, (2, 8 * CRNN_HIDDEN)).astype(np.float32),
              "steps": np.array([0, 0, -1], np.int64),
              "fc": rng.normal(0, 0.3, (2 * CRNN_HIDDEN, CLASSES)).astype(np.float32),
              "fcb": rng.uniform(-0.1, 0.1, CLASSES).astype(np.float32)}
    n = helper.make_node
    nodes = [n("Conv", ["image", "w1"], ["c1"], pads=[1] * 4), n("Relu", ["c1"], ["r1"]),
             n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w2"], ["c2"], pads=[1] * 4), n("Relu", ["c2"], ["r2"]),
             n("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p2", "w3", "b3"], ["c3"], pads=[1] * 4), n("Relu", ["c3"], ["r3"]),
             n("MaxPool", ["r3"], ["p3"], kernel_shape=[4, 1], strides=[4, 1]),
             n("Reshape", ["p3", "seq"], ["features"]),  # (n, 16, 8): the columns
             n("Transpose", ["features"], ["sequence"], perm=[2, 0, 1]),  # (8, n, 16)
             n("LSTM", ["sequence", "lw", "lr", "lb"], ["y"], name="blstm",
               hidden_size=CRNN_HIDDEN, direction="bidirectional"),  # (8, 2, n, 12)
             n("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             n("Reshape", ["yt", "steps"], ["both"]),  # (8, n, 24)
             n("MatMul", ["both", "fc"], ["scores"]), n("Add", ["scores", "fcb"], ["biased"]),
             n("Transpose", ["biased"], ["logits"], perm=[1, 0, 2])]  # (n, 8, 11)
    width = ["w"] if variable_width else [LINE[2]]
    graph = helper.make_graph(
        nodes, "crnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                      ["n", *LINE[:2], *width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return make_model(graph, 17)


def _crnn_agrees(engine: OpenCLEngine, model: onnx.ModelProto, rng: np.random.Generator,
                 batch: int, seed: int, width: int = LINE[2]) -> None:
    """Within the model tests' 1e-3 and the same best class at every step."""
    x = rng.standard_normal((batch, *LINE[:2], width)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    got = engine.run({"image": x}, ["logits"])["logits"]
    assert got.shape == ref.shape == (batch, width // 4, CLASSES)
    assert rel_err(got, ref) <= 1e-3, (rel_err(got, ref), seed)
    assert (got.argmax(-1) == ref.argmax(-1)).all(), seed


@pytest.mark.parametrize("batch", [1, 5, 20])
def test_crnn_recogniser_runs_whole_on_the_engine(engine_for, batch) -> None:
    """Batch 20 runs as two CPU slices; every node is lowered to kernels (none on the host)."""
    rng, seed = fresh_rng(3)
    model = crnn(rng)
    engine = engine_for(model)
    launches = engine.plan(min(batch, engine.slice)).launches
    assert HOST not in {la.kernel for la in launches} and not engine.on_host
    assert [la.kernel for la in launches if la.node == "blstm"].count("lstm_step") == 8
    _crnn_agrees(engine, model, rng, batch, seed)


def test_crnn_recogniser_of_lines_of_any_width(engine_for) -> None:
    """Planned per request shape: the sequence is as long as the line is wide."""
    rng, seed = fresh_rng(3)
    model = crnn(rng, variable_width=True)
    engine = engine_for(model)
    for width in (32, 48, 16):
        _crnn_agrees(engine, model, rng, 3, seed, width)


# The emulated FPGA's tests run in `make fpga-check`'s own process: after Intel's CPU runtime
# (the fp16 tests' cpu1) and the emulator had both made many contexts in one pytest process, a
# pipeline's four concurrent kernels waited for TBB workers forever (seen in a full run).
needs_emulator = pytest.mark.skipif(emulated_fpga() is None, reason=NO_EMULATOR)


@pytest.mark.fpga_models
@needs_emulator
def test_crnn_recogniser_on_the_emulated_fpga(tmp_path, program_cache, caplog) -> None:
    """The convolutions on the FPGA's pipeline, the bidirectional LSTM on the host between its
    passes, as any node the pipeline does not cover."""
    rng, seed = fresh_rng(3)
    model = crnn(rng)
    onnx.save(model, str(tmp_path / "crnn.onnx"))
    with caplog.at_level("INFO", logger="accelerators.opencl.engine"):
        engine = OpenCLEngine(tmp_path / "crnn.onnx", "fpga0", program_cache)
    kernels = [la.kernel for la in engine.plan(2).launches]
    assert kernels.count("fpga_conv") == 3 and "blstm" in engine.on_host, engine.on_host
    assert "op LSTM has no FPGA kernel" in caplog.text
    _crnn_agrees(engine, model, rng, 2, seed)


@pytest.mark.fpga_models
@needs_emulator
@pytest.mark.parametrize("op", list(GATES))
def test_on_the_emulated_fpga_host(tmp_path, program_cache, op) -> None:
    """A recurrent node alone on an FPGA is a host step (ONNX's reference evaluator): Y
    omitted, full-length sequence_lens and initial_h agree; what that evaluator would ignore
    (shorter sequences, clip) is refused naming it."""
    rng, seed = fresh_rng()
    consts = weights(rng, op, 2)
    consts["h0"] = rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32)
    x = rng.standard_normal((STEPS, BATCH, INPUTS)).astype(np.float32)
    inputs = ["x", "w", "r", "", "lens", "h0"]

    def load(lens: list[int], **attrs) -> tuple[OpenCLEngine, onnx.ModelProto]:
        model = recurrent_model(op, {**consts, "lens": np.array(lens, np.int32)}, x.shape,
                                inputs, ["", "y_h"], direction="bidirectional", **attrs)
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.onnx"
        onnx.save(model, str(path))
        return OpenCLEngine(path, "fpga0", program_cache), model

    engine, model = load([STEPS] * BATCH)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(["y_h"], {"x": x})[0]
    assert rel_err(engine.run({"x": x}, ["y_h"])["y_h"], ref) <= TOLERANCE["fp32"], seed
    with pytest.raises(UnsupportedOpError, match=f"node 'the_{op.lower()}': input sequence_lens"):
        load([STEPS, 2, 1, STEPS, STEPS, STEPS])
    with pytest.raises(UnsupportedOpError, match="attribute clip = 2.0"):
        load([STEPS] * BATCH, clip=2.0)
