"""Lowering of the window and whole-map reductions: 2-D MaxPool and AveragePool (`pool2d`, with
a row-per-work-item `pool2d_rows` on CPUs and a padless `pool2d_valid` elsewhere where every
window lies inside the input), GlobalAveragePool and ReduceMean over trailing axes
(`global_avg_pool`), and LRN."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from accelerators.opencl.host_ops import window
from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import Dyn, Ref, ints
from accelerators.opencl.lowering_state import Lowering
from accelerators.opencl.norm_lowering import axes_input, axis_range, reduce_over


def _pool(lw: Lowering, node: Node, args: list, is_max: bool) -> None:
    x = args[0]
    if len(x.shape) != 4:
        raise UnsupportedModelError(f"node {node.name!r}: only 2-D pooling is supported")
    n, c, h, w = x.shape
    kh, kw = node.attrs["kernel_shape"]
    (oh, ow), (sh, sw), (dh, dw), (ph, pw), (eh, ew) = window(node, (h, w), (kh, kw))
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], (n, c, oh, ow))
    valid = (ph, pw) == (0, 0) and (oh - 1) * sh + (kh - 1) * dh < h \
        and (ow - 1) * sw + (kw - 1) * dw < w  # every window inside the input
    if valid and not lw.build.tiling:  # CPUs (GPUs and FPGAs: a work-item per pixel)
        lw.emit(node, "pool2d_rows", n * c * oh, [
            Ref(x.storage), Ref(out.storage), *ints(n * c * oh, h, w, oh, ow, kh, kw, sh, sw,
                                                     dh, dw, is_max)])
        return
    if valid:
        lw.emit(node, "pool2d_valid", (oh * ow, n * c), [
            Ref(x.storage), Ref(out.storage), *ints(h, w, oh, ow, kh, kw, sh, sw, dh, dw,
                                                     is_max)])
        return
    lw.emit(node, "pool2d", (oh * ow, n * c), [Ref(x.storage), Ref(out.storage), *ints(
        n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, dh, dw, is_max,
        node.attrs.get("count_include_pad", 0))])


def max_pool(lw: Lowering, node: Node, args: list) -> None:
    _pool(lw, node, args, True)


def average_pool(lw: Lowering, node: Node, args: list) -> None:
    _pool(lw, node, args, False)


def _mean_of_last_axes(lw: Lowering, node: Node, x: Dyn, first: int, keep: bool) -> None:
    """The mean over axes first.. of x, one work-item per value kept."""
    rank = len(x.shape)
    shape = x.shape[:first] + ((1,) * (rank - first) if keep else ())
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], shape)
    rows = math.prod(x.shape[:first])
    lw.emit(node, "global_avg_pool", rows, [Ref(x.storage), Ref(out.storage),
                                            *ints(rows, math.prod(x.shape[first:]))])


def global_average_pool(lw: Lowering, node: Node, args: list) -> None:
    _mean_of_last_axes(lw, node, args[0], 2, True)


def reduce_mean(lw: Lowering, node: Node, args: list) -> None:
    """Axes from the attribute (before opset 18)."""
    _reduce_mean(lw, node, args[0], node.attrs.get("axes"))


def reduce_mean_by_input(lw: Lowering, node: Node, args: list) -> None:
    """Axes from the second input (from opset 18)."""
    _reduce_mean(lw, node, args[0], axes_input(node, args))


def _reduce_mean(lw: Lowering, node: Node, x: Dyn, axes: Sequence[int] | np.ndarray | None
                 ) -> None:
    """Over trailing axes: torchvision's `x.mean([2, 3])` (ShuffleNet's global pool), by the
    global pool's kernel; over other adjacent axes (MLP-Mixer's mean over tokens):
    norm_lowering's row reduction."""
    rank = len(x.shape)
    first, last = axis_range(node, axes, rank) if axes is not None and np.size(axes) \
        else (0, 0)  # no axes: all, or none (reduce_over decides)
    if last != rank - 1:
        reduce_over(lw, node, x, axes)
        return
    _mean_of_last_axes(lw, node, x, first, bool(node.attrs.get("keepdims", 1)))


def lrn(lw: Lowering, node: Node, args: list) -> None:
    x, a = args[0], node.attrs
    n, c = x.shape[:2]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    hw = math.prod(x.shape[2:])
    lw.emit(node, "lrn", (hw, c, n), [
        Ref(x.storage), Ref(out.storage), *ints(c, hw, a["size"]),
        np.float32(a.get("alpha", 1e-4)), np.float32(a.get("beta", 0.75)),
        np.float32(a.get("bias", 1.0))])
