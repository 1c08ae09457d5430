"""Models quantized to QDQ ONNX (onnxruntime.quantization's QuantFormat.QDQ): the simplification
that lets the int8 kernels (kernels/quantized.cl) run them.

- DequantizeLinear of constants (weights, biases) is folded into fp32 constants at load; the
  int8 codes and per-channel scales of weights with zero point 0 are kept (`Graph.int8`).
- A QuantizeLinear whose only reader is a DequantizeLinear with the same scale and zero point
  becomes one `FakeQuant` node (the engine's name: round onto the tensor's int8 grid).
- A FakeQuant right after a Conv or Gemm becomes that node's output re-quantization (`requant`),
  done in the int8 GEMM's epilogue; one whose input is already on the same grid (behind MaxPool
  or a reshape of such a tensor) is dropped.
- A Conv or Gemm reading a FakeQuant, with int8 weights, becomes an int8 node (`quant_in`): it
  quantizes its input itself (im2col_q8, quantize_q8) and multiplies int8 codes.
A FakeQuant left over runs as its own kernel; weights that are not int8 run in fp32."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accelerators.onnx_folding import dequantize
from accelerators.opencl.ir import Graph, Grid, Node, UnsupportedModelError


@dataclass(frozen=True)
class Int8Weight:
    codes: np.ndarray  # int8, the weight's own shape
    scale: np.ndarray  # float32, one per index along `axis` (or one)
    axis: int


_RANGES = {np.dtype(np.uint8): (0, 255, 128), np.dtype(np.int8): (-128, 127, 0)}
_PASS_THROUGH = {"MaxPool", "Flatten", "Reshape", "Squeeze", "Unsqueeze"}


def simplify_qdq(graph: Graph) -> None:
    if not any(n.op in ("QuantizeLinear", "DequantizeLinear") for n in graph.nodes):
        return
    _fold_constant_dequantize(graph)
    _pair_into_fake_quant(graph)
    leftover = [n for n in graph.nodes if n.op in ("QuantizeLinear", "DequantizeLinear")]
    if leftover:
        raise UnsupportedModelError(
            f"op {leftover[0].op!r} of node {leftover[0].name!r}: only QuantizeLinear directly "
            f"followed by DequantizeLinear with the same scale and zero point is supported")


def fuse_quantized(graph: Graph) -> None:
    """After activation fusion: a Conv/Gemm with int8 weights reading a FakeQuant quantizes its
    input itself; a FakeQuant after such a node becomes its epilogue's re-quantization; one whose
    input already lies on its grid is dropped. FakeQuant nodes left run as their own kernel."""
    outputs = {name for name, _ in graph.outputs}
    for node in [n for n in graph.nodes if n.op in ("Conv", "Gemm")]:
        _quantize_input(graph, node, outputs)
    for fq in [n for n in graph.nodes if n.op == "FakeQuant"]:
        _fold_fake_quant(graph, fq, outputs)


def _quantize_input(graph: Graph, node: Node, outputs: set[str]) -> None:
    fq = graph.producer(node.inputs[0])
    weight = graph.int8.get(node.inputs[1])
    if fq is None or fq.op != "FakeQuant" or weight is None \
            or weight.scale.size > 1 and weight.axis != _channel_axis(node):
        return
    node.quant_in = fq.grid
    node.inputs[0] = fq.inputs[0]
    graph.fused[f"FakeQuant+{node.op}"] += 1
    if not graph.consumers(fq.outputs[0]) and fq.outputs[0] not in outputs:
        graph.nodes.remove(fq)


def _fold_fake_quant(graph: Graph, fq: Node, outputs: set[str]) -> None:
    producer = graph.producer(fq.inputs[0])
    if producer is not None and producer.quant_in is not None and producer.requant is None \
            and graph.consumers(fq.inputs[0]) == [fq] and fq.inputs[0] not in outputs:
        producer.requant = fq.grid
        producer.outputs = [fq.outputs[0]]
        graph.nodes.remove(fq)
        graph.fused[f"{producer.op}+FakeQuant"] += 1
    elif _grid_of(graph, fq.inputs[0]) == fq.grid and fq.outputs[0] not in outputs:
        graph.nodes.remove(fq)
        graph.rename(fq.outputs[0], fq.inputs[0])
        graph.fused["FakeQuant already on its grid"] += 1


def _channel_axis(node: Node) -> int:
    """The weight axis of the output channels: Conv's first, Gemm's B by transB."""
    return 0 if node.op == "Conv" or node.attrs.get("transB", 0) else 1


def _grid_of(graph: Graph, name: str) -> Grid | None:
    """The grid a tensor is known to lie on, through ops that keep values (max, reshapes)."""
    node = graph.producer(name)
    while node is not None and node.op in _PASS_THROUGH:
        node = graph.producer(node.inputs[0])
    if node is None:
        return None
    return node.grid if node.op == "FakeQuant" else node.requant


def _scalar_grid(node: Node, scale: np.ndarray, zero: np.ndarray | None) -> Grid:
    if scale.size != 1:
        raise UnsupportedModelError(f"node {node.name!r}: a per-channel quantized activation "
                                    f"is not supported (scale of shape {list(scale.shape)})")
    dtype = np.dtype(np.uint8) if zero is None else zero.dtype
    if dtype not in _RANGES:
        raise UnsupportedModelError(f"node {node.name!r}: {dtype} activations are not "
                                    f"supported, only uint8 and int8")
    lo, hi, shift = _RANGES[dtype]
    return Grid(float(scale.reshape(-1)[0]), int(0 if zero is None else zero.reshape(-1)[0]),
                lo, hi, shift)


def _fold_constant_dequantize(graph: Graph) -> None:
    c = graph.consts
    for dq in [n for n in graph.nodes if n.op == "DequantizeLinear"]:
        if not all(i in c for i in dq.inputs if i):
            continue
        x, scale = c[dq.inputs[0]], c[dq.inputs[1]].astype(np.float32)
        zero = c[dq.inputs[2]] if len(dq.inputs) > 2 and dq.inputs[2] else np.zeros(1, x.dtype)
        axis = dq.attrs.get("axis", 1) % max(x.ndim, 1)
        c[dq.outputs[0]] = dequantize(x, scale, zero, axis)  # as the FLOP counter folds it
        if x.dtype == np.int8 and not zero.any():
            graph.int8[dq.outputs[0]] = Int8Weight(x, scale, axis)
        graph.nodes.remove(dq)
        graph.fused["DequantizeLinear of a constant"] += 1


def _pair_into_fake_quant(graph: Graph) -> None:
    c = graph.consts
    for q in [n for n in graph.nodes if n.op == "QuantizeLinear"]:
        users = graph.consumers(q.outputs[0])
        if len(users) != 1 or users[0].op != "DequantizeLinear" or q.outputs[0] in {
                name for name, _ in graph.outputs}:
            continue
        dq = users[0]
        params = [[c.get(i) if i else None for i in n.inputs[1:3]] + [None] for n in (q, dq)]
        if any(p[0] is None for p in params) or not all(
                _same(a, b) for a, b in zip(params[0][:2], params[1][:2])):
            continue
        scale = params[0][0]
        assert scale is not None  # checked above
        grid = _scalar_grid(q, scale, params[0][1])
        graph.nodes.remove(dq)
        q.op, q.inputs, q.outputs = "FakeQuant", [q.inputs[0]], [dq.outputs[0]]
        q.attrs, q.grid = {}, grid
        graph.fused["QuantizeLinear+DequantizeLinear"] += 1


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and np.array_equal(a, b)

