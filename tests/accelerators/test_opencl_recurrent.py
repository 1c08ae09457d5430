"""LSTM, GRU and RNN on the OpenCL engine (recurrent_lowering.py, kernels/recurrent.cl) against
ONNX Runtime on the same fresh random inputs, relative error at most 1e-4: each op in each
direction, bare and with every optional input (B, sequence_lens with padding steps, initial
states, LSTM's peepholes), layout 1, outputs read in part; the refusals of what the kernels do
not have, naming op, node, attribute and value; and a CRNN-style text recogniser (convolutions,
the feature map as a sequence, a bidirectional LSTM, per-step class scores) run whole on the
engine."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accelerators.onnx_models import make_model
from accelerators.opencl.ir import UnsupportedOpError
from accelerators.opencl.recurrent_lowering import GATES
from tests.accelerators.conftest import fresh_rng, rel_err

TOL = 1e-4
STEPS, BATCH, INPUTS, HIDDEN = 5, 3, 4, 6
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
          local_tiles: bool | None = None):
    """Runs both and compares every graph output; returns the engine."""
    engine = engine_for(model, local_tiles)
    names = [o.name for o in model.graph.output]
    refs = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(names, feeds)
    got = engine.run(feeds, names)
    for name, ref in zip(names, refs):
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        assert rel_err(got[name], ref) <= TOL, f"{name}: relative error {rel_err(got[name], ref)}"
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
    """Lengths 5, 2 and 0 steps: padding steps give zeros in Y and carry the state to Y_h
    and Y_c; "initial state fed": initial_h and initial_c are graph inputs, not constants."""
    op, attrs = CELLS[cell]
    rng, seed = fresh_rng()
    directions = 2 if direction == "bidirectional" else 1
    consts = weights(rng, op, directions)
    consts["b"] = rng.uniform(-0.5, 0.5, (directions, 2 * GATES[op] * HIDDEN)).astype(np.float32)
    consts["lens"] = np.array([STEPS, 2, 0], np.int32)
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
def test_layout_1_and_outputs_read_in_part(engine_for, op) -> None:
    """Batch first (layout 1: X, Y and the states), bidirectional, explicitly default
    activations, only Y and Y_h read; against ONNX Runtime (which has no layout 1) on the
    same node in layout 0, inputs and outputs transposed."""
    rng, seed = fresh_rng()
    consts = weights(rng, op, 2)
    consts["lens"] = np.array([1, STEPS, 3], np.int32)
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
    assert rel_err(got["y"], y.transpose(2, 0, 1, 3)) <= TOL, seed
    assert rel_err(got["y_h"], y_h.transpose(1, 0, 2)) <= TOL, seed


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
