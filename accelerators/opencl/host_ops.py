"""What is computed on the host while a launch plan is compiled: every node whose inputs are
known there (constants, and shapes, for each batch size, so any exporter's shape code such as
`Shape -> Gather -> Equal -> Where -> Expand` becomes constants), and the output shapes of
reshapes and of windowed ops."""

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


def view_shape(node: Node, shape: tuple[int, ...], args: list, opset: int) -> tuple[int, ...]:
    """Output shape of Flatten, Reshape, Squeeze, Unsqueeze: they only rename a buffer."""
    a = node.attrs
    if node.op == "Flatten":
        axis = a.get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        return (math.prod(shape[:axis]), math.prod(shape[axis:]))
    if node.op == "Reshape":
        if not args or args[0] is None:
            raise UnsupportedModelError(f"node {node.name!r}: Reshape target is not constant")
        target = [int(d) for d in args[0]]
        if not a.get("allowzero", 0):
            target = [shape[i] if d == 0 else d for i, d in enumerate(target)]
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            target[target.index(-1)] = math.prod(shape) // known
        if math.prod(target) != math.prod(shape):
            raise UnsupportedModelError(
                f"node {node.name!r}: cannot reshape {list(shape)} to {target}")
        return tuple(target)
    axes = a.get("axes") if opset < 13 or node.op not in ("Squeeze", "Unsqueeze") \
        else (list(args[0]) if args and args[0] is not None else None)
    if node.op == "Squeeze":
        if axes is None:
            return tuple(d for d in shape if d != 1)
        drop = {int(ax) % len(shape) for ax in axes}
        return tuple(d for i, d in enumerate(shape) if i not in drop)
    if axes is None:
        raise UnsupportedModelError(f"node {node.name!r}: Unsqueeze without axes")
    rank = len(shape) + len(axes)
    insert = {int(ax) % rank for ax in axes}
    dims = iter(shape)
    return tuple(1 if i in insert else next(dims) for i in range(rank))


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
