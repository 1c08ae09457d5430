"""What the lowering of one graph for one batch size holds while its nodes are lowered, and
the type of an op's lowering: a function of that state, the node and its input values, which
records the node's outputs in `values` and its launches and buffers in `out`; and the type of a
table of lowerings by op and opset."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from accelerators.opencl.ir import Graph, Node
from accelerators.opencl.launch import WG_1D, Build, Dyn, Launch, Lowered, Ref, round_up


@dataclass
class Lowering:
    graph: Graph
    build: Build
    batch: int
    out: Lowered
    # Each tensor by name: a value known on the host (a constant, a folded node's output) or
    # an activation in a device buffer.
    values: dict[str, np.ndarray | Dyn]
    # Folded values that depend on this batch size (on a Shape): their device copies are
    # keyed apart from other batch sizes' (the engine shares constants between plans).
    per_batch: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)  # nodes another's lowering took in (a pool)

    def new(self, name: str, shape: tuple[int, ...], itemsize: int | None = None) -> Dyn:
        """A tensor of `itemsize` bytes per value; by default the build's (fp32 or fp16)."""
        size = itemsize or np.dtype(self.build.dtype).itemsize
        self.out.storages[name] = size * math.prod(shape)
        return Dyn(tuple(shape), name)

    def ref(self, value: np.ndarray | Dyn, key: str, dtype: type | None = None) -> Ref:
        """A device constant, by default of the build's float type."""
        if isinstance(value, Dyn):
            return Ref(value.storage)
        if key in self.per_batch:
            key = f"{key}@batch{self.batch}"
        self.out.consts.setdefault(key, np.ascontiguousarray(value, dtype or self.build.dtype))
        return Ref(key)

    def emit(self, node: Node, kernel: str, size: int | tuple[int, ...], args: list,
             flops: int = 0) -> None:
        """A launch of work-groups of WG_1D along the first dimension of `size`."""
        size = (size,) if isinstance(size, int) else size
        self.out.launches.append(Launch(kernel, (round_up(size[0], WG_1D), *size[1:]),
                                        (WG_1D,) + (1,) * (len(size) - 1), args, node.name,
                                        flops))


# `args`: the node's input values, None for an omitted optional input.
OpLowering = Callable[[Lowering, Node, list], None]
# An op's lowerings, each with the first opset it covers, oldest first (as ONNX Runtime's
# kernel registry keys kernels by since-version): a model's opset takes the last one at or
# below it; an opset below the first is refused.
Versions = tuple[tuple[int, OpLowering], ...]
Table = dict[str, Versions]


def always(lowering: OpLowering) -> Versions:
    """One lowering for every opset."""
    return ((1, lowering),)
