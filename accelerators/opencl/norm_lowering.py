"""Lowering of the normalizations over rows (LayerNormalization, InstanceNormalization,
GroupNormalization: kernels/normalization.cl's `norm_rows`, a work-group per row, on GPUs and
FPGAs; `norm_rows_serial`, a work-item per row, on CPUs), of the reductions of adjacent axes
(ReduceSum, ReduceL2, ReduceMax; ReduceMean where pool_lowering.py's global pool does not
serve: `reduce_rows`, likewise), of Softmax (`softmax_rows`) and of 2-D Resize (`resize2d`, its
tables of taps computed here)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import WG_1D, Dyn, Ref, activation_args, ints
from accelerators.opencl.lowering_state import Lowering

RESIZE_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}  # input pixels per output pixel, per axis
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "half_pixel_symmetric")
REDUCE = {"ReduceSum": 0, "ReduceL2": 1, "ReduceMax": 2, "ReduceMean": 3}  # REDUCE_*
# How a nearest source coordinate is rounded (ONNX's nearest_mode).
NEAREST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5), "round_prefer_ceil":
    lambda x: np.floor(x + 0.5), "floor": np.floor, "ceil": np.ceil}


def axis_range(node: Node, axes: Iterable[int], rank: int) -> tuple[int, int]:
    """The first and last of `axes` if they are adjacent axes of a tensor of `rank`."""
    ordered = sorted(int(a) % rank for a in axes)
    if not ordered or ordered != list(range(ordered[0], ordered[0] + len(ordered))):
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: only adjacent axes are "
                                    f"supported, not attribute axes {ordered} of rank {rank}")
    return ordered[0], ordered[-1]


def _source_coordinates(mode: str, size: int, out: int, scale: float) -> np.ndarray:
    """Where each output position of one axis samples the input (ONNX Resize's
    coordinate_transformation_mode)."""
    r = np.arange(out, dtype=np.float64)
    if mode == "align_corners":
        return r * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return r / scale
    if mode == "pytorch_half_pixel" and out == 1:
        return np.zeros(out)
    offset = 0.0
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / (scale * size))
    return offset + (r + 0.5) / scale - 0.5


def _taps(mode: str, at: np.ndarray, size: int, attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """The input positions each output position of one axis reads and their weights, (out,
    taps) each: ONNX Resize's formulas, neighbours past the edge reading the edge."""
    if mode == "nearest":
        rounded = NEAREST[attrs.get("nearest_mode", "round_prefer_floor")](at)
        return np.clip(rounded, 0, size - 1)[:, None], np.ones((len(at), 1))
    floor = np.floor(at)
    t = (at - floor)[:, None]
    if mode == "linear":
        offsets, weights = np.arange(2), np.concatenate([1 - t, t], axis=1)
    else:  # cubic convolution (Keys) with coefficient A, over floor - 1 .. floor + 2
        offsets, a = np.arange(-1, 3), attrs.get("cubic_coeff_a", -0.75)
        d = np.abs(t - offsets)  # each tap's distance
        weights = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                           ((a * d - 5 * a) * d + 8 * a) * d - 4 * a)
    index = floor[:, None] + offsets
    if attrs.get("exclude_outside", 0):  # taps outside the input weigh 0, the rest renormalized
        weights = np.where((index >= 0) & (index < size), weights, 0.0)
        weights /= weights.sum(axis=1, keepdims=True)
    return np.clip(index, 0, size - 1), weights


def _norm_rows(lw: Lowering, node: Node, x: Dyn, scale: np.ndarray, bias: np.ndarray, cols: int,
               period: int, stride: int, inner: int = 1) -> None:
    """x as rows of `cols` values `inner` apart, each normalized; value j of row r scaled
    by scale[((r % period) * cols + j) // stride] (kernels/normalization.cl)."""
    for output in node.outputs[1:]:  # LayerNormalization's mean and inverse deviation
        if output and lw.graph.consumers(output):
            raise UnsupportedModelError(f"{node.op} node {node.name!r}: output {output!r} "
                                        f"(the mean or deviation) is read; unsupported")
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    rows = math.prod(x.shape) // cols
    tensors = [Ref(x.storage), lw.ref(scale, f"{node.name}:scale"),
               lw.ref(bias, f"{node.name}:bias"), Ref(out.storage)]
    rest = [*ints(cols, inner, period, stride), np.float32(node.attrs.get("epsilon", 1e-5)),
            *activation_args(node, lw.values)]
    if lw.build.tiling:  # GPUs and FPGAs: a work-group per row
        lw.emit(node, "norm_rows", rows * WG_1D, tensors + rest, 8 * math.prod(x.shape))
    else:
        lw.emit(node, "norm_rows_serial", rows, tensors + [np.int32(rows)] + rest,
                8 * math.prod(x.shape))


def _affine(lw: Lowering, node: Node, args: list, size: int, what: str) -> tuple[np.ndarray, ...]:
    """The scale and bias inputs (1 and 0 where absent), constant, as `size` values."""
    values = []
    for i, default in ((1, 1.0), (2, 0.0)):
        v = args[i] if len(args) > i and args[i] is not None else np.full(size, default)
        if isinstance(v, Dyn):
            raise UnsupportedModelError(f"{node.op} node {node.name!r}: input "
                                        f"{node.inputs[i]!r} is not constant")
        v = np.asarray(v, np.float64)
        while v.ndim > 1 and v.shape[0] == 1:
            v = v[0]
        if v.size not in (1, size):
            raise UnsupportedModelError(f"{node.op} node {node.name!r}: input "
                                        f"{node.inputs[i]!r} of shape {list(v.shape)} is "
                                        f"not one value per {what} ({size})")
        values.append(np.broadcast_to(v.reshape(-1), (size,)))
    return tuple(values)


def layer_normalization(lw: Lowering, node: Node, args: list) -> None:
    """Over the axes from `axis` on; the decomposed form over its ReduceMeans' axes, which
    may be followed by others (a channels-first LayerNorm over axis 1 of NCHW)."""
    x = args[0]
    rank = len(x.shape)
    if node.reduce_axes is not None:
        first, last = axis_range(node, node.reduce_axes, rank)
    else:
        first, last = node.attrs.get("axis", -1) % rank, rank - 1
    scale, bias = (_per_normalized_value(lw, node, args, i, x.shape, first, last)
                   for i in (1, 2))
    _norm_rows(lw, node, x, scale, bias, math.prod(x.shape[first:last + 1]), 1, 1,
               math.prod(x.shape[last + 1:]))


def _per_normalized_value(lw: Lowering, node: Node, args: list, i: int, shape: tuple[int, ...],
                          first: int, last: int) -> np.ndarray:
    """Input i (the scale: 1 where absent, the bias: 0), constant, broadcast against x as
    numpy does, one value per position of axes first..last (the same along the others)."""
    v = args[i] if len(args) > i and args[i] is not None else np.float64(i == 1)
    if isinstance(v, Dyn):
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: input "
                                    f"{node.inputs[i]!r} is not constant")
    v = np.asarray(v, np.float64)
    aligned = (1,) * (len(shape) - v.ndim) + v.shape
    normalized = shape[first:last + 1]
    if len(aligned) != len(shape) or any(
            d != 1 for d in aligned[:first] + aligned[last + 1:]) or any(
            d not in (1, n) for d, n in zip(aligned[first:last + 1], normalized)):
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: input "
                                    f"{node.inputs[i]!r} of shape {list(v.shape)} does not "
                                    f"follow axes {first}..{last} of {list(shape)}")
    return np.broadcast_to(v.reshape(aligned[first:last + 1]), normalized).reshape(-1)


def instance_normalization(lw: Lowering, node: Node, args: list) -> None:
    """Per sample and channel over the spatial axes; rank 3 too (GroupNorm as torch exports
    it: Reshape to (n, groups, -1), InstanceNormalization, Reshape, Mul, Add)."""
    x = args[0]
    if len(x.shape) < 3:
        raise UnsupportedModelError(f"InstanceNormalization node {node.name!r}: input of "
                                    f"rank {len(x.shape)}; rank >= 3 (n, c, ...) supported")
    c, plane = x.shape[1], math.prod(x.shape[2:])
    scale, bias = _affine(lw, node, args, c, "channel")
    _norm_rows(lw, node, x, scale, bias, plane, c, plane)


def group_normalization(lw: Lowering, node: Node, args: list) -> None:
    """Opset 18's scale and bias per group or opset 21's per channel."""
    x, groups = args[0], node.attrs["num_groups"]
    if node.channel_rank not in (None, len(x.shape)):  # fusions.py's, as exported
        raise UnsupportedModelError(f"GroupNorm node {node.name!r}: its Mul and Add are "
                                    f"per channel of a rank-{node.channel_rank} tensor, "
                                    f"not of its rank-{len(x.shape)} input")
    if len(x.shape) < 3 or x.shape[1] % groups:
        raise UnsupportedModelError(f"GroupNormalization node {node.name!r}: attribute "
                                    f"num_groups {groups} does not divide the channels of "
                                    f"a {list(x.shape)} input")
    c, plane = x.shape[1], math.prod(x.shape[2:])
    per_group = len(args) > 1 and np.size(args[1]) == groups != c
    scale, bias = _affine(lw, node, args, groups if per_group else c, "channel or group")
    if per_group:
        scale, bias = (np.repeat(v, c // groups) for v in (scale, bias))
    _norm_rows(lw, node, x, scale, bias, c // groups * plane, groups, plane)


def reduce_rows(lw: Lowering, node: Node, args: list) -> None:
    """Axes from the attribute (ReduceSum before opset 13, the others before 18)."""
    reduce_over(lw, node, args[0], node.attrs.get("axes"))


def reduce_rows_by_input(lw: Lowering, node: Node, args: list) -> None:
    """Axes from the second input (ReduceSum from opset 13, the others from 18)."""
    reduce_over(lw, node, args[0], axes_input(node, args))


def axes_input(node: Node, args: list) -> np.ndarray | None:
    """A reduction's axes input, None where it is omitted; it must be a constant."""
    axes = args[1] if len(args) > 1 else None
    if isinstance(axes, Dyn):
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: axes must be constant")
    return axes


def reduce_over(lw: Lowering, node: Node, x: Dyn, axes: Sequence[int] | np.ndarray | None
                ) -> None:
    """Over adjacent axes (ONNX's default, all axes, included). The values reduced
    together lie `inner` apart: the product of the axes after the last one reduced."""
    rank = len(x.shape)
    if axes is None or np.size(axes) == 0:
        if node.attrs.get("noop_with_empty_axes", 0):
            lw.values[node.outputs[0]] = x
            return
        axes = range(rank)
    first, last = axis_range(node, list(np.ravel(axes)), rank)
    kept = (1,) * (last + 1 - first) if node.attrs.get("keepdims", 1) else ()
    shape = x.shape[:first] + kept + x.shape[last + 1:]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], shape)
    cols, inner = math.prod(x.shape[first:last + 1]), math.prod(x.shape[last + 1:])
    rows = math.prod(x.shape) // cols
    if lw.build.tiling:  # GPUs and FPGAs: a work-group per row
        lw.emit(node, "reduce_rows", rows * WG_1D, [
            Ref(x.storage), Ref(out.storage), *ints(cols, inner, REDUCE[node.op])])
    else:
        lw.emit(node, "reduce_rows_serial", rows, [
            Ref(x.storage), Ref(out.storage), *ints(rows, cols, inner, REDUCE[node.op])])


def softmax(lw: Lowering, node: Node, args: list) -> None:
    """From opset 13: over one axis (its values `inner` apart where it is not the last)."""
    axis = node.attrs.get("axis", -1) % len(args[0].shape)
    _softmax(lw, node, args[0], axis, axis)


def softmax_coerced(lw: Lowering, node: Node, args: list) -> None:
    """Before opset 13: over the axes from `axis` on (the input coerced to 2-D)."""
    rank = len(args[0].shape)
    _softmax(lw, node, args[0], node.attrs.get("axis", 1) % rank, rank - 1)


def _softmax(lw: Lowering, node: Node, x: Dyn, axis: int, last: int) -> None:
    """Over axes `axis` to `last`."""
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    cols = math.prod(x.shape[axis:last + 1])
    rows = math.prod(x.shape) // cols
    lw.emit(node, "softmax_rows", rows, [Ref(x.storage), Ref(out.storage), *ints(
        rows, cols, math.prod(x.shape[last + 1:]))])


def resize(lw: Lowering, node: Node, args: list) -> None:
    """Nearest, linear or cubic over the two spatial axes of an NCHW tensor, from opset 11."""
    x, a = args[0], node.attrs
    mode = a.get("mode", "nearest")
    coordinates = a.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode = a.get("nearest_mode", "round_prefer_floor")
    refused = [f"{k} {v!r}" for k, v, ok in (
        ("mode", mode, RESIZE_TAPS), ("coordinate_transformation_mode", coordinates,
                                       COORDINATE_MODES),
        ("nearest_mode", nearest_mode, NEAREST), ("antialias", a.get("antialias", 0), (0,)),
        ("keep_aspect_ratio_policy", a.get("keep_aspect_ratio_policy", "stretch"),
         ("stretch",))) if v not in ok]
    if len(x.shape) != 4 or refused:
        raise UnsupportedModelError(
            f"Resize node {node.name!r}: attribute {', '.join(refused)} unsupported" if refused
            else f"Resize node {node.name!r}: rank {len(x.shape)}: only rank 4 (NCHW) is "
                 "supported")
    scales, sizes = _resize_targets(lw, node, args, x.shape)
    n, c, h, w = x.shape
    if sizes[:2] != [n, c]:
        raise UnsupportedModelError(f"Resize node {node.name!r}: resizes the batch or "
                                    f"channel axis ({list(x.shape)} -> {sizes})")
    tables = []
    for axis, name in ((2, "ys"), (3, "xs")):
        at = _source_coordinates(coordinates, x.shape[axis], sizes[axis], scales[axis])
        index, weight = _taps(mode, at, x.shape[axis], a)
        tables += [lw.ref(index, f"{node.name}:{name}", np.int32),
                   lw.ref(weight, f"{node.name}:{name}:weight", np.float32)]
    oh, ow = sizes[2:]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], (n, c, oh, ow))
    lw.emit(node, "resize2d", (oh * ow, n * c), [
        Ref(x.storage), Ref(out.storage), *tables, *ints(RESIZE_TAPS[mode], h, w, oh, ow)])


def _resize_targets(lw: Lowering, node: Node, args: list, shape: tuple[int, ...]
                    ) -> tuple[list[float], list[int]]:
    """Per axis: the scale and the output size, from the scales or the sizes input."""
    scales = args[2] if len(args) > 2 and args[2] is not None and np.size(args[2]) else None
    sizes = args[3] if len(args) > 3 and args[3] is not None and np.size(args[3]) else None
    if isinstance(scales, Dyn) or isinstance(sizes, Dyn) or (scales is None) == (
            sizes is None):
        raise UnsupportedModelError(f"Resize node {node.name!r}: one of scales and sizes "
                                    f"must be given, as a constant")
    axes = [int(ax) % len(shape) for ax in node.attrs.get("axes", range(len(shape)))]
    full_scales, full_sizes = [1.0] * len(shape), list(shape)
    for i, ax in enumerate(axes):
        if scales is not None:
            full_scales[ax] = float(scales[i])
            full_sizes[ax] = int(math.floor(shape[ax] * full_scales[ax]))
        elif sizes is not None:
            full_sizes[ax] = int(sizes[i])
            full_scales[ax] = full_sizes[ax] / shape[ax]
    return full_scales, full_sizes
