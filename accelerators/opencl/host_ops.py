"""What is computed on the host while a launch plan is compiled: every node whose inputs are
known there (constants, and shapes, for each batch size, so any exporter's shape code such as
`Shape -> Gather -> Equal -> Where -> Expand` becomes constants), and the output shapes of
windowed ops."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from accelerators.onnx_folding import Activation, host_inputs
from accelerators.onnx_nodes import run_node
from accelerators.opencl.ir import Graph, Node, UnsupportedModelError

_UNPLANNED = Activation()  # an activation at load, before any batch size gives it a shape


def evaluate(node: Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """The outputs of `node` whose inputs are all known on the host (None: an omitted optional
    input), by ONNX's reference evaluator: any op, at the model's opset (onnx_nodes). An
    activation fused into it (graph.py) is the caller's to apply."""
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
             for k, v in node.attrs.items()}
    proto = onnx.helper.make_node(node.op, [""] * len(args), node.outputs, **attrs)
    try:
        return run_node(proto, args, opset)
    except Exception as e:  # the reference evaluator's errors have no common base
        raise UnsupportedModelError(f"op {node.op!r} of node {node.name!r} could not be "
                                    f"evaluated on its constant inputs: {e}") from e


def fold_constants(graph: Graph) -> None:
    """Nodes whose inputs are all constants (not shapes) are evaluated once, at load, by the
    rule the FLOP counter shares (onnx_folding): the passes after it see their results as
    constants, and no batch size evaluates them again."""
    for node in list(graph.nodes):
        args = [graph.consts.get(i, _UNPLANNED) if i else None for i in node.inputs]
        inputs = host_inputs(node.op, "", args)
        if inputs is None:
            continue
        outs = evaluate(node, inputs, graph.opset)
        graph.consts.update((name, v) for name, v in zip(node.outputs, outs) if name)
        graph.nodes.remove(node)
        graph.fused["constant folded"] += 1


def window(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...]
           ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(output sizes, strides, dilations, pads at start, pads at end) of a Conv or pooling over
    `spatial`, following ONNX auto_pad, pads and ceil_mode."""
    a, rank = node.attrs, len(spatial)
    strides = list(a.get("strides", [1] * rank))
    dilations = list(a.get("dilations", [1] * rank))
    pads = list(a.get("pads", [0] * 2 * rank))
    begin, end = pads[:rank], pads[rank:]
    auto = a.get("auto_pad", "NOTSET")
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(rank):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + extent[i] - spatial[i])
            small, large = total // 2, total - total // 2
            begin[i], end[i] = (small, large) if auto == "SAME_UPPER" else (large, small)
    elif auto == "VALID":
        begin, end = [0] * rank, [0] * rank
    rounding = math.ceil if a.get("ceil_mode", 0) else math.floor
    out = []
    for i in range(rank):
        size = rounding((spatial[i] + begin[i] + end[i] - extent[i]) / strides[i]) + 1
        if a.get("ceil_mode", 0) and (size - 1) * strides[i] >= spatial[i] + begin[i]:
            size -= 1  # the last window must start inside the input or its start padding
        out.append(size)
    return out, strides, dilations, begin, end
