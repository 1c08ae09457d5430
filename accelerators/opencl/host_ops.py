"""Ops evaluated on the host while a launch plan is compiled: shape arithmetic on constants
(folded for each batch size, so `Shape -> Gather -> Concat -> Reshape` chains become constants),
and the output shapes of reshapes and of windowed ops."""

from __future__ import annotations

import math

import numpy as np
import onnx

from accelerators.opencl.ir import Node, UnsupportedModelError


def fold(node: Node, args: list[np.ndarray | None], opset: int) -> np.ndarray:
    """The output of `node` whose inputs are all constants (None: an omitted optional input)."""
    op, a = node.op, node.attrs
    x = args[0] if args else None
    if op == "Gather":
        return np.take(x, args[1], axis=a.get("axis", 0))
    if op == "Cast":
        return x.astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"]))
    if op == "ConstantOfShape":
        value = a.get("value", np.zeros(1, np.float32))
        return np.full(tuple(int(d) for d in x), value.reshape(-1)[0], value.dtype)
    if op == "Slice":
        starts, ends = args[1], args[2]
        axes = args[3] if len(args) > 3 and args[3] is not None else range(len(starts))
        steps = args[4] if len(args) > 4 and args[4] is not None else [1] * len(starts)
        index = [slice(None)] * x.ndim
        for s, e, ax, st in zip(starts, ends, axes, steps):
            index[int(ax)] = slice(int(s), int(e), int(st))
        return x[tuple(index)]
    if op in ("Add", "Sub", "Mul", "Div"):
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
        out = f(x, args[1])
        return out.astype(x.dtype) if op != "Div" or x.dtype.kind == "f" else x // args[1]
    if op == "Sum":
        return np.sum(args, axis=0).astype(x.dtype)
    if op == "Concat":
        return np.concatenate(args, axis=a["axis"])
    if op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
        return x.reshape(view_shape(node, x.shape, args[1:], opset))
    if op == "Relu":
        return np.maximum(x, 0)
    if op == "Transpose":
        return np.transpose(x, a.get("perm"))
    raise UnsupportedModelError(
        f"op {op!r} of node {node.name!r} is supported on constants only in the OpenCL engine")


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
