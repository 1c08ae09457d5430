"""Patterns that exporters spell as several ops, recognised at load and rewritten into one op:
GELU in its exact form (x * (1 + erf(x / sqrt 2)) * 0.5, torch's export before opset 20) and its
tanh form become `Gelu` (ONNX opset 20's op, then fused like the other activations);
LayerNormalization decomposed into ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add (as
exporters emit it before opset 17) becomes one `LayerNormalization`; GroupNorm as torch exports
it (Reshape, InstanceNormalization, Reshape, Mul, Add) one `GroupNormalization`. An Einsum that
is a batched matrix product (MaxViT's attention: "BGHID,BGHJD->BGHIJ") becomes a MatMul, with
the Transposes (and an Unsqueeze) that bring its letters into MatMul's order; one with `...` is
rewritten the same way by the lowering, which knows its operands' ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from accelerators.einsum_equation import explicit
from accelerators.opencl.ir import Graph, Node

_TOL = 1e-4  # constants of the patterns as exporters round them (1.4142135, 0.044715, ...)


def fuse_patterns(graph: Graph) -> None:
    _fuse_gelu(graph)
    _fuse_layer_norm(graph)
    _fuse_group_norm(graph)
    _einsum_as_matmul(graph)


def _scalar(graph: Graph, name: str, value: float) -> bool:
    """`name` is a constant holding one value close to `value`."""
    c = graph.consts.get(name)
    return c is not None and c.size == 1 and abs(float(c.reshape(-1)[0]) - value) <= _TOL * max(
        1.0, abs(value))


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
            if _scalar(graph, k, value):
                return x
    if node.op == "Div" and _scalar(graph, node.inputs[1], 1 / value):
        return node.inputs[0]
    return None


def _gelu_tail(graph: Graph, core: Node, x: str) -> list[Node] | None:
    """The nodes after erf or tanh: Add(core, 1), then Mul by x and by 0.5 in either order
    (x * (1 + core) * 0.5 or (x * 0.5) * (1 + core)); the last one's output is the GELU's."""
    add = graph.sole_consumer(core)
    if add is None or add.op != "Add" or not _scalar(graph, _other(add, core.outputs[0]) or "",
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
        if cube.op == "Pow" and cube.inputs[0] == x and _scalar(graph, cube.inputs[1], 3.0):
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


def _fuse_layer_norm(graph: Graph) -> None:
    """Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))) with d = Sub(x, ReduceMean(x)) over the same
    axes, then optionally Mul by a constant scale and Add a constant bias."""
    for div in [n for n in graph.nodes if n.op == "Div"]:
        sub, sqrt = graph.producer(div.inputs[0]), graph.producer(div.inputs[1])
        if sub is None or sub.op != "Sub" or sqrt is None or sqrt.op != "Sqrt":
            continue
        x, d = sub.inputs[0], sub.outputs[0]
        mean = graph.producer(sub.inputs[1])
        add_eps = graph.producer(sqrt.inputs[0])
        if add_eps is None or add_eps.op != "Add" or mean is None or mean.inputs[0] != x:
            continue
        eps_name = next((k for k in add_eps.inputs if k in graph.consts), "")
        eps = graph.consts.get(eps_name)
        var = graph.producer(_other(add_eps, eps_name) or "")
        square = graph.producer(var.inputs[0]) if var is not None else None
        axes = _reduce_axes(graph, mean)
        if eps is None or eps.size != 1 or var is None or square is None or axes is None \
                or _reduce_axes(graph, var) != axes or not (
                    square.op == "Pow" and square.inputs[0] == d
                    and _scalar(graph, square.inputs[1], 2.0)
                    or square.op == "Mul" and square.inputs == [d, d]):
            continue
        inner = [mean, sub, square, var, add_eps, sqrt]
        if not _internal(graph, [mean, square, var, add_eps, sqrt]) \
                or {n.name for n in graph.consumers(d)} != {square.name, div.name}:
            continue
        inputs, last = [x], div
        for op in ("Mul", "Add"):  # the affine part, where its operand is a constant
            after = graph.sole_consumer(last)
            k = _other(after, last.outputs[0]) if after is not None and after.op == op else None
            if after is None or k is None or k not in graph.consts:
                break
            inputs.append(k)
            inner.append(last)
            last = after
        for n in inner:
            graph.nodes.remove(n)
        last.op, last.inputs = "LayerNormalization", inputs
        last.attrs, last.reduce_axes = {"epsilon": float(eps.reshape(-1)[0])}, axes
        graph.fused["LayerNormalization(decomposed)"] += 1


def _fuse_group_norm(graph: Graph) -> None:
    """Reshape(x, [0, groups, -1]), InstanceNormalization (scale s and bias b per group),
    Reshape(Shape(x)), Mul(w) and Add(beta) per channel (shape (c, 1, ...)): one
    GroupNormalization with scale w s and bias w b + beta per channel. `rank`: x's, where w
    is per channel; the lowering checks it."""
    c = graph.consts
    for norm in [n for n in graph.nodes if n.op == "InstanceNormalization"]:
        first, back = graph.producer(norm.inputs[0]), graph.sole_consumer(norm)
        mul = graph.sole_consumer(back) if back is not None else None
        add = graph.sole_consumer(mul) if mul is not None else None
        if first is None or first.op != "Reshape" or back is None or back.op != "Reshape" \
                or mul is None or mul.op != "Mul" or add is None or add.op != "Add" \
                or not _internal(graph, [first]) or not all(i in c for i in norm.inputs[1:3]):
            continue
        x, target, shape = first.inputs[0], c.get(first.inputs[1]), graph.producer(back.inputs[1])
        w = c.get(_other(mul, back.outputs[0]) or "")
        beta = c.get(_other(add, mul.outputs[0]) or "")
        groups = c[norm.inputs[1]].size
        if target is None or [int(t) for t in target] != [0, groups, -1] or shape is None \
                or shape.op != "Shape" or shape.inputs != [x] or shape.attrs or w is None \
                or beta is None or w.ndim < 2 or w.size != w.shape[0] or w.size % groups \
                or beta.size not in (1, w.size) or beta.size > 1 and beta.shape != w.shape:
            continue
        per_group = w.size // groups
        s, b = (np.repeat(c[i].astype(np.float64).reshape(-1), per_group) for i in norm.inputs[1:3])
        w64 = w.astype(np.float64).reshape(-1)
        scale, bias = f"{add.name}:group_scale", f"{add.name}:group_bias"
        c[scale] = (w64 * s).astype(np.float32)
        c[bias] = (w64 * b + beta.astype(np.float64).reshape(-1)).astype(np.float32)
        for n in (first, norm, back, mul) + ((shape,) if len(graph.consumers(
                shape.outputs[0])) == 1 else ()):
            graph.nodes.remove(n)
        add.op, add.inputs = "GroupNormalization", [x, scale, bias]
        add.attrs = {"num_groups": groups, "epsilon": norm.attrs.get("epsilon", 1e-5)}
        add.channel_rank = w.ndim + 1
        graph.fused["GroupNormalization(Reshape, InstanceNormalization, Mul, Add)"] += 1


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
    lhs, _, out = equation.partition("->")
    a, _, b = lhs.partition(",")
    summed = [c for c in a if c in b and c not in out]
    batch = [c for c in out if c in a and c in b]
    rows = [c for c in out if c in a and c not in b]
    column = [c for c in out if c in b and c not in a]
    if len(node.inputs) != 2 or any(len(set(t)) != len(t) for t in (a, b, out)) \
            or len(summed) != 1 or len(column) != 1 or not rows \
            or sorted(a) != sorted(batch + rows + summed) \
            or sorted(b) != sorted(batch + summed + column) \
            or sorted(out) != sorted(batch + rows + column):
        return None
    nodes: list[Node] = []

    def add(op: str, source: str, attrs: dict, extra: Sequence[str] = ()) -> str:
        name = f"{node.name}:{op.lower()}{len(nodes)}"
        nodes.append(Node(op, name, [source, *extra], [name], attrs))
        return name

    operands = []
    for source, letters, order in ((node.inputs[0], a, batch + rows + summed),
                                   (node.inputs[1], b, batch + summed + column)):
        if list(letters) != order:
            source = add("Transpose", source, {"perm": [letters.index(c) for c in order]})
        operands.append(source)
    if len(rows) > 1:  # a 1 for each row letter but the last: they broadcast
        axes = list(range(len(batch), len(batch) + len(rows) - 1))
        if opset < 13:
            operands[1] = add("Unsqueeze", operands[1], {"axes": axes})
        else:
            consts[f"{node.name}:axes"] = np.array(axes, np.int64)
            operands[1] = add("Unsqueeze", operands[1], {}, [f"{node.name}:axes"])
    product = batch + rows + column
    if product == list(out):
        return [*nodes, Node("MatMul", node.name, operands, node.outputs)]
    return [*nodes, Node("MatMul", node.name, operands, [f"{node.name}:product"]),
            Node("Transpose", f"{node.name}:to_output", [f"{node.name}:product"], node.outputs,
                 {"perm": [product.index(c) for c in out]})]
