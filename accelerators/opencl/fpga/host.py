"""Nodes an FPGA's pipeline does not cover (residual Adds, global pools, Softmax, activations
without an FPGA epilogue, ...), computed on the host between the pipeline's layers: their output
shapes when a plan is lowered (ONNX's shape inference, without computing), and their values
when it runs (ONNX's reference evaluator, or numpy for the engine's own ops)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from accelerators.onnx_nodes import run_node
from accelerators.opencl.ir import Grid, Node, UnsupportedModelError

GELU_OPSET = 20  # the first opset with Gelu, which the fusions may write into older models


def fake_quant(x: np.ndarray, grid: Grid) -> np.ndarray:
    """x rounded onto its int8 grid (ONNX's round half to even, saturation), as floats."""
    q = np.clip(np.rint(x / np.float32(grid.scale)) + grid.zero, grid.lo, grid.hi)
    return ((q - grid.zero) * np.float32(grid.scale)).astype(np.float32)


def _proto(node: Node, names: list[str]) -> onnx.NodeProto:
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
             for k, v in node.attrs.items()}
    return helper.make_node(node.op, names, list(node.outputs), **attrs)


def _own(node: Node) -> bool:
    """The engine's own ops, which keep their input's shape."""
    return node.op in ("FakeQuant", "Silu", "Gelu")


def output_shapes(node: Node, inputs: list[tuple[int, ...] | np.ndarray | None],
                  opset: int) -> list[tuple[int, ...]]:
    """Each output's shape, from the inputs' shapes (activations) and values (constants)."""
    if _own(node):
        first = inputs[0]
        return [tuple(first.shape) if isinstance(first, np.ndarray) else first or ()]
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    typed = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(v))
             for name, v in zip(names, inputs) if v is not None and not isinstance(v, np.ndarray)]
    consts = [numpy_helper.from_array(v, name) for name, v in zip(names, inputs)
              if isinstance(v, np.ndarray)]
    graph = helper.make_graph([_proto(node, names)], "node", typed,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in node.outputs],
                              consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output
        shapes = [tuple(d.dim_value if d.HasField("dim_value") else -1
                        for d in o.type.tensor_type.shape.dim) for o in inferred]
    except Exception as e:  # onnx's inference errors have no common base
        raise UnsupportedModelError(f"op {node.op!r} of node {node.name!r}: its output shape "
                                    f"cannot be inferred for the host: {e}") from e
    if any(-1 in s for s in shapes) or len(shapes) != len(node.outputs):
        raise UnsupportedModelError(f"op {node.op!r} of node {node.name!r}: its output shape "
                                    f"depends on its values; the FPGA's host cannot plan it")
    return shapes


def run(node: Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """The node's named outputs as float32, its engine attributes applied: the input rounded
    onto its grid (`quant_in`) and the output's rounding (`requant`). A fused activation is a
    step of its own (lowering.py)."""
    x = inputs[0]
    grid_in: Grid | None = node.quant_in
    if grid_in is not None and x is not None:
        inputs = [fake_quant(x, grid_in), *inputs[1:]]
    if node.op == "FakeQuant" and x is not None and node.grid is not None:
        outs = [fake_quant(x, node.grid)]
    elif node.op == "Silu" and x is not None:
        outs = [x / (1 + np.exp(-x))]
    elif node.op == "MatMul" and len(inputs) > 2:  # with the bias row graph.py fused in
        a, b, bias = (np.asarray(v) for v in inputs[:3])
        outs = [a @ b + bias]
    elif node.op == "BatchNormalization" and x is not None:
        # Inference form, by hand: onnx 1.23's reference evaluator is wrong below opset 15
        # (0.15 off on unit-normal inputs).
        scale, bias, mean, var = (np.asarray(a, np.float32).reshape(-1, *[1] * (x.ndim - 2))
                                  for a in inputs[1:5])
        outs = [(x - mean) / np.sqrt(var + np.float32(node.attrs.get("epsilon", 1e-5))) * scale
                + bias]
    else:
        names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
        outs = run_node(_proto(node, names), inputs,
                        max(opset, GELU_OPSET) if node.op == "Gelu" else opset)
    requant: Grid | None = node.requant
    if requant is not None:
        outs[0] = fake_quant(outs[0], requant)
    # Those the model reads: an omitted optional output (an empty name) has no tensor.
    return [np.asarray(o, np.float32) for o, name in zip(outs, node.outputs) if name]
