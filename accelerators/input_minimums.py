"""The smallest size each variable dim of a model's inputs may have: below it a convolution's
or a pool's kernel (with its dilation, stride and pads) no longer fits and a tensor of the graph
comes out empty. Found by ONNX's shape inference, which applies each op's own size rule: the
smallest size at which every tensor that is non-empty at a large size is non-empty still. Output
sizes only grow with input sizes, so a doubling then a bisection finds it exactly."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import helper, shape_inference

_LARGE = 4096  # where the other variable dims sit, and the largest minimum searched for
_WEIGHT_ELEMENTS = 64  # larger initializers are shape-only inputs: shape code reads no weights


def minimum_sizes(path: Path | str, dims: dict[str, tuple[int, ...]], batched: bool
                  ) -> dict[str, dict[int, int]]:
    """input -> {axis of the request's shape: its minimum} for each variable dim (-1 in `dims`,
    config.pbtxt's, after the batch axis where `batched`) whose minimum is above 1. Empty where
    shape inference fails or a tensor is empty at every size (nothing to say)."""
    lead = (1,) if batched else ()
    full = {name: lead + tuple(d) for name, d in dims.items()}
    variable = [(name, axis) for name, shape in full.items() for axis, d in enumerate(shape)
                if d == -1]
    if not variable:
        return {}
    graph = _shapes_only(onnx.load(str(path)))
    large = {name: tuple(_LARGE if d == -1 else d for d in shape) for name, shape in full.items()}
    watched = {name for name, shape in _inferred(graph, large) or () if all(d > 0 for d in shape)}
    if not watched:
        return {}

    def fits(name: str, axis: int, size: int) -> bool:
        shapes = {**large, name: large[name][:axis] + (size,) + large[name][axis + 1:]}
        inferred = _inferred(graph, shapes)
        return inferred is not None and all(
            d > 0 for tensor, shape in inferred if tensor in watched for d in shape)

    minimums: dict[str, dict[int, int]] = {}
    for name, axis in variable:
        if fits(name, axis, 1):
            continue
        low, high = 1, 2  # low does not fit
        while not fits(name, axis, high):
            low, high = high, high * 2
            if high > _LARGE:
                break
        else:
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (low, middle) if fits(name, axis, middle) else (middle, high)
            minimums.setdefault(name, {})[axis] = high
    return minimums


def _shapes_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its weights as inputs of their shape: inference never reads them, and
    each probe then copies kilobytes, not the weights."""
    graph = model.graph
    listed = {v.name for v in graph.input}  # older exporters list weights as inputs too
    for tensor in [t for t in graph.initializer if math.prod(t.dims) > _WEIGHT_ELEMENTS]:
        graph.initializer.remove(tensor)
        if tensor.name not in listed:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                             list(tensor.dims)))
    return model


def _inferred(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]
              ) -> Iterator[tuple[str, tuple[int, ...]]] | None:
    """(tensor, shape) of every tensor whose shape inference fully knows with the inputs at
    `shapes`; None where inference refuses them."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for value in probe.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = size
    try:
        graph = shape_inference.infer_shapes(probe, data_prop=True).graph
    except Exception:  # onnx raises its own error types, and ValueError, per op
        return None
    return ((v.name, tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
            for v in (*graph.value_info, *graph.output)
            if v.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim))
