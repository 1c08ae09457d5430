"""Loads an ONNX model into a simplified graph: constants gathered (initializers and Constant
nodes) and the nodes computed from constants alone evaluated (host_ops.fold_constants),
Dropout and Identity dropped, zero Pads and input normalizations (x - k, x / k, ...) folded
into the convolution after them, BatchNormalization folded into the convolution before it (any
other runs as a per-channel scale and shift), a MatMul's constant bias row taken into it,
gated activations recognised (x * Sigmoid(x) is SiLU, x * HardSigmoid(x) HardSwish),
activations fused into the Conv, Gemm, MatMul, Add or BatchNormalization that feeds them.
Ops outside ONNX's default domain are reported at load time, naming the op and the node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from accelerators.onnx_folding import fold
from accelerators.opencl import fusions, qdq
from accelerators.opencl.host_ops import fold_constants
from accelerators.opencl.ir import Graph, Node, UnsupportedModelError, UnsupportedOpError

# "Silu" is no ONNX op: the engine's name for a Mul of a tensor and its Sigmoid. "Gelu" is
# opset 20's, also what fusions.py makes of GELU's spelled-out forms.
ACTIVATIONS = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Silu",
               "Gelu"}
# Ops an activation that follows them is fused into.
FUSING = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "BatchNormalization",
          "LayerNormalization", "InstanceNormalization", "GroupNormalization"}
_DROPPED = {"Dropout", "Identity"}


def load_graph(path: Path) -> Graph:
    model = onnx.load(str(path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = []
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        # Any ONNX op is accepted here: one whose inputs are constants or shapes is evaluated
        # on the host for each batch size, any other is refused by the lowering if it has no
        # kernel (lowering.py), which the engine runs at load for batch 1.
        if n.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(
                f"op {n.op_type!r} (domain {n.domain!r}) of node {name!r} is not an op of the "
                "OpenCL engine")
        if n.op_type == "Constant":
            consts[n.output[0]] = _constant(n, name, opset)
            continue
        attrs = {a.name: _attr(a) for a in n.attribute}
        nodes.append(Node(n.op_type, name, list(n.input), list(n.output), attrs))
    graph = Graph(
        inputs=[(v.name, _dims(v)) for v in model.graph.input if v.name not in consts],
        outputs=[(v.name, _dims(v)) for v in model.graph.output], nodes=nodes, consts=consts,
        opset=opset)
    _drop_passthrough(graph)
    qdq.simplify_qdq(graph)
    fold_constants(graph)
    _fold_pad_into_conv(graph)
    _fold_affine_into_conv(graph)
    _fold_batch_norm(graph)
    _fuse_matmul_bias(graph)
    fusions.fuse_patterns(graph)
    _fuse_gates(graph)
    _fuse_activations(graph)
    qdq.fuse_quantized(graph)
    return graph


def _attr(a: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def _constant(node: onnx.NodeProto, name: str, opset: int) -> np.ndarray:
    """A Constant node's value, read as the FLOP counter reads it (onnx_folding)."""
    try:
        values = fold(node, [], opset)
    except Exception as e:  # the reference evaluator's errors have no common base
        raise UnsupportedModelError(f"Constant node {name!r} could not be read: {e}") from e
    assert values is not None  # a Constant reads no activation
    return values[0]


def _dims(v: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                 for d in v.type.tensor_type.shape.dim)


def fix_input_dims(graph: Graph, served: dict[str, tuple[int, ...]]) -> list[tuple[str, int]]:
    """Gives the graph's symbolic input dims after the batch axis the sizes the model is served
    at (config.pbtxt's dims). Returns the dims left variable (-1 in both), as (input, axis):
    they stay -1, and the engine plans them per request shape."""
    fixed, variable = [], []
    for name, dims in graph.inputs:
        want = served.get(name, ())
        out = list(dims[:1])
        for i, d in enumerate(dims[1:], 1):
            size = want[i - 1] if i - 1 < len(want) else -1
            if d == -1 and size == -1:
                variable.append((name, i))
            out.append(d if d != -1 else size)
        fixed.append((name, tuple(out)))
    graph.inputs = fixed
    return variable


def _drop_passthrough(graph: Graph) -> None:
    """Dropout (inference: identity; its mask output must be unused) and Identity."""
    outputs = {name for name, _ in graph.outputs}
    for n in [n for n in graph.nodes if n.op in _DROPPED]:
        if len(n.outputs) > 1 and n.outputs[1] and graph.consumers(n.outputs[1]):
            raise UnsupportedModelError(f"node {n.name!r}: a Dropout mask read by other nodes")
        graph.nodes.remove(n)
        if n.outputs[0] in outputs:  # keep the graph's output name: rename the producer
            for p in graph.nodes:
                p.outputs = [n.outputs[0] if o == n.inputs[0] else o for o in p.outputs]
            graph.rename(n.inputs[0], n.outputs[0])
        else:
            graph.rename(n.outputs[0], n.inputs[0])
        graph.fused[n.op] += 1


def _fold_pad_into_conv(graph: Graph) -> None:
    """A zero Pad of the spatial axes whose only reader is a Conv (tf2onnx's explicit SAME
    padding) becomes that Conv's own padding."""
    for pad in [n for n in graph.nodes if n.op == "Pad"]:
        conv = graph.sole_consumer(pad)
        if conv is None or conv.op != "Conv" or conv.inputs[0] != pad.outputs[0] \
                or conv.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            continue
        amounts = _zero_pad_amounts(graph, pad)
        rank = len(amounts or []) // 2
        if amounts is None or any(amounts[:2] + amounts[rank:rank + 2]) or min(amounts) < 0:
            continue
        spatial = rank - 2
        own = list(conv.attrs.get("pads", [0] * 2 * spatial))
        conv.attrs["pads"] = [own[i] + amounts[2 + i] for i in range(spatial)] + [
            own[spatial + i] + amounts[rank + 2 + i] for i in range(spatial)]
        conv.inputs[0] = pad.inputs[0]
        graph.nodes.remove(pad)
        graph.fused["Pad+Conv"] += 1


def _zero_pad_amounts(graph: Graph, pad: Node) -> list[int] | None:
    """The amounts of a constant Pad of all axes by zeros (attributes before opset 11, constant
    inputs from it), None for any other Pad."""
    if graph.opset < 11:
        amounts, value, axes = pad.attrs.get("pads"), pad.attrs.get("value", 0.0), ""
    else:
        amounts = graph.consts.get(pad.inputs[1])
        value = graph.consts.get(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] \
            else 0.0
        axes = pad.inputs[3] if len(pad.inputs) > 3 else ""
    if amounts is None or value is None or np.any(value) or axes \
            or pad.attrs.get("mode", "constant") != "constant":
        return None
    return [int(a) for a in amounts]


def _fold_affine_into_conv(graph: Graph) -> None:
    """x + k, x - k, x * k, x / k with k constant per channel (or scalar) read only by a Conv
    without padding (an input normalization): conv(W, a x + d) = conv(W a, x) + sum(W d), exact
    where no padding mixes zeros in. Saves a launch and a pass over the tensor per op."""
    c = graph.consts
    for node in reversed([n for n in graph.nodes if n.op in ("Add", "Sub", "Mul", "Div")]):
        conv = graph.sole_consumer(node)
        if conv is None or not _unpadded_conv_reads(graph, conv, node):
            continue
        w = c[conv.inputs[1]].astype(np.float64)
        k = _per_input_channel(c[node.inputs[1]].astype(np.float64), w)
        if k is None or node.op == "Div" and not np.all(k):
            continue  # not per channel of axis 1, or a division by zero
        scale_shift: dict[str, tuple[np.ndarray | float, np.ndarray | float]] = {
            "Add": (1.0, k), "Sub": (1.0, -k), "Mul": (k, 0.0), "Div": (1 / k, 0.0)}
        a, d = scale_shift[node.op]
        b = c[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] \
            else np.zeros(w.shape[0])
        wname, bname = f"{conv.name}:{node.name}:weight", f"{conv.name}:{node.name}:bias"
        shape = (1, -1) + (1,) * (w.ndim - 2)
        c[wname] = (w * np.reshape(a, shape) if np.ndim(a) else w).astype(np.float32)
        c[bname] = (b + (w * np.reshape(d, shape)).sum(axis=tuple(range(1, w.ndim)))
                    if np.ndim(d) else b).astype(np.float32)
        conv.inputs = [node.inputs[0], wname, bname]
        graph.nodes.remove(node)
        graph.fused[f"{node.op}+Conv"] += 1


def _unpadded_conv_reads(graph: Graph, conv: Node, node: Node) -> bool:
    """`conv` is an ungrouped, unpadded Conv with constant weights and bias whose input is
    `node`'s output, and `node` applies a constant to an activation."""
    c, a = graph.consts, conv.attrs
    return conv.op == "Conv" and conv.inputs[0] == node.outputs[0] \
        and node.inputs[1] in c and node.inputs[0] not in c and a.get("group", 1) == 1 \
        and not any(a.get("pads", [])) and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") \
        and all(i in c for i in conv.inputs[1:])


def _per_input_channel(k: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """`k` as one value per input channel of weights `w`, where it is a scalar or per channel
    of axis 1 (trailing shape (c, 1, ...)); else None."""
    channels = (w.shape[1],) + (1,) * (w.ndim - 2)  # k's trailing shape, per channel
    if not (k.size == 1 or k.size == w.shape[1] and k.ndim <= w.ndim
            and k.shape[k.ndim - len(channels):] == channels):
        return None
    return np.broadcast_to(k.reshape(-1), (w.shape[1],))


def _fold_batch_norm(graph: Graph) -> None:
    """BN(conv(x, W, b)) = conv(x, W * s, (b - mean) * s + beta), s = gamma / sqrt(var + eps)."""
    c = graph.consts
    for conv in [n for n in graph.nodes if n.op == "Conv"]:
        bn = graph.sole_consumer(conv)
        if bn is None or bn.op != "BatchNormalization" or len(bn.outputs) > 1 and any(
                bn.outputs[1:]) or not all(i in c for i in bn.inputs[1:] + conv.inputs[1:]):
            continue
        gamma, beta, mean, var = (c[i].astype(np.float64) for i in bn.inputs[1:5])
        scale = gamma / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        w = c[conv.inputs[1]]
        b = c[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] \
            else np.zeros(w.shape[0])
        wname, bname = f"{conv.name}:bn_weight", f"{conv.name}:bn_bias"
        # The weights scaled in float32 (the per-channel scale rounded once): a float64 copy of
        # every weight took 60% of ResNet-50's load.
        c[wname] = w.astype(np.float32, copy=False) * scale.astype(np.float32).reshape(
            (-1,) + (1,) * (w.ndim - 1))
        c[bname] = ((b - mean) * scale + beta).astype(np.float32)
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        graph.fused["BatchNormalization"] += 1


def _fuse_matmul_bias(graph: Graph) -> None:
    """MatMul(x, W) + b, W a constant matrix and b a constant row (a Linear layer as torch
    exports it on (n, tokens, dim) activations): b is added in the GEMM's epilogue."""
    c = graph.consts
    for mm in [n for n in graph.nodes if n.op == "MatMul"]:
        add = graph.sole_consumer(mm)
        w = c.get(mm.inputs[1])
        if add is None or add.op != "Add" or w is None or w.ndim != 2 or mm.inputs[0] in c:
            continue
        bias = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
        b = c.get(bias)
        if b is None or b.size != w.shape[1] or b.shape[-1] != w.shape[1]:
            continue
        mm.inputs.append(bias)
        mm.outputs = [add.outputs[0]]
        graph.nodes.remove(add)
        graph.fused["MatMul+Add"] += 1


def _fuse_gates(graph: Graph) -> None:
    """Mul(x, Sigmoid(x)) -> Silu(x); Mul(x, HardSigmoid(x)) with alpha 1/6 and beta 1/2 (how
    exporters spell HardSwish before opset 14) -> HardSwish(x)."""
    for gate in [n for n in graph.nodes if n.op in ("Sigmoid", "HardSigmoid")]:
        if gate.op == "HardSigmoid" and not (
                abs(gate.attrs.get("alpha", 0.2) - 1 / 6) < 1e-6
                and abs(gate.attrs.get("beta", 0.5) - 0.5) < 1e-6):
            continue
        mul = graph.sole_consumer(gate)
        if mul is None or mul.op != "Mul" or sorted(mul.inputs) != sorted(
                [gate.inputs[0], gate.outputs[0]]):
            continue
        graph.nodes.remove(gate)
        op = "Silu" if gate.op == "Sigmoid" else "HardSwish"
        mul.op, mul.inputs, mul.attrs = op, [gate.inputs[0]], {}
        graph.fused[f"{gate.op}*x"] += 1


def _fuse_activations(graph: Graph) -> None:
    for node in [n for n in graph.nodes if n.op in FUSING]:
        act = graph.sole_consumer(node)
        if act is None or act.op not in ACTIVATIONS or node.activation:
            continue
        if act.op == "Clip" and not all(i in graph.consts for i in act.inputs[1:] if i):
            continue
        node.activation = act
        node.outputs = [act.outputs[0]]
        graph.nodes.remove(act)
        graph.fused[f"{node.op}+{act.op}"] += 1
