"""Compiles a graph for one batch size into a launch list: shapes are inferred and constant
subgraphs folded with that batch size, each remaining node becomes one or two kernel launches
on named buffers (`Ref`) by its op's entry in LOWERINGS, and reshapes become aliases of their
input's buffer."""

from __future__ import annotations

from accelerators.einsum_equation import explicit
from accelerators.onnx_folding import SHAPE_READERS, host_inputs
from accelerators.opencl import (
    conv_lowering,
    elementwise_lowering,
    fusions,
    layout_lowering,
    matmul_lowering,
    norm_lowering,
    pool_lowering,
    quant_lowering,
    recurrent_lowering,
)
from accelerators.opencl.host_ops import evaluate, view_shape
from accelerators.opencl.ir import Graph, Node, UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.launch import Build, Dyn, Lowered, Samples
from accelerators.opencl.lowering_state import Lowering, OpLowering

VIEWS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze")  # aliases of their input's buffer


def _einsum(lw: Lowering, node: Node, args: list) -> None:
    """An Einsum that load left: with `...`, spelt out now that its operands' ranks are known
    and lowered as the nodes fusions.einsum_as_matmul makes of it; any other kind is refused."""
    equation = node.attrs.get("equation", "")
    try:
        spelt = explicit(equation, [len(a.shape) for a in args if a is not None])
    except ValueError as e:
        raise UnsupportedModelError(f"node {node.name!r}: {e}") from None
    nodes = fusions.einsum_as_matmul(node, spelt, lw.values, lw.graph.opset)
    if nodes is None:
        raise UnsupportedOpError(
            f"op 'Einsum' (domain 'ai.onnx', opset {lw.graph.opset}) of node {node.name!r}, "
            f"equation {equation!r}: the OpenCL engine runs an Einsum only as a batched matrix "
            "product (one letter summed, one column letter)")
    for part in nodes:
        _lower_node(lw, part, LOWERINGS, None)


LOWERINGS: dict[str, OpLowering] = {
    "Conv": conv_lowering.conv,
    "ConvTranspose": conv_lowering.conv_transpose,
    "Gemm": matmul_lowering.gemm,
    "MatMul": matmul_lowering.matmul,
    "FakeQuant": quant_lowering.fake_quant,
    "MaxPool": pool_lowering.max_pool,
    "AveragePool": pool_lowering.average_pool,
    "GlobalAveragePool": pool_lowering.global_average_pool,
    "ReduceMean": pool_lowering.reduce_mean,
    "LRN": pool_lowering.lrn,
    **dict.fromkeys(("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
                     "Silu"), elementwise_lowering.activation),
    "Gelu": elementwise_lowering.gelu,
    "BatchNormalization": elementwise_lowering.batch_normalization,
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "PRelu"),
                    elementwise_lowering.binary),
    **dict.fromkeys(("Neg", "Sqrt", "Reciprocal", "Erf", "Tanh", "Exp", "Abs", "Log",
                     "Softplus", "Mish"), elementwise_lowering.unary),
    "Pow": elementwise_lowering.power,
    "LayerNormalization": norm_lowering.layer_normalization,
    "InstanceNormalization": norm_lowering.instance_normalization,
    "GroupNormalization": norm_lowering.group_normalization,
    **dict.fromkeys(("ReduceSum", "ReduceL2", "ReduceMax"), norm_lowering.reduce_rows),
    "Softmax": norm_lowering.softmax,
    "Resize": norm_lowering.resize,
    "Transpose": layout_lowering.transpose,
    "Slice": layout_lowering.slice_tensor,
    "Split": layout_lowering.split,
    "Expand": layout_lowering.expand,
    "Tile": layout_lowering.tile,
    "Cast": layout_lowering.cast,
    "Gather": layout_lowering.gather,
    "Pad": layout_lowering.pad,
    "Concat": layout_lowering.concat,
    **dict.fromkeys(("LSTM", "GRU", "RNN"), recurrent_lowering.recurrent),
    "Einsum": _einsum,
}


def lower(graph: Graph, batch: int, build: Build = Build(), samples: Samples | None = None,
          table: dict[str, OpLowering] = LOWERINGS, fallback: OpLowering | None = None
          ) -> Lowered:
    """`build.tiling`: GEMMs and convolutions staged through local memory in tiles of that size
    (GPUs) instead of the register tiles that suit CPUs. `build.half`: tensors
    and float weights stored as fp16. `samples`: each input's shape after the batch axis, where
    the graph leaves dims variable (a request's shape); by default the graph's. `table`: the
    lowering of each op (the FPGA pipeline has its own); `fallback`: of an op the table lacks,
    which is otherwise refused."""
    lw = Lowering(graph, build, batch, Lowered(dtype=build.dtype), dict(graph.consts))
    for name, dims in graph.inputs:
        sample = samples.get(name) if samples else None
        shape = tuple(batch if d == -1 else d for d in dims) if sample is None else (
            batch if dims[0] == -1 else dims[0], *sample)
        lw.values[name] = lw.out.inputs[name] = lw.new(name, shape)
    for node in graph.nodes:
        if node.name in lw.done:
            continue
        try:
            _lower_node(lw, node, table, fallback)
        except UnsupportedModelError:
            raise
        except Exception as e:  # a shape a lowering cannot take (size 0 or 1, say): refused
            shapes = [list(lw.values[i].shape) for i in node.inputs
                      if isinstance(lw.values.get(i), Dyn)]
            raise UnsupportedModelError(
                f"op {node.op!r} of node {node.name!r} (opset {graph.opset}) cannot be planned "
                f"at input shapes {shapes}: {type(e).__name__}: {e}") from e
    for name, _ in graph.outputs:
        value = lw.values[name]
        if not isinstance(value, Dyn):
            raise UnsupportedModelError(f"graph output {name!r} is a constant")
        lw.out.outputs[name] = value
    return lw.out


def _lower_node(lw: Lowering, node: Node, table: dict[str, OpLowering],
                fallback: OpLowering | None) -> None:
    args = [lw.values.get(i) if i else None for i in node.inputs]
    missing = [i for i, v in zip(node.inputs, args) if i and v is None]
    if missing:
        raise UnsupportedModelError(f"node {node.name!r} reads unknown {missing}")
    x = args[0] if args else None
    host = host_inputs(node.op, "", args)  # the rule the FLOP counter shares (onnx_folding)
    if host is not None:
        if node.op in SHAPE_READERS and isinstance(x, Dyn):
            lw.per_batch.update(node.outputs)
        _fold(lw, node, host)
    elif node.op in VIEWS and isinstance(x, Dyn):
        shape = view_shape(node, x.shape, args[1:], lw.graph.opset)
        lw.values[node.outputs[0]] = Dyn(shape, x.storage)
    elif node.op in table:
        table[node.op](lw, node, args)
    elif fallback is not None:
        fallback(lw, node, args)
    else:
        raise UnsupportedOpError(
            f"op {node.op!r} (domain 'ai.onnx', opset {lw.graph.opset}) of node {node.name!r} "
            "is not an op of the OpenCL engine on activations (only where its inputs are "
            "constants or shapes)")


def _fold(lw: Lowering, node: Node, args: list) -> None:
    """A node whose inputs are all known on the host (constants, shapes) becomes constants,
    its fused activation applied."""
    outs = evaluate(node, args, lw.graph.opset)
    act = node.activation
    if act is not None:
        act_args: list = [outs[0]] + [lw.values.get(i) if i else None for i in act.inputs[1:]]
        outs[0] = evaluate(act, act_args, lw.graph.opset)[0]
    lw.values.update(zip(node.outputs, outs))
    if lw.per_batch.intersection(node.inputs):
        lw.per_batch.update(node.outputs)
