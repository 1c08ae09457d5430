"""Lowering of the recurrent layers (LSTM, GRU, RNN; kernels/recurrent.cl): the input
projections of every step and direction as one GEMM (matmul_lowering's kernels, with the biases
in its epilogue), then one launch per step for all directions and samples, which adds the hidden
state's projection and applies the gates (two for GRU with linear_before_reset 0, whose reset
gate must be complete before the candidate). The launches follow each other on the device's
queue: no host round trip between steps. ONNX's default activations only; what else ONNX allows
is refused naming the attribute, so that the model runs on its next device."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.launch import BIAS_COL, Dyn, Ref, activation_args, ints
from accelerators.opencl.lowering_state import Lowering
from accelerators.opencl.matmul_lowering import launch_gemm, padded_stride

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"),
                       "RNN": ("tanh",)}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
SAMPLES = 4  # kernels/recurrent.cl's: the samples of a direction one work-item runs


@dataclass(frozen=True)
class Shape:
    steps: int
    batch: int
    inputs: int
    directions: int
    hidden: int
    gates: int
    layout: int

    @property
    def columns(self) -> int:
        """Of the input projections: gates x hidden per direction."""
        return self.directions * self.gates * self.hidden

    @property
    def state(self) -> tuple[int, ...]:
        """Y_h, Y_c, initial_h, initial_c."""
        d, b, h = self.directions, self.batch, self.hidden
        return (b, d, h) if self.layout else (d, b, h)

    @property
    def y(self) -> tuple[int, ...]:
        t, d, b, h = self.steps, self.directions, self.batch, self.hidden
        return (b, t, d, h) if self.layout else (t, d, b, h)

    def strides(self) -> list[np.int32]:
        """x_t, x_b (rows of the projections), y_t, y_d, y_b, s_d, s_b (recurrent.cl)."""
        t, d, b, h, n = self.steps, self.directions, self.batch, self.hidden, self.columns
        if self.layout:
            return ints(n, t * n, d * h, h, t * d * h, h, d * h)
        return ints(b * n, n, d * b * h, b * h, h, b * h, h)


def recurrent(lw: Lowering, node: Node, args: list) -> None:
    args = args + [None] * (8 - len(args))
    check_attributes(node)
    shape = _shape(node, args)
    w, r, bias, lens = (_constant(node, args, i) for i in (1, 2, 3, 4))
    assert w is not None and r is not None  # _shape checked them
    lbr = node.op == "GRU" and bool(node.attrs.get("linear_before_reset", 0))
    wanted = (shape.directions, 2 * shape.gates * shape.hidden)
    b = np.zeros(wanted, np.float32) if bias is None else np.asarray(bias, np.float32)
    if b.shape != wanted:
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: B of shape "
                                    f"{list(b.shape)} is not {list(wanted)}")
    xw = _input_projection(lw, node, args[0], w, b, shape, lbr)
    lens = np.full(shape.batch, shape.steps) if lens is None else np.asarray(lens)
    if lens.shape != (shape.batch,) or lens.min() < 0 or lens.max() > shape.steps:
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: sequence_lens "
                                    f"{lens.tolist()} are not {shape.batch} lengths of at most "
                                    f"{shape.steps} steps")
    outs = _outputs(lw, node, shape)
    head = [Ref(xw.storage),
            lw.ref(np.ascontiguousarray(np.transpose(r, (0, 2, 1))), f"{node.inputs[2]}:recurrent"),
            lw.ref(lens, f"{node.name}:lens{shape.batch}x{shape.steps}", np.int32)]
    first_reverse = 0 if node.attrs.get("direction", "forward") == "reverse" else 1
    size = (shape.hidden, shape.directions * -(-shape.batch // SAMPLES))
    flops = 2 * shape.directions * shape.batch * shape.hidden * shape.hidden  # per gate
    scratch = Ref(lw.new(f"{node.name}:h", shape.state).storage)
    states = _alternating(shape.steps, _state(lw, node, args, 5, shape), outs[1], scratch)
    step_args = _step_args(lw, node, args, shape, outs, b, lbr)
    for step, (h_in, h_out) in enumerate(states):
        common = [*head, h_in, h_out, outs[0], *ints(shape.hidden, shape.batch, step,
                                                        first_reverse), *shape.strides()]
        for kernel, tail, gates in step_args(step, h_in):
            lw.emit(node, kernel, size, common + tail, gates * flops)


def _step_args(lw: Lowering, node: Node, args: list, shape: Shape, outs: list[Ref],
               b: np.ndarray, lbr: bool) -> Callable[[int, Ref], list[tuple[str, list, int]]]:
    """The launches of a step, by step and h_in: kernel, arguments after the common ones, and
    the gates whose recurrent products it computes."""
    if node.op == "LSTM":
        c0, p = _state(lw, node, args, 6, shape), _constant(node, args, 7)
        if p is not None and p.shape != (shape.directions, 3 * shape.hidden):
            raise UnsupportedModelError(f"LSTM node {node.name!r}: P of shape {list(p.shape)} "
                                        f"is not {[shape.directions, 3 * shape.hidden]}")
        peep = [outs[2] if p is None else lw.ref(p, node.inputs[7]), np.int32(p is not None)]
        return lambda step, _: [("lstm_step", [outs[2] if step else c0, outs[2], *peep], 4)]
    if node.op == "RNN":
        return lambda step, _: [("rnn_step", [], 1)]
    rbh = lw.ref(np.ascontiguousarray(b[:, -shape.hidden:]), f"{node.name}:rbh")
    if lbr:  # gru_step reads neither rh nor a reset launch's output
        return lambda _, h_in: [("gru_step", [h_in, rbh, np.int32(1)], 3)]
    rh = Ref(lw.new(f"{node.name}:rh", shape.state).storage)
    return lambda *_: [("gru_reset", [rh], 1), ("gru_step", [rh, rbh, np.int32(0)], 2)]


def check_attributes(node: Node) -> None:
    """The attributes the kernels do not have, refused naming them and their values."""
    a = node.attrs
    named = [v.decode() if isinstance(v, bytes) else v for v in a.get("activations", ())]
    acts = tuple(v.lower() for v in named)
    defaults = DEFAULT_ACTIVATIONS[node.op]
    direction = a.get("direction", "forward")
    unsupported = [
        ("activations", named, bool(acts) and acts != defaults * (len(acts) // len(defaults))),
        ("clip", a.get("clip"), "clip" in a),
        ("input_forget", a.get("input_forget"), bool(a.get("input_forget", 0))),
        ("direction", direction, direction not in DIRECTIONS),
        ("layout", a.get("layout"), a.get("layout", 0) not in (0, 1))]
    for name, value, refused in unsupported:
        if refused:
            raise UnsupportedOpError(
                f"op {node.op!r} of node {node.name!r}: attribute {name} = {value!r} is not "
                f"supported by the OpenCL engine (it runs ONNX's default activations "
                f"{list(defaults)} in each direction, without clip or input_forget)")


def _constant(node: Node, args: list, index: int) -> np.ndarray | None:
    value = args[index]
    if isinstance(value, Dyn):
        name = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")[index]
        raise UnsupportedOpError(f"op {node.op!r} of node {node.name!r}: input {name} "
                                 f"({node.inputs[index]!r}) is computed by the model; the "
                                 f"OpenCL engine takes it only as a constant")
    return value


def _shape(node: Node, args: list) -> Shape:
    x, w, r = args[0], _constant(node, args, 1), _constant(node, args, 2)
    gates, layout = GATES[node.op], node.attrs.get("layout", 0)
    directions = DIRECTIONS[node.attrs.get("direction", "forward")]
    if w is None or r is None or len(x.shape) != 3 or w.ndim != 3 or w.shape[0] != directions:
        raise UnsupportedModelError(
            f"{node.op} node {node.name!r}: X {list(x.shape)} and W "
            f"{None if w is None else list(w.shape)} are not ONNX's (sequence, batch, input) "
            f"and ({directions} directions, gates x hidden, input)")
    hidden = w.shape[1] // gates
    steps, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    shape = Shape(steps, batch, x.shape[2], directions, hidden, gates, layout)
    wanted = (directions, gates * hidden, hidden)
    if r.shape != wanted or w.shape[2] != shape.inputs or node.attrs.get(
            "hidden_size", hidden) != hidden:
        raise UnsupportedModelError(
            f"{node.op} node {node.name!r}: R {list(r.shape)} is not {list(wanted)}, or W "
            f"{list(w.shape)} does not match X {list(x.shape)} and hidden_size "
            f"{node.attrs.get('hidden_size')}")
    return shape


def _input_projection(lw: Lowering, node: Node, x: Dyn | np.ndarray, w: np.ndarray,
                      b: np.ndarray, shape: Shape, lbr: bool) -> Dyn:
    """X W^T + Wb + Rb for every step, sample and direction: one GEMM. GRU's Rb_h stays out
    with linear_before_reset (the reset gate scales it)."""
    n, k = shape.columns, shape.inputs
    key = f"{node.inputs[1]}:recurrent"
    if key not in lw.graph.derived:  # transposed once, whatever the batch size
        wt = np.zeros((k, padded_stride(n)), np.float32)
        wt[:, :n] = w.reshape(n, k).T
        lw.graph.derived[key] = wt
    half = b.shape[1] // 2
    recurrent_bias = b[:, half:].copy()
    if lbr:
        recurrent_bias[:, -shape.hidden:] = 0
    bias = (b[:, :half] + recurrent_bias).reshape(-1)
    xw = lw.new(f"{node.name}:xw", (shape.steps * shape.batch, n))
    m = shape.steps * shape.batch
    launch_gemm(lw, node, lw.ref(x, node.inputs[0]), lw.ref(lw.graph.derived[key], key),
                lw.ref(bias, f"{node.name}:bias"), Ref(xw.storage), m, n, k,
                (k, padded_stride(n), n), 1, (0, 0, 0, 0, 0, 0, 1), BIAS_COL,
                activation_args(node, lw.values), 2 * m * n * k)  # none: nothing is fused in
    return xw


def _state(lw: Lowering, node: Node, args: list, index: int, shape: Shape) -> Ref:
    """initial_h or initial_c, zeros where the input is omitted."""
    value = args[index]
    if value is None:
        return lw.ref(np.zeros(shape.state, np.float32), f"zeros{math.prod(shape.state)}")
    if tuple(value.shape) != shape.state:
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: {node.inputs[index]!r} "
                                    f"of shape {list(value.shape)} is not {list(shape.state)}")
    return lw.ref(value, node.inputs[index])


def _outputs(lw: Lowering, node: Node, shape: Shape) -> list[Ref]:
    """Y, Y_h and Y_c's buffers (LSTM; the others' lists hold two), scratch where the model
    reads none."""
    shapes = [shape.y, shape.state, shape.state][:3 if node.op == "LSTM" else 2]
    refs = []
    for i, dims in enumerate(shapes):
        name = node.outputs[i] if i < len(node.outputs) else ""
        value = lw.new(name or f"{node.name}:out{i}", dims)
        if name:
            lw.values[name] = value
        refs.append(Ref(value.storage))
    return refs


def _alternating(steps: int, h0: Ref, final: Ref, scratch: Ref) -> list[tuple[Ref, Ref]]:
    """(h_in, h_out) of each step: the state alternates between two buffers (every unit reads
    all of the previous state), arranged so that the last step writes `final` (Y_h)."""
    outs = [final if (steps - 1 - s) % 2 == 0 else scratch for s in range(steps)]
    return list(zip([h0, *outs[:-1]], outs))
