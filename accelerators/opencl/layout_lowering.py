"""Lowering of the ops that move data without arithmetic on it (Transpose, Slice, Split, Expand,
Tile and Gather of activations: ShuffleNet's channel shuffle and channel split, attention's
heads, a ViT's class token) to one kernel, `gather_strided`, which copies a strided view of
rank <= 6 into a contiguous tensor (a broadcast axis is one of stride 0); Concat to
`concat_parts`, one launch per eight inputs; Pad to `pad`; a Cast between float types is a view."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import VN, Dyn, Ref, ints
from accelerators.opencl.lowering_state import Lowering

MAX_RANK = 6
PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}  # elementwise.cl's PAD_*


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """The strides that read a contiguous tensor of `shape` numpy-broadcast to `out`."""
    own = [0 if d == 1 else s for d, s in zip(shape, contiguous_strides(shape))]
    return [0] * (len(out) - len(shape)) + own


def merged(shape: tuple[int, ...], *strides: list[int]) -> tuple[tuple, list[tuple]]:
    """The same views of `shape` with fewer axes: size-1 axes dropped, and an axis merged into
    the next when, in every view, stepping over all of the next is one step of it (h and w of a
    channel shuffle; the tokens and samples of a bias added to (n, tokens, dim))."""
    dims: list[int] = []
    steps: list[list[int]] = [[] for _ in strides]
    for i, d in enumerate(shape):
        if d == 1:
            continue
        if dims and all(st[-1] == d * s[i] for st, s in zip(steps, strides)):
            dims[-1] *= d
            for st, s in zip(steps, strides):
                st[-1] = s[i]
        else:
            dims.append(d)
            for st, s in zip(steps, strides):
                st.append(s[i])
    if not dims:
        return (1,), [(0,)] * len(strides)
    return tuple(dims), [tuple(st) for st in steps]


def _strided_copy(lw: Lowering, node: Node, x: Dyn, output: str, shape: tuple[int, ...],
                  strides: list[int], offset: int) -> Dyn:
    """output[i] = x[offset + sum(i_k * strides_k)] over `shape`."""
    out = lw.values[output] = lw.new(output, tuple(shape))
    dims, (steps,) = merged(shape, strides)
    if len(dims) > MAX_RANK:
        raise UnsupportedModelError(
            f"{node.op} node {node.name!r}: rank {len(dims)} > {MAX_RANK}")
    pad = MAX_RANK - len(dims)
    dims, steps = (1,) * pad + dims, (0,) * pad + steps
    vector = steps[5] == 1 and dims[5] % VN == 0  # whole vectors along a contiguous axis
    lw.emit(node, "gather_strided_vec" if vector else "gather_strided",
            (dims[5] // VN if vector else dims[5], dims[4], math.prod(dims[:4])), [
                   Ref(x.storage), Ref(out.storage),
                   *ints(math.prod(shape), *dims[1:], *steps, offset)])
    return out


def transpose(lw: Lowering, node: Node, args: list) -> None:
    x = args[0]
    rank = len(x.shape)
    perm = list(node.attrs.get("perm", range(rank - 1, -1, -1)))
    src = contiguous_strides(x.shape)
    _strided_copy(lw, node, x, node.outputs[0], tuple(x.shape[p] for p in perm),
                  [src[p] for p in perm], 0)


def _slice_axes(lw: Lowering, node: Node, x: Dyn, ranges: dict[int, tuple[int, int, int]],
                output: str) -> None:
    """`ranges`: axis -> (start, stop, step) as Python's slice.indices gives them."""
    src = contiguous_strides(x.shape)
    shape, strides, offset = list(x.shape), list(src), 0
    for axis, (start, stop, step) in ranges.items():
        shape[axis] = len(range(start, stop, step))
        strides[axis] = src[axis] * step
        offset += start * src[axis]
    _strided_copy(lw, node, x, output, tuple(shape), strides, offset)


def slice_by_attributes(lw: Lowering, node: Node, args: list) -> None:
    """Before opset 10: starts, ends and axes are attributes."""
    a = node.attrs
    _slice(lw, node, args[0], a["starts"], a["ends"], a.get("axes"), None)


def slice_by_inputs(lw: Lowering, node: Node, args: list) -> None:
    """From opset 10: starts, ends, axes and steps are inputs, which must be constants."""
    if any(isinstance(v, Dyn) for v in args[1:]):
        raise UnsupportedModelError(f"Slice node {node.name!r}: starts, ends, axes "
                                    f"and steps must be constant")
    _slice(lw, node, args[0], args[1], args[2], _optional(args, 3), _optional(args, 4))


def _optional(args: list, i: int) -> Any:
    """Input `i`, None where it is omitted."""
    return args[i] if len(args) > i else None


def _slice(lw: Lowering, node: Node, x: Dyn, starts: Sequence[int], ends: Sequence[int],
           axes: Sequence[int] | None, steps: Sequence[int] | None) -> None:
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    rank = len(x.shape)
    ranges = {int(ax) % rank: slice(int(s), int(e), int(st)).indices(x.shape[int(ax) % rank])
              for s, e, ax, st in zip(starts, ends, axes, steps)}
    _slice_axes(lw, node, x, ranges, node.outputs[0])


def split(lw: Lowering, node: Node, args: list) -> None:
    """Before opset 13: the sizes of the parts are an attribute (opset 1: or an input)."""
    sizes = args[1] if _optional(args, 1) is not None else node.attrs.get("split")
    _split(lw, node, args[0], sizes, len(node.outputs))


def split_by_input(lw: Lowering, node: Node, args: list) -> None:
    """From opset 13: the sizes are an input."""
    _split(lw, node, args[0], _optional(args, 1), len(node.outputs))


def split_into_num_outputs(lw: Lowering, node: Node, args: list) -> None:
    """From opset 18: the sizes are an input, or equal parts by attribute num_outputs."""
    _split(lw, node, args[0], _optional(args, 1),
           node.attrs.get("num_outputs", len(node.outputs)))


def _split(lw: Lowering, node: Node, x: Dyn, sizes: Sequence[int] | None, parts: int) -> None:
    """`sizes`: of the parts, None for `parts` equal parts, the last one smaller."""
    axis = node.attrs.get("axis", 0) % len(x.shape)
    size = x.shape[axis]
    if sizes is not None:
        sizes = [int(s) for s in sizes]
    else:
        sizes = [-(-size // parts)] * parts
        sizes[-1] = size - sum(sizes[:-1])
    if sum(sizes) != size or len(sizes) != len(node.outputs):
        raise UnsupportedModelError(f"Split node {node.name!r}: parts {sizes} do not split "
                                    f"axis {axis} of size {size} into "
                                    f"{len(node.outputs)} outputs")
    start = 0
    for part, output in zip(sizes, node.outputs):
        if output:
            _slice_axes(lw, node, x, {axis: (start, start + part, 1)}, output)
        start += part


def expand(lw: Lowering, node: Node, args: list) -> None:
    x, target = args
    if isinstance(target, Dyn):
        raise UnsupportedModelError(f"Expand node {node.name!r}: the shape must be constant")
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in target))
    if math.prod(shape) == math.prod(x.shape):  # at most leading 1s added: a view
        lw.values[node.outputs[0]] = Dyn(shape, x.storage)
        return
    _strided_copy(lw, node, x, node.outputs[0], shape, broadcast_strides(x.shape, shape), 0)


def tile(lw: Lowering, node: Node, args: list) -> None:
    """Each axis of size d repeated r times is an axis r of stride 0 before it: a strided
    copy whose (r, d) pairs are the output's axes."""
    x, repeats = args
    if isinstance(repeats, Dyn):
        raise UnsupportedModelError(f"Tile node {node.name!r}: repeats must be constant")
    src = contiguous_strides(x.shape)
    pairs = [((int(r), d), (0, s)) for r, d, s in zip(np.ravel(repeats), x.shape, src)]
    shape = tuple(v for dims, _ in pairs for v in dims)
    out = _strided_copy(lw, node, x, node.outputs[0], shape,
                        [v for _, steps in pairs for v in steps], 0)
    lw.values[node.outputs[0]] = Dyn(tuple(r * d for (r, d), _ in pairs), out.storage)


def cast(lw: Lowering, node: Node, args: list) -> None:
    """A float activation cast to a float type is itself: tensors hold the build's float
    (fp32 or fp16) whatever the model's float type."""
    if node.attrs.get("to") not in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                    TensorProto.DOUBLE):
        raise UnsupportedModelError(f"Cast node {node.name!r}: only to a float type on an "
                                    f"activation, not to={node.attrs.get('to')}")
    lw.values[node.outputs[0]] = args[0]


def gather(lw: Lowering, node: Node, args: list) -> None:
    """Constant indices, one or a list stepping evenly along the axis (a ViT's class token,
    x[:, 0]; a row of attention's packed q, k, v): a strided view of the data."""
    x, indices = args
    if isinstance(indices, Dyn) or np.ndim(indices) > 1:
        raise UnsupportedModelError(f"Gather node {node.name!r}: only constant scalar or 1-D "
                                    f"indices are supported on an activation")
    axis = node.attrs.get("axis", 0) % len(x.shape)
    flat = [int(i) % x.shape[axis] for i in np.ravel(indices)]
    step = flat[1] - flat[0] if len(flat) > 1 else 1
    if not flat or any(b - a != step for a, b in zip(flat, flat[1:])):
        raise UnsupportedModelError(f"Gather node {node.name!r}: indices that do not step "
                                    f"evenly along axis {axis} are not supported")
    src = contiguous_strides(x.shape)
    kept = () if np.ndim(indices) == 0 else (len(flat),)
    _strided_copy(lw, node, x, node.outputs[0], x.shape[:axis] + kept + x.shape[axis + 1:],
                  src[:axis] + [src[axis] * step] * len(kept) + src[axis + 1:],
                  flat[0] * src[axis])


def pad(lw: Lowering, node: Node, args: list) -> None:
    """Modes constant (negative amounts cropping), reflect (TResNet's blur pool), edge and
    wrap, any axes: timm's "same" padding, whose amounts exporters compute from the input's
    shape (folded for each batch size). One of zero amounts is a view (Swin's window padding
    where the windows tile the map). A zero Pad read by a Conv alone never gets here:
    graph.py folds it into the Conv's padding. From opset 11 the amounts, value and axes are
    inputs."""
    value = args[2] if _optional(args, 2) is not None else 0.0
    _pad(lw, node, args[0], args[1], value, _optional(args, 3))


def pad_by_attributes(lw: Lowering, node: Node, args: list) -> None:
    """Before opset 11: the amounts and the value are attributes."""
    _pad(lw, node, args[0], node.attrs.get("pads"), node.attrs.get("value", 0.0), None)


def _pad(lw: Lowering, node: Node, x: Dyn, amounts: Any, value: Any, axes: Any) -> None:
    """`amounts`, `value`, `axes`: as the attributes or inputs give them (`args`' values)."""
    mode = node.attrs.get("mode", "constant")
    if mode not in PAD_MODES or any(isinstance(v, Dyn) for v in (amounts, value, axes)):
        raise UnsupportedModelError(f"op 'Pad' of node {node.name!r}: only modes "
                                    f"{list(PAD_MODES)} with constant amounts are "
                                    f"supported, not mode={mode!r}")
    rank = len(x.shape)
    padded = range(rank) if axes is None else [int(ax) % rank for ax in np.ravel(axes)]
    amounts = [int(v) for v in np.ravel(amounts)]
    begin, end = [0] * rank, [0] * rank
    for k, ax in enumerate(padded):
        begin[ax], end[ax] = amounts[k], amounts[k + len(padded)]
    shape = tuple(d + b + e for d, b, e in zip(x.shape, begin, end))
    if not any(begin + end):
        lw.values[node.outputs[0]] = x
        return
    if rank > MAX_RANK or mode == "reflect" and any(
            max(b, e) >= d for b, e, d in zip(begin, end, x.shape)):
        raise UnsupportedModelError(f"Pad node {node.name!r}: rank {rank} > {MAX_RANK}, or "
                                    f"a reflection wider than its axis")
    fill = MAX_RANK - rank
    dims, sizes = (1,) * fill + shape, (1,) * fill + tuple(x.shape)
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], shape)
    lw.emit(node, "pad", (dims[5], dims[4], math.prod(dims[:4])), [
        Ref(x.storage), Ref(out.storage), *ints(*dims[1:], *sizes, *([0] * fill + begin)),
        np.float32(np.ravel(value)[0]), np.int32(PAD_MODES[mode])])


CONCAT_PARTS = 8  # sources of one concat_parts launch (kernels/elementwise.cl)


def concat(lw: Lowering, node: Node, args: list) -> None:
    """One launch per CONCAT_PARTS inputs (a plan's launches each cost a kernel object to
    build: DenseNet-121's 58 Concats of up to 25 inputs were 840 copies, one per input)."""
    rank = len(args[0].shape)
    axis = node.attrs["axis"] % rank
    shape = list(args[0].shape)
    shape[axis] = sum(v.shape[axis] for v in args)
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], tuple(shape))
    outer, offset, stride = math.prod(shape[:axis]), 0, math.prod(shape[axis:])
    parts = [(lw.ref(v, name), math.prod(v.shape[axis:])) for v, name in zip(args, node.inputs)]
    for first in range(0, len(parts), CONCAT_PARTS):
        group = parts[first:first + CONCAT_PARTS]
        size = sum(inner for _, inner in group)
        padded = group + [(group[0][0], 0)] * (CONCAT_PARTS - len(group))
        lw.emit(node, "concat_parts", outer * size, [
            Ref(out.storage), *ints(outer, size, stride, offset),
            *(arg for ref, inner in padded for arg in (ref, np.int32(inner)))])
        offset += size
