"""Lowering of elementwise math on activations: the binary ops (Add, Sub, Mul, Div, Sum, Pow,
Max, Min, PRelu) with numpy broadcasting of any rank whose axes merge to at most 4 (`binary4d`),
one-input math that is no fused activation (`unary`: Neg, Sqrt, Reciprocal, Erf, Tanh, Exp,
Abs, Log, Softplus, Mish, Pow by 2), the activations that were not fused into the node before
them (`activation`) and a BatchNormalization not folded into a convolution
(`channel_affine`)."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import BINARY, UNARY, Dyn, Ref, activation_args, ints
from accelerators.opencl.layout_lowering import broadcast_strides, merged
from accelerators.opencl.lowering_state import Lowering


def binary(lw: Lowering, node: Node, args: list) -> None:
    if len(args) == 1:  # a one-input Sum is its input
        lw.values[node.outputs[0]] = args[0]
        return
    if len(args) != 2:
        raise UnsupportedModelError(f"node {node.name!r}: {node.op} of {len(args)} inputs "
                                    f"is supported only with 1 or 2")
    shape = np.broadcast_shapes(*(tuple(v.shape) for v in args))
    dims, strides = merged(shape, *(broadcast_strides(tuple(v.shape), shape) for v in args))
    if len(dims) > 4:
        raise UnsupportedModelError(f"node {node.name!r}: {node.op} broadcasting "
                                    f"{[list(v.shape) for v in args]} over more than 4 axes")
    pad = 4 - len(dims)
    dims = (1,) * pad + dims
    strides = [(0,) * pad + s for s in strides]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], shape)
    refs = [lw.ref(v, i) for v, i in zip(args, node.inputs)]
    lw.emit(node, "binary4d", (dims[2] * dims[3], dims[0] * dims[1]), [
        *refs, Ref(out.storage), *ints(*dims[1:], *strides[0], *strides[1], BINARY[node.op]),
        *activation_args(node, lw.values)])


def unary(lw: Lowering, node: Node, args: list, op: str | None = None) -> None:
    x = args[0]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    total = math.prod(x.shape)
    lw.emit(node, "unary", total, [Ref(x.storage), Ref(out.storage),
                                   *ints(total, UNARY[op or node.op])])


def power(lw: Lowering, node: Node, args: list) -> None:
    """By a constant 2 or 1/2 (LayerNorm's variance and its root, as exporters decompose
    it): a product or a square root; any other exponent through pow()."""
    x, e = args
    if isinstance(x, Dyn) and not isinstance(e, Dyn) and np.size(e) == 1 \
            and float(np.ravel(e)[0]) in (2.0, 0.5):
        unary(lw, node, args, "Square" if float(np.ravel(e)[0]) == 2.0 else "Sqrt")
        return
    binary(lw, node, args)


def activation(lw: Lowering, node: Node, args: list) -> None:
    x = args[0]
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    lw.emit(node, "activation", math.prod(x.shape), [
        Ref(x.storage), Ref(out.storage), np.int32(math.prod(x.shape)),
        *activation_args(node, lw.values)])


def gelu(lw: Lowering, node: Node, args: list) -> None:
    if node.attrs.get("approximate", "none") not in ("none", "tanh"):
        raise UnsupportedModelError(f"Gelu node {node.name!r}: attribute approximate "
                                    f"{node.attrs['approximate']!r} is not none or tanh")
    activation(lw, node, args)


def batch_normalization(lw: Lowering, node: Node, args: list) -> None:
    """One not folded into a convolution: a scale and shift per channel (axis 1)."""
    x = args[0]
    if any(isinstance(v, Dyn) for v in args[1:5]):
        raise UnsupportedModelError(f"BatchNormalization node {node.name!r}: scale, bias, "
                                    f"mean and variance must be constant")
    gamma, beta, mean, var = (np.asarray(v, np.float64) for v in args[1:5])
    scale = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
    c, hw = x.shape[1], math.prod(x.shape[2:])
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    lw.emit(node, "channel_affine", (hw, x.shape[0] * c), [
        Ref(x.storage), lw.ref(scale, f"{node.name}:scale"),
        lw.ref(beta - mean * scale, f"{node.name}:shift"), Ref(out.storage),
        *ints(c, hw), *activation_args(node, lw.values)], 2 * math.prod(x.shape))
