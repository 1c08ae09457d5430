"""Which ONNX nodes are computed on the host instead of run, one rule for the OpenCL engine (at
load for constants, per batch size for shapes) and the FLOP counter (which counts what is left,
so that it counts what the engine runs): a node of ONNX's own domain folds where each input is
known on the host, a constant or, read by Shape or Size, a tensor whose shape is known. Its
values come from ONNX's reference evaluator at the model's opset (onnx_nodes.run_node)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from accelerators.onnx_nodes import run_node

SHAPE_READERS = frozenset(("Shape", "Size"))  # read only their input's shape


class Shaped(Protocol):
    """A tensor computed at run time (an activation), whose shape may be known."""

    @property
    def shape(self) -> tuple[int, ...] | None: ...


@dataclass(frozen=True)
class Activation:
    shape: tuple[int, ...] | None = None  # None: not known here


def host_inputs(op: str, domain: str, args: Sequence[np.ndarray | Shaped | None]
                ) -> list[np.ndarray | None] | None:
    """The inputs `op` folds with (None: an omitted optional input), or None where it must run:
    it reads an activation, other than the shape of one, or it is not an ONNX op (a contrib
    op, one of the engine's own)."""
    if domain not in ("", "ai.onnx") or not onnx.defs.has(op):
        return None
    first = args[0] if args else None
    if op in SHAPE_READERS and first is not None and not isinstance(first, np.ndarray) \
            and first.shape is not None:
        return [np.broadcast_to(np.float32(0), first.shape)]  # only its shape is read
    if any(a is not None and not isinstance(a, np.ndarray) for a in args):
        return None
    return [a if isinstance(a, np.ndarray) else None for a in args]


def fold(node: onnx.NodeProto, args: Sequence[np.ndarray | Shaped | None], opset: int
         ) -> list[np.ndarray] | None:
    """The outputs of `node` where it folds, else None; the reference evaluator's errors
    propagate."""
    inputs = host_inputs(node.op_type, node.domain, args)
    if inputs is None:
        return None
    if node.op_type == "DequantizeLinear" and opset < 19:  # the evaluator has it from 19
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return [dequantize(inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, axis)]
    return run_node(node, inputs, opset)


def dequantize(x: np.ndarray | None, scale: np.ndarray | None, zero: np.ndarray | None,
               axis: int) -> np.ndarray:
    """DequantizeLinear of a constant: (x - zero) * scale, per tensor or per `axis`."""
    if x is None or scale is None:
        raise ValueError("DequantizeLinear without its input or scale")
    shape = [1] * x.ndim
    if scale.size > 1:
        shape[axis % max(x.ndim, 1)] = -1
    zero = np.zeros(1, x.dtype) if zero is None else zero
    return ((x.astype(np.float32) - zero.astype(np.float32).reshape(shape))
            * scale.astype(np.float32).reshape(shape)).astype(np.float32)
