"""Lowering of elementwise math on activations: the binary ops (Add, Sub, Mul, Div, Sum, Pow,
Max, Min, PRelu) with numpy broadcasting of any rank whose axes merge to at most 4 (`binary4d`),
and one-input math that is no fused activation (`unary`: Neg, Sqrt, Reciprocal, Erf, Tanh, Exp,
Abs, Log, Softplus, Mish, Pow by 2)."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import BINARY, UNARY, Dyn, Ref, activation_args, ints
from accelerators.opencl.layout_lowering import broadcast_strides, merged


class ElementwiseLowering:
    """Mixed into lowering.Lowering, whose values, _new, _ref and _emit these methods use."""

    def _binary(self, node: Node, args: list) -> None:
        if len(args) == 1:  # a one-input Sum is its input
            self.values[node.outputs[0]] = args[0]
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
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], shape)
        refs = [self._ref(v, i) for v, i in zip(args, node.inputs)]
        self._emit(node, "binary4d", (dims[2] * dims[3], dims[0] * dims[1]), [
            *refs, Ref(out.storage), *ints(*dims[1:], *strides[0], *strides[1], BINARY[node.op]),
            *activation_args(node, self.values)])

    _add = _sub = _mul = _div = _sum = _max = _min = _prelu = _binary

    def _unary(self, node: Node, args: list, op: str | None = None) -> None:
        x = args[0]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        total = math.prod(x.shape)
        self._emit(node, "unary", total, [Ref(x.storage), Ref(out.storage),
                                          *ints(total, UNARY[op or node.op])])

    _neg = _sqrt = _reciprocal = _erf = _tanh = _exp = _abs = _log = _softplus = _mish = _unary

    def _pow(self, node: Node, args: list) -> None:
        """By a constant 2 or 1/2 (LayerNorm's variance and its root, as exporters decompose
        it): a product or a square root; any other exponent through pow()."""
        x, e = args
        if isinstance(x, Dyn) and not isinstance(e, Dyn) and np.size(e) == 1 \
                and float(np.ravel(e)[0]) in (2.0, 0.5):
            self._unary(node, args, "Square" if float(np.ravel(e)[0]) == 2.0 else "Sqrt")
            return
        self._binary(node, args)
