"""Subgraphs described as data and found by one matcher (fusions.py's normalisations): a pattern
is the tree of producers of one tensor, each `Op` with the patterns of its inputs; `Tensor`
binds any tensor (one name twice: the same tensor), `Const` a constant (with `value`: one value
close to it), `AnyOf` the first of its patterns that matches."""

from __future__ import annotations

from dataclasses import dataclass, field

from accelerators.opencl.ir import Graph, Node

_TOL = 1e-4  # constants of the patterns as exporters round them (1.4142135, 0.044715, ...)


@dataclass(frozen=True)
class Tensor:
    name: str


@dataclass(frozen=True)
class Const:
    name: str
    value: float | None = None


@dataclass(frozen=True)
class Op:
    op: str
    inputs: tuple[Pattern, ...]
    name: str = ""  # binds the node, and its output as a tensor
    either_order: bool = False  # two inputs, matched in either order (Add, Mul)


@dataclass(frozen=True)
class AnyOf:
    options: tuple[Pattern, ...]


Pattern = Tensor | Const | Op | AnyOf


@dataclass
class Match:
    """What a pattern bound: tensors (and constants) by name, nodes by name."""
    tensors: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)


def scalar(graph: Graph, name: str, value: float) -> bool:
    """`name` is a constant holding one value close to `value`."""
    c = graph.consts.get(name)
    return c is not None and c.size == 1 and abs(float(c.reshape(-1)[0]) - value) <= _TOL * max(
        1.0, abs(value))


def match(graph: Graph, pattern: Pattern, node: Node) -> Match | None:
    """The bindings of `pattern` rooted at `node`, None where it does not match."""
    return _match(graph, pattern, node.outputs[0], Match())


def _bind(found: Match, name: str, tensor: str) -> Match | None:
    seen = found.tensors.get(name)
    if seen is not None:
        return found if seen == tensor else None
    return Match({**found.tensors, name: tensor}, found.nodes)


def _match(graph: Graph, pattern: Pattern, tensor: str, found: Match) -> Match | None:
    if isinstance(pattern, Tensor):
        return _bind(found, pattern.name, tensor)
    if isinstance(pattern, Const):
        ok = tensor in graph.consts and (pattern.value is None
                                         or scalar(graph, tensor, pattern.value))
        return _bind(found, pattern.name, tensor) if ok else None
    if isinstance(pattern, AnyOf):
        for option in pattern.options:
            result = _match(graph, option, tensor, found)
            if result is not None:
                return result
        return None
    node = graph.producer(tensor)
    result = _match_op(graph, pattern, node, found)
    if result is None or not pattern.name:
        return result
    assert node is not None  # _match_op matched it
    return _bind(Match(result.tensors, {**result.nodes, pattern.name: node}), pattern.name,
                 tensor)


def _match_op(graph: Graph, pattern: Op, node: Node | None, found: Match) -> Match | None:
    if node is None or node.op != pattern.op or len(node.inputs) < len(pattern.inputs):
        return None
    orders = [node.inputs, node.inputs[::-1]] if pattern.either_order else [node.inputs]
    for inputs in orders:
        result: Match | None = found
        for sub, tensor in zip(pattern.inputs, inputs):
            result = _match(graph, sub, tensor, result) if result is not None else None
        if result is not None:
            return result
    return None
