"""The OpenCL engine's graph: nodes over named tensors, the constants they read, and the error
for what the engine cannot run. accelerators/opencl/graph.py builds one from an ONNX model; the
passes and lowerings work on it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


class UnsupportedModelError(ValueError):
    pass


class UnsupportedOpError(UnsupportedModelError):
    """An op the engine does not have, whatever the shapes."""


@dataclass(frozen=True)
class Grid:
    """One tensor's quantization, with codes stored shifted into signed chars."""
    scale: float
    zero: int
    lo: int  # the type's range
    hi: int
    shift: int  # 128 for uint8, 0 for int8

    @property
    def stored(self) -> tuple[int, int, int]:
        """(zero point, lo, hi) of the stored codes."""
        return self.zero - self.shift, self.lo - self.shift, self.hi - self.shift


@dataclass
class Node:
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)  # ONNX attributes only
    # What the passes record for the lowerings (none of it is an ONNX attribute):
    activation: Node | None = None  # fused into this node, applied to its output (graph.py)
    grid: Grid | None = None  # a FakeQuant's grid (qdq.py)
    quant_in: Grid | None = None  # an int8 Conv/Gemm: the grid it quantizes its input onto
    requant: Grid | None = None  # ... and its output's re-quantization (qdq.py)
    # A LayerNormalization fused from ReduceMeans (fusions.py): their axes.
    reduce_axes: list[int] | None = None
    # A GroupNormalization fused from torch's export (fusions.py): the rank its per-channel
    # Mul and Add were written for, which the lowering checks against its input's.
    channel_rank: int | None = None


@dataclass
class Graph:
    inputs: list[tuple[str, tuple[int, ...]]]  # -1 for free dimensions (the batch)
    outputs: list[tuple[str, tuple[int, ...]]]
    nodes: list[Node]
    consts: dict[str, np.ndarray]
    opset: int
    fused: Counter = field(default_factory=Counter)  # what simplification did, for logs
    derived: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. transposed weights
    int8: dict = field(default_factory=dict)  # weight name -> qdq.Int8Weight

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.nodes if name in n.inputs]

    def sole_consumer(self, node: Node) -> Node | None:
        """The one node reading `node`'s first output, unless others or the graph's outputs do."""
        out = node.outputs[0]
        users = self.consumers(out)
        if len(users) != 1 or out in {name for name, _ in self.outputs}:
            return None
        return users[0]

    def producer(self, name: str) -> Node | None:
        return next((n for n in self.nodes if name in n.outputs), None)

    def rename(self, old: str, new: str) -> None:
        """Every reader of `old` reads `new` instead."""
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
