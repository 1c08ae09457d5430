"""Patterns that exporters spell as several ops, recognised at load and rewritten into one op:
GELU in its exact form (x * (1 + erf(x / sqrt 2)) * 0.5, torch's export before opset 20) and its
tanh form become `Gelu` (ONNX opset 20's op, then fused like the other activations);
LayerNormalization decomposed into ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add (as
exporters emit it before opset 17) becomes one `LayerNormalization`; GroupNorm as torch exports
it (Reshape, InstanceNormalization, Reshape, Mul, Add) one `GroupNormalization` (these two are
described as data, LAYER_NORM and GROUP_NORM, and found by patterns.py's matcher). An Einsum that
is a batched matrix product (MaxViT's attention: "BGHID,BGHJD->BGHIJ") becomes a MatMul, with
the Transposes (and an Unsqueeze) that bring its letters into MatMul's order; one with `...` is
rewritten the same way by the lowering, which knows its operands' ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accelerators.einsum_equation import explicit
from accelerators.opencl.ir import Graph, Node
from accelerators.opencl.patterns import AnyOf, Const, Op, Tensor, match, scalar


def fuse_patterns(graph: Graph) -> None:
    _fuse_gelu(graph)
    _fuse_layer_norm(graph)
    _fuse_group_norm(graph)
    _einsum_as_matmul(graph)


def _internal(graph: Graph, nodes: list[Node]) -> bool:
    """Each node's output is read by one node alone (the next of its pattern)."""
    return all(graph.sole_consumer(n) is not None and len(n.outputs) == 1 for n in nodes)


def _other(node: Node, name: str) -> str | None:
    """The input of a two-input node that is not `name`."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _scaled_by(graph: Graph, node: Node | None, value: float) -> str | None:
    """The x of `node` = Mul(x, value), Mul(value, x) or Div(x, 1 / value)."""
    if node is None:
        return None
    if node.op == "Mul":
        for x, k in (node.inputs, node.inputs[::-1]):
            if scalar(graph, k, value):
                return x
    if node.op == "Div" and scalar(graph, node.inputs[1], 1 / value):
        return node.inputs[0]
    return None


def _gelu_tail(graph: Graph, core: Node, x: str) -> list[Node] | None:
    """The nodes after erf or tanh: Add(core, 1), then Mul by x and by 0.5 in either order
    (x * (1 + core) * 0.5 or (x * 0.5) * (1 + core)); the last one's output is the GELU's."""
    add = graph.sole_consumer(core)
    if add is None or add.op != "Add" or not scalar(graph, _other(add, core.outputs[0]) or "",
                                                       1.0):
        return None
    mul = graph.sole_consumer(add)
    if mul is None or mul.op != "Mul":
        return None
    other = _other(mul, add.outputs[0])
    if other == x:  # x * (1 + core), then * 0.5
        half = graph.sole_consumer(mul)
        if half is None or _scaled_by(graph, half, 0.5) != mul.outputs[0]:
            return None
        return [add, mul, half]
    half = graph.producer(other or "")
    if half is None or _scaled_by(graph, half, 0.5) != x or len(graph.consumers(other or "")) != 1:
        return None
    return [add, half, mul]


def _tanh_argument(graph: Graph, tanh: Node) -> tuple[str, list[Node]] | None:
    """x and the nodes of sqrt(2 / pi) * (x + 0.044715 * x^3) read by `tanh`."""
    outer = graph.producer(tanh.inputs[0])
    inner = graph.producer(_scaled_by(graph, outer, math.sqrt(2 / math.pi)) or "")
    if outer is None or inner is None or inner.op != "Add":
        return None
    for x, cube_term in (inner.inputs, inner.inputs[::-1]):
        scaled = graph.producer(cube_term)
        cube = graph.producer(_scaled_by(graph, scaled, 0.044715) or "")
        if scaled is None or cube is None:
            continue
        nodes = [outer, inner, scaled, cube]
        if cube.op == "Pow" and cube.inputs[0] == x and scalar(graph, cube.inputs[1], 3.0):
            return x, nodes
        square = graph.producer(_other(cube, x) or "") if cube.op == "Mul" else None
        if square is not None and square.op == "Mul" and square.inputs == [x, x]:
            return x, nodes + [square]
    return None


def _fuse_gelu(graph: Graph) -> None:
    for core in [n for n in graph.nodes if n.op in ("Erf", "Tanh")]:
        found: tuple[str, list[Node]] | None
        if core.op == "Erf":
            scaled = graph.producer(core.inputs[0])
            x = _scaled_by(graph, scaled, 1 / math.sqrt(2))
            found = (x, [scaled]) if x is not None and scaled is not None else None
        else:
            found = _tanh_argument(graph, core)
        if found is None:
            continue
        x, head = found
        tail = _gelu_tail(graph, core, x)
        inner = head + [core] + (tail or [])[:-1]
        if tail is None or not _internal(graph, inner):
            continue
        last = tail[-1]
        for n in inner:
            graph.nodes.remove(n)
        approximate = "none" if core.op == "Erf" else "tanh"
        last.op, last.inputs, last.attrs = "Gelu", [x], {"approximate": approximate}
        graph.fused[f"Gelu({approximate})"] += 1


def _reduce_axes(graph: Graph, node: Node | None) -> list[int] | None:
    """The axes of a ReduceMean that keeps its dims (attribute, or opset 18's input)."""
    if node is None or node.op != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return None
    axes = node.attrs.get("axes") if len(node.inputs) < 2 else graph.consts.get(node.inputs[1])
    return None if axes is None else [int(a) for a in np.reshape(axes, -1)]


_DEVIATION = Op("Sub", (Tensor("x"), Op("ReduceMean", (Tensor("x"),), "mean")), "sub")
_SQUARE = AnyOf((Op("Pow", (Tensor("sub"), Const("two", 2.0)), "square"),
                 Op("Mul", (Tensor("sub"), Tensor("sub")), "square")))
_VARIANCE = Op("Add", (Op("ReduceMean", (_SQUARE,), "var"), Const("eps")), "add_eps",
               either_order=True)
# Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))) with d = Sub(x, ReduceMean(x)).
LAYER_NORM = Op("Div", (_DEVIATION, Op("Sqrt", (_VARIANCE,), "sqrt")))
# Add(Mul(Reshape(InstanceNormalization(Reshape(x, target), s, b), Shape(x)), w), beta).
GROUP_NORM = Op("Add", (Op("Mul", (Op("Reshape", (
    Op("InstanceNormalization", (Op("Reshape", (Tensor("x"), Const("target")), "first"),
                                 Const("s"), Const("b")), "norm"),
    Op("Shape", (Tensor("x"),), "shape")), "back"), Const("w")), "mul", either_order=True),
    Const("beta")), either_order=True)


def _fuse_layer_norm(graph: Graph) -> None:
    """LAYER_NORM, its ReduceMeans over the same axes, then optionally Mul by a constant scale
    and Add a constant bias."""
    for div in [n for n in graph.nodes if n.op == "Div"]:
        m = match(graph, LAYER_NORM, div)
        if m is None:
            continue
        found, eps = m.nodes, graph.consts[m.tensors["eps"]]
        axes = _reduce_axes(graph, found["mean"])
        if eps.size != 1 or axes is None or _reduce_axes(graph, found["var"]) != axes \
                or not _internal(graph, [found[k] for k in ("mean", "square", "var", "add_eps",
                                                            "sqrt")]) \
                or {n.name for n in graph.consumers(m.tensors["sub"])} != {
                    found["square"].name, div.name}:
            continue
        scale_bias, affine, last = _affine_after(graph, div)
        for n in [*found.values(), *affine]:
            graph.nodes.remove(n)
        last.op, last.inputs = "LayerNormalization", [m.tensors["x"], *scale_bias]
        last.attrs, last.reduce_axes = {"epsilon": float(eps.reshape(-1)[0])}, axes
        graph.fused["LayerNormalization(decomposed)"] += 1


def _affine_after(graph: Graph, node: Node) -> tuple[list[str], list[Node], Node]:
    """The constants of a Mul and then an Add by constants after `node` (either, both or none),
    the nodes before the last one, and the last (`node` where there is none)."""
    operands: list[str] = []
    passed: list[Node] = []
    last = node
    for op in ("Mul", "Add"):
        after = graph.sole_consumer(last)
        k = _other(after, last.outputs[0]) if after is not None and after.op == op else None
        if after is None or k is None or k not in graph.consts:
            break
        operands.append(k)
        passed.append(last)
        last = after
    return operands, passed, last


def _fuse_group_norm(graph: Graph) -> None:
    """GROUP_NORM with target [0, groups, -1], a scale s and bias b per group and w and beta
    per channel (shape (c, 1, ...)): one GroupNormalization with scale w s and bias
    w b + beta per channel. `channel_rank`: x's, where w is per channel; the lowering checks
    it."""
    c = graph.consts
    for add in [n for n in graph.nodes if n.op == "Add"]:
        m = match(graph, GROUP_NORM, add)
        if m is None:
            continue
        found, t = m.nodes, {k: c[v] for k, v in m.tensors.items() if v in c}
        groups = t["s"].size
        if not _internal(graph, [found[k] for k in ("first", "norm", "back", "mul")]) \
                or found["shape"].attrs or not _group_constants(t, groups):
            continue
        scale, bias = f"{add.name}:group_scale", f"{add.name}:group_bias"
        per_group = t["w"].size // groups
        s, b = (np.repeat(t[k].astype(np.float64).reshape(-1), per_group) for k in "sb")
        w64 = t["w"].astype(np.float64).reshape(-1)
        c[scale] = (w64 * s).astype(np.float32)
        c[bias] = (w64 * b + t["beta"].astype(np.float64).reshape(-1)).astype(np.float32)
        shape = found.pop("shape")
        for n in found.values():
            graph.nodes.remove(n)
        if not graph.consumers(shape.outputs[0]):
            graph.nodes.remove(shape)
        add.op, add.inputs = "GroupNormalization", [m.tensors["x"], scale, bias]
        add.attrs = {"num_groups": groups,
                     "epsilon": found["norm"].attrs.get("epsilon", 1e-5)}
        add.channel_rank = t["w"].ndim + 1
        graph.fused["GroupNormalization(Reshape, InstanceNormalization, Mul, Add)"] += 1


def _group_constants(t: dict[str, np.ndarray], groups: int) -> bool:
    """The Reshape's target is [0, groups, -1]; w is per channel (c, 1, ...) and beta per
    channel (its shape) or a scalar."""
    w, beta = t["w"], t["beta"]
    return [int(v) for v in t["target"]] == [0, groups, -1] and w.ndim >= 2 \
        and w.size == w.shape[0] and not w.size % groups and beta.size in (1, w.size) \
        and (beta.size == 1 or beta.shape == w.shape)


def _einsum_as_matmul(graph: Graph) -> None:
    """Each Einsum whose equation needs no ranks (no `...`) that einsum_as_matmul takes, as
    its nodes; the others are left to the lowering, which knows the ranks."""
    for node in [n for n in graph.nodes if n.op == "Einsum"]:
        equation = node.attrs.get("equation", "")
        nodes = None if "..." in equation else einsum_as_matmul(
            node, explicit(equation, ()), graph.consts, graph.opset)
        if nodes is not None:
            at = graph.nodes.index(node)
            graph.nodes[at:at + 1] = nodes
            graph.fused["Einsum->MatMul"] += 1


@dataclass(frozen=True)
class _Letters:
    """An explicit equation "a,b->out" whose operands are (batch, rows, k) and
    (batch, k, column) up to order."""
    a: str
    b: str
    out: str
    batch: list[str]
    rows: list[str]
    k: str
    column: str


def _matmul_letters(equation: str) -> _Letters | None:
    lhs, _, out = equation.partition("->")
    a, _, b = lhs.partition(",")
    summed = [c for c in a if c in b and c not in out]
    batch = [c for c in out if c in a and c in b]
    rows = [c for c in out if c in a and c not in b]
    column = [c for c in out if c in b and c not in a]
    if any(len(set(t)) != len(t) for t in (a, b, out)) or len(summed) != 1 \
            or len(column) != 1 or not rows:
        return None
    letters = _Letters(a, b, out, batch, rows, summed[0], column[0])
    orders = ((a, batch + rows + summed), (b, batch + summed + column),
              (out, batch + rows + column))
    return letters if all(sorted(t) == sorted(o) for t, o in orders) else None


def einsum_as_matmul(node: Node, equation: str, consts: dict, opset: int) -> list[Node] | None:
    """The nodes that compute Einsum `node` of explicit `equation` (einsum_equation.explicit)
    as a MatMul, None where it is not a batched matrix product: two operands, one letter k
    summed (in both, not in the output), one column letter (in the second operand and the
    output), the others in the output: batch letters in both operands, row letters in the first
    only. The operands are transposed to (batch, rows, k) and (batch, k, column), the second
    given a 1 for each row letter but the last (numpy's broadcasting of MatMul's batch axes;
    its axes go into `consts` from opset 13), and the product transposed to the output's order:
    MaxViT's "BGHID,BGHJD->BGHIJ" transposes only its second operand, MViTv2's relative
    positions "byhwc,hkc->byhwk" all three."""
    t = _matmul_letters(equation)
    if len(node.inputs) != 2 or t is None:
        return None
    nodes: list[Node] = []

    def add(op: str, source: str, attrs: dict, extra: Sequence[str] = ()) -> str:
        name = f"{node.name}:{op.lower()}{len(nodes)}"
        nodes.append(Node(op, name, [source, *extra], [name], attrs))
        return name

    operands = []
    for source, letters, order in ((node.inputs[0], t.a, t.batch + t.rows + [t.k]),
                                   (node.inputs[1], t.b, t.batch + [t.k, t.column])):
        if list(letters) != order:
            source = add("Transpose", source, {"perm": [letters.index(c) for c in order]})
        operands.append(source)
    if len(t.rows) > 1:  # a 1 for each row letter but the last: they broadcast
        axes = list(range(len(t.batch), len(t.batch) + len(t.rows) - 1))
        if opset < 13:
            operands[1] = add("Unsqueeze", operands[1], {"axes": axes})
        else:
            consts[f"{node.name}:axes"] = np.array(axes, np.int64)
            operands[1] = add("Unsqueeze", operands[1], {}, [f"{node.name}:axes"])
    product = t.batch + t.rows + [t.column]
    if product == list(t.out):
        return [*nodes, Node("MatMul", node.name, operands, node.outputs)]
    return [*nodes, Node("MatMul", node.name, operands, [f"{node.name}:product"]),
            Node("Transpose", f"{node.name}:to_output", [f"{node.name}:product"], node.outputs,
                 {"perm": [product.index(c) for c in t.out]})]
