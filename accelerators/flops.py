"""FLOPs of one sample of an ONNX model, counted from its graph.

How operations are counted (the figure GFLOP/s per watt is built on):
- one multiply-add is two FLOPs: Conv is 2 × outputs × (input channels / group) × kernel area,
  ConvTranspose 2 × inputs × (output channels / group) × kernel area (each input scatters
  into a window), Gemm 2·M·N·K, MatMul 2 × outputs × K, Einsum 2 × outputs × the summed
  letters' sizes; a bias adds one FLOP per output. Integer ops (ConvInteger, MatMulInteger,
  QLinearConv, QLinearMatMul) count their multiply-adds the same way: operations, not only
  floating-point ones;
- pooling: one FLOP per window element per output (MaxPool compares, AveragePool adds); global
  pooling one per input element;
- elementwise operators (Add, Sub, Mul, Div, Relu, Sigmoid, Clip, ...): one per output element;
  BatchNormalization two (a scale and a shift once folded); Softmax three (exp, sum, divide);
  LRN 2 × size + 3 (the window's squares summed, then scale, power and divide);
  LayerNormalization, InstanceNormalization and GroupNormalization eight per element (mean,
  then subtract, square and sum for the variance, normalize, scale and shift); QuantizeLinear
  and DequantizeLinear one;
- reductions (ReduceSum, ReduceMean, ReduceMax, ..., ArgMax, ArgMin): one per input element,
  two for ReduceL2 and ReduceSumSquare (square and add);
- Resize: nearest is data movement; linear 2 × 2^k and cubic 2 × 4^k per output, k the
  resized axes (the taps' weighted sum);
- attention blocks (ONNX's Attention, com.microsoft's Attention and MultiHeadAttention):
  2 × queries × keys × (Q·K hidden size + V hidden size) for the two products, 3 per score for
  the softmax, and the packed QKV projection of com.microsoft's Attention; exporters'
  decomposed attention (MatMul, Softmax, MatMul) is counted op by op;
- LSTM, GRU and RNN: per step, direction and sample, 2 × gates × hidden × (input + hidden) for
  the gates' products, and 4 × gates × hidden for their biases, activations and the state
  update (4, 3 and 1 gates);
- data movement and constants (Reshape, Flatten, Transpose, Concat, Constant, ConstantOfShape,
  ...) are free.
Operators outside these lists, or whose shapes are unknown, are reported as uncounted, never
guessed, and the count is then partial. Nodes the OpenCL engine computes on the host at load
(accelerators/onnx_folding: those whose inputs are constants or shapes, such as exporters'
`Shape -> Gather -> Cast -> Slice -> Concat -> Reshape` before a fully connected layer, PyTorch's
Constant literals, a Transpose of a weight) are folded first, by the same rule and evaluator,
so that shape inference reaches the ops after them; those nodes are free. Shapes come from
ONNX shape inference at the served shapes: every symbolic batch dimension set to one (a model
served without a batch axis, max_batch_size 0, has none: a request is one sample), and the other
symbolic dimensions to the model's config.pbtxt dims where it fixes them; where the config leaves
a dim variable (-1), a FlopCounter counts each request shape that comes (cached). A count is
never negative and never raises: a graph shape inference cannot read is counted as far as it goes.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from accelerators.einsum_equation import explicit
from accelerators.onnx_folding import Activation, fold

log = logging.getLogger(__name__)

ELEMENTWISE = frozenset((
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Neg", "Abs", "Sqrt",
    "Reciprocal", "Exp", "Log", "Erf", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid",
    "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Tanh", "Clip", "Gelu", "Mish", "Celu",
    "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Mod", "Where",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not"))
PER_ELEMENT = {"BatchNormalization": 2, "Softmax": 3, "LogSoftmax": 3,
               "LayerNormalization": 8, "InstanceNormalization": 8, "GroupNormalization": 8,
               "QuantizeLinear": 1, "DequantizeLinear": 1}
PER_INPUT = {"ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1,
             "ReduceL1": 2, "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSum": 1,
             "ReduceLogSumExp": 2, "ArgMax": 1, "ArgMin": 1}
MULTIPLY_ADDS = frozenset(("Conv", "ConvInteger", "QLinearConv"))
MATMULS = frozenset(("MatMul", "MatMulInteger", "QLinearMatMul"))
POOLS = frozenset(("MaxPool", "AveragePool", "LpPool"))
GLOBAL_POOLS = frozenset(("GlobalAveragePool", "GlobalMaxPool"))
# Recurrent layers: gates per step (LSTM: input, output, forget, cell; GRU: update, reset,
# hidden; RNN: one).
RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
FREE = frozenset((
    "Constant", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity",
    "Dropout", "Concat", "Shape", "Gather", "Slice", "Cast", "Split", "Pad", "Expand",
    "ConstantOfShape", "Tile", "GatherElements", "GatherND", "ScatterND", "ScatterElements",
    "DepthToSpace", "SpaceToDepth", "Range", "Size", "NonZero", "Upsample", "CastLike"))


@dataclass(frozen=True)
class NodeFlops:
    name: str
    op_type: str
    flops: int


@dataclass(frozen=True)
class FlopCount:
    nodes: tuple[NodeFlops, ...]
    uncounted: tuple[str, ...] = field(default=())  # op types this module does not count

    @property
    def total(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def partial(self) -> bool:
        """Some nodes are not in `total`: it is a lower bound."""
        return bool(self.uncounted)

    def by_op(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.op_type] = out.get(n.op_type, 0) + n.flops
        return out


def count_flops(path: Path | str, served: dict[str, tuple[int, ...]] | None = None,
                batched: bool = True) -> FlopCount:
    """FLOPs of one sample of the model at `path`. `served`: each input's dims as the model is
    served (config.pbtxt's), which fix the graph's symbolic ones: after the batch axis where
    the model is `batched` (max_batch_size > 0), else every axis, a request being one sample."""
    model = onnx.load(str(path))
    for value in model.graph.input:
        fixed = (served or {}).get(value.name, ())
        for i, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            size = _served_size(i - 1 if batched else i, fixed)
            if size > 0:
                dim.dim_value = size
    try:
        model = _fold_shape_code(model)
    except Exception as e:  # onnx raises its own error types; count what the graph says
        log.warning("%s: shape inference failed (%s); FLOPs counted where shapes are known",
                    path, e)
    shapes = _shapes(model.graph)
    nodes, uncounted = [], set()
    for node in model.graph.node:
        try:
            flops = _node_flops(node, shapes)
        except (KeyError, IndexError, ValueError):  # shapes inference could not fix, malformed
            flops = None
        if flops is None or flops < 0:
            uncounted.add(node.op_type)
            flops = 0
        nodes.append(NodeFlops(node.name or node.output[0], node.op_type, flops))
    return FlopCount(tuple(nodes), tuple(sorted(uncounted)))


class FlopCounter:
    """A served model's FLOPs per sample: counted once where config.pbtxt fixes every dim, else
    per distinct request shape (the last SHAPES kept). Each op type the count leaves out is
    named once in the log."""

    SHAPES = 64

    def __init__(self, path: Path | str, served: dict[str, tuple[int, ...]],
                 batched: bool = True) -> None:
        """`served` and `batched` as count_flops takes them."""
        self._path = path
        self._batched = batched
        self._named: set[str] = set()
        self._lock = threading.Lock()
        self._variable = any(d == -1 for dims in served.values() for d in dims)
        self._at = functools.lru_cache(maxsize=self.SHAPES)(self._count)
        self.served = self._count(tuple(sorted(served.items())))

    def per_sample(self, inputs: dict[str, np.ndarray]) -> FlopCount:
        """At the per-sample shapes of a batch's inputs (read only where a dim is variable); a
        model without a batch axis takes a request whole, as one sample."""
        if not self._variable:
            return self.served
        skip = 1 if self._batched else 0
        return self._at(tuple(sorted((name, a.shape[skip:]) for name, a in inputs.items())))

    def _count(self, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> FlopCount:
        count = count_flops(self._path, dict(shapes), self._batched)
        with self._lock:
            new = set(count.uncounted) - self._named
            self._named |= new
        if new:
            log.warning("%s: FLOPs of %s are not counted; the count is partial", self._path,
                        sorted(new))
        return count


def _served_size(axis: int, fixed: tuple[int, ...]) -> int:
    """The size a symbolic dim is counted at, `axis` counted after the batch axis (-1: the batch
    axis, counted as one sample); -1 where the config leaves it variable."""
    if axis < 0:
        return 1
    return fixed[axis] if axis < len(fixed) else -1


def _fold_shape_code(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference, after replacing each node the OpenCL engine computes on the host
    (onnx_folding: its inputs constants, or shapes inferred here) by its values, until no more
    fold: those nodes are free, and shape inference reaches the ops after them."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    known = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for _ in range(16):  # each round reaches past one more Reshape of computed shape
        model = shape_inference.infer_shapes(model)
        shapes = _shapes(model.graph)
        folded = []
        for node in model.graph.node:
            args = [known.get(i, Activation(shapes.get(i))) if i else None for i in node.input]
            try:
                values = fold(node, args, opset)
            except Exception:  # the engine refuses such a node; here it is counted as an op
                continue
            if values is not None:
                folded.append(node)
                known.update(zip(node.output, values))
                model.graph.initializer.extend(
                    numpy_helper.from_array(v, name) for name, v in zip(node.output, values))
        if not folded:
            return model
        for node in folded:
            model.graph.node.remove(node)
    return shape_inference.infer_shapes(model)


def _shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                            for d in tensor.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


def _node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int | None:
    op = node.op_type
    if op in FREE:
        return 0
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op in ("Attention", "MultiHeadAttention"):  # ONNX's (opset 23) and com.microsoft's
        return _attention(node, attrs, shapes)
    out = shapes.get(node.output[0])
    if out is None:
        return None
    outputs = math.prod(out)
    has_bias = len(node.input) > 2 and bool(node.input[2])
    if op in MULTIPLY_ADDS:
        weight = shapes[node.input[3 if op == "QLinearConv" else 1]]  # [Cout, Cin/group, *k]
        bias = len(node.input) > 8 and bool(node.input[8]) if op == "QLinearConv" else has_bias
        return 2 * outputs * math.prod(weight[1:]) + (outputs if bias else 0)
    if op == "ConvTranspose":
        weight = shapes[node.input[1]]  # [Cin, Cout/group, *kernel]
        inputs = math.prod(shapes[node.input[0]])
        return 2 * inputs * math.prod(weight[1:]) + (outputs if has_bias else 0)
    if op == "Gemm":
        a = shapes[node.input[0]]
        k = a[0] if attrs.get("transA", 0) else a[1]
        return 2 * outputs * k + (outputs if has_bias else 0)
    if op in MATMULS:
        return 2 * outputs * shapes[node.input[0]][-1]
    if op == "Einsum":
        return 2 * outputs * _summed(attrs["equation"], [shapes[i] for i in node.input])
    if op in PER_INPUT:
        return PER_INPUT[op] * math.prod(shapes[node.input[0]])
    if op == "Resize":
        mode = attrs.get("mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        resized = sum(a != b for a, b in zip(shapes[node.input[0]], out))
        return 0 if mode == "nearest" else 2 * (2 if mode == "linear" else 4) ** resized * \
            outputs
    if op in POOLS:
        return outputs * math.prod(attrs["kernel_shape"])
    if op in GLOBAL_POOLS:
        return math.prod(shapes[node.input[0]])
    if op in ELEMENTWISE:
        return outputs
    if op in PER_ELEMENT:
        return PER_ELEMENT[op] * outputs
    if op == "LRN":
        return (2 * attrs["size"] + 3) * outputs
    if op in RECURRENT_GATES:
        return _recurrent(node, attrs, shapes)
    return None


def _recurrent(node: onnx.NodeProto, attrs: dict, shapes: dict[str, tuple[int, ...]]) -> int:
    """An LSTM, GRU or RNN over its sequence: per step, direction and sample, the gates'
    products with the input and the hidden state (2 x gates x hidden x (input + hidden)), their
    two biases, and about as much again for the gates' activations and the state update."""
    x, w = shapes[node.input[0]], shapes[node.input[1]]  # X; W [directions, gates x hidden, in]
    steps, batch = (x[1], x[0]) if attrs.get("layout", 0) else (x[0], x[1])
    directions, gates_hidden, inputs = w
    hidden = gates_hidden // RECURRENT_GATES[node.op_type]
    per_step = 2 * gates_hidden * (inputs + hidden) + 4 * gates_hidden
    return directions * steps * batch * per_step


def _attention(node: onnx.NodeProto, attrs: dict, shapes: dict[str, tuple[int, ...]]) -> int:
    """An attention block from its inputs' shapes (ONNX shape inference knows no contrib op's
    outputs): the scores Q·Kᵀ and their product with V (2 FLOPs per multiply-add), the softmax
    (3 per score), and for com.microsoft's Attention the QKV projection from its packed weight
    (with its bias). Layouts other than [batch, sequence, hidden] and ONNX's [batch, heads,
    sequence, head size] raise KeyError: uncounted."""
    q = shapes[node.input[0]]
    if node.domain == "com.microsoft" and node.op_type == "Attention":
        w = shapes[node.input[1]]  # [hidden in, Q + K + V hidden]
        sizes = attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3
        batch, seq = q[0], q[1]
        bias = batch * seq * w[1] if len(node.input) > 2 and node.input[2] else 0
        project = 2 * batch * seq * q[2] * w[1] + bias
        return project + _scores(batch, attrs["num_heads"], seq, seq, sizes[0], sizes[2])
    k, v = shapes[node.input[1]], shapes[node.input[2]]
    if len(q) == 4 and len(k) == 4 and len(v) == 4:  # [batch, heads, sequence, head size]
        return _scores(q[0], q[1], q[2], k[2], q[1] * q[3], v[1] * v[3])
    if len(q) != 3 or len(k) != 3 or len(v) != 3:
        raise KeyError(node.input[0])
    heads = attrs.get("num_heads") or attrs["q_num_heads"]
    return _scores(q[0], heads, q[1], k[1], q[2], v[2])


def _scores(batch: int, heads: int, queries: int, keys: int, qk_hidden: int, v_hidden: int
            ) -> int:
    """Scaled dot-product attention over all heads: Q·Kᵀ, softmax, weights·V."""
    return batch * queries * keys * (2 * qk_hidden + 3 * heads + 2 * v_hidden)


def _summed(equation: str | bytes, operands: list[tuple[int, ...]]) -> int:
    """The product of the sizes of an Einsum's summed letters (in an input, not the output)."""
    inputs, _, output = explicit(equation, [len(s) for s in operands]).partition("->")
    sizes: dict[str, int] = {}
    for letters, shape in zip(inputs.split(","), operands):
        sizes.update(zip(letters, shape))
    return math.prod(size for letter, size in sizes.items() if letter not in output)
