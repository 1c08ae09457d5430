"""Flatten, Reshape, Squeeze and Unsqueeze of an activation: no launch, the output is a view of
the input's buffer with another shape. Squeeze's and Unsqueeze's axes are an attribute before
opset 13 and an input from it: one lowering each."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import Dyn
from accelerators.opencl.lowering_state import Lowering, OpLowering, Table, always
from accelerators.opencl.norm_lowering import axes_input

Axes = Sequence[int] | np.ndarray  # an attribute's list, or an input's constant

Shape = tuple[int, ...]


def _view(shape_of: Callable[[Node, Shape, list], Shape]) -> OpLowering:
    """The lowering of a view whose output shape is `shape_of(node, input shape, args)`."""
    def lowering(lw: Lowering, node: Node, args: list) -> None:
        x = args[0]
        assert isinstance(x, Dyn)  # constant inputs are folded before any lowering
        lw.values[node.outputs[0]] = Dyn(shape_of(node, x.shape, args), x.storage)
    return lowering


def _flatten(node: Node, shape: Shape, args: list) -> Shape:
    axis = node.attrs.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def _reshape(node: Node, shape: Shape, args: list) -> Shape:
    if len(args) < 2 or args[1] is None or isinstance(args[1], Dyn):
        raise UnsupportedModelError(f"node {node.name!r}: Reshape target is not constant")
    target = [int(d) for d in args[1]]
    if not node.attrs.get("allowzero", 0):
        target = [shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(shape) // known
    if math.prod(target) != math.prod(shape):
        raise UnsupportedModelError(
            f"node {node.name!r}: cannot reshape {list(shape)} to {target}")
    return tuple(target)


def _axes_attribute(node: Node, args: list) -> Axes | None:
    return node.attrs.get("axes")


def _squeeze(axes_of: Callable[[Node, list], Axes | None]
             ) -> Callable[[Node, Shape, list], Shape]:
    def shape_of(node: Node, shape: Shape, args: list) -> Shape:
        axes = axes_of(node, args)
        if axes is None:
            return tuple(d for d in shape if d != 1)
        drop = {int(ax) % len(shape) for ax in axes}
        return tuple(d for i, d in enumerate(shape) if i not in drop)
    return shape_of


def _unsqueeze(axes_of: Callable[[Node, list], Axes | None]
               ) -> Callable[[Node, Shape, list], Shape]:
    def shape_of(node: Node, shape: Shape, args: list) -> Shape:
        axes = axes_of(node, args)
        if axes is None:
            raise UnsupportedModelError(f"node {node.name!r}: Unsqueeze without axes")
        rank = len(shape) + len(axes)
        insert = {int(ax) % rank for ax in axes}
        dims = iter(shape)
        return tuple(1 if i in insert else next(dims) for i in range(rank))
    return shape_of


VIEWS: Table = {
    "Flatten": always(_view(_flatten)),
    "Reshape": always(_view(_reshape)),
    "Squeeze": ((1, _view(_squeeze(_axes_attribute))), (13, _view(_squeeze(axes_input)))),
    "Unsqueeze": ((1, _view(_unsqueeze(_axes_attribute))),
                  (13, _view(_unsqueeze(axes_input)))),
}
