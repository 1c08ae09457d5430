"""Compiles a graph for one batch size into a launch list: shapes are inferred and constant
subgraphs folded with that batch size, each remaining node becomes one or two kernel launches
on named buffers (`Ref`) by its op's entry in LOWERINGS for the model's opset (an op's
lowerings keyed by the first opset each covers), and reshapes become aliases of their input's
buffer (view_lowering.py)."""

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
from accelerators.opencl.host_ops import evaluate
from accelerators.opencl.ir import Graph, Node, UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.launch import Build, Dyn, Lowered, Samples
from accelerators.opencl.lowering_state import Lowering, OpLowering, Table, always
from accelerators.opencl.view_lowering import VIEWS


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


_REDUCE_ROWS = ((1, norm_lowering.reduce_rows), (18, norm_lowering.reduce_rows_by_input))
LOWERINGS: Table = {
    "Conv": always(conv_lowering.conv),
    "ConvTranspose": always(conv_lowering.conv_transpose),
    "Gemm": always(matmul_lowering.gemm),
    "MatMul": always(matmul_lowering.matmul),
    "FakeQuant": always(quant_lowering.fake_quant),
    "MaxPool": always(pool_lowering.max_pool),
    "AveragePool": always(pool_lowering.average_pool),
    "GlobalAveragePool": always(pool_lowering.global_average_pool),
    "ReduceMean": ((1, pool_lowering.reduce_mean), (18, pool_lowering.reduce_mean_by_input)),
    "LRN": always(pool_lowering.lrn),
    **dict.fromkeys(("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
                     "Silu"), always(elementwise_lowering.activation)),
    "Gelu": always(elementwise_lowering.gelu),
    "BatchNormalization": always(elementwise_lowering.batch_normalization),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "PRelu"),
                    always(elementwise_lowering.binary)),
    **dict.fromkeys(("Neg", "Sqrt", "Reciprocal", "Erf", "Tanh", "Exp", "Abs", "Log",
                     "Softplus", "Mish"), always(elementwise_lowering.unary)),
    "Pow": always(elementwise_lowering.power),
    "LayerNormalization": always(norm_lowering.layer_normalization),
    "InstanceNormalization": always(norm_lowering.instance_normalization),
    "GroupNormalization": always(norm_lowering.group_normalization),
    "ReduceSum": ((1, norm_lowering.reduce_rows), (13, norm_lowering.reduce_rows_by_input)),
    **dict.fromkeys(("ReduceL2", "ReduceMax"), _REDUCE_ROWS),
    "Softmax": ((1, norm_lowering.softmax_coerced), (13, norm_lowering.softmax)),
    "Resize": ((11, norm_lowering.resize),),
    "Transpose": always(layout_lowering.transpose),
    "Slice": ((1, layout_lowering.slice_by_attributes), (10, layout_lowering.slice_by_inputs)),
    "Split": ((1, layout_lowering.split), (13, layout_lowering.split_by_input),
              (18, layout_lowering.split_into_num_outputs)),
    "Expand": always(layout_lowering.expand),
    "Tile": always(layout_lowering.tile),
    "Cast": always(layout_lowering.cast),
    "Gather": always(layout_lowering.gather),
    "Pad": ((1, layout_lowering.pad_by_attributes), (11, layout_lowering.pad)),
    "Concat": always(layout_lowering.concat),
    **dict.fromkeys(("LSTM", "GRU", "RNN"), always(recurrent_lowering.recurrent)),
    "Einsum": always(_einsum),
    **VIEWS,
}


def lower(graph: Graph, batch: int, build: Build = Build(), samples: Samples | None = None,
          table: Table = LOWERINGS, fallback: OpLowering | None = None
          ) -> Lowered:
    """`build.tiling`: GEMMs and convolutions staged through local memory in tiles of that size
    (GPUs) instead of the register tiles that suit CPUs. `build.half`: tensors
    and float weights stored as fp16. `samples`: each input's shape after the batch axis, where
    the graph leaves dims variable (a request's shape); by default the graph's. `table`: the
    lowerings of each op by opset (the FPGA pipeline has its own); `fallback`: of an op the
    table lacks, which is otherwise refused."""
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


def _lower_node(lw: Lowering, node: Node, table: Table, fallback: OpLowering | None) -> None:
    args = [lw.values.get(i) if i else None for i in node.inputs]
    missing = [i for i, v in zip(node.inputs, args) if i and v is None]
    if missing:
        raise UnsupportedModelError(f"node {node.name!r} reads unknown {missing}")
    host = host_inputs(node.op, "", args)  # the rule the FLOP counter shares (onnx_folding)
    if host is None:
        _lowering(table, fallback, node, lw.graph.opset)(lw, node, args)
        return
    if node.op in SHAPE_READERS and args and isinstance(args[0], Dyn):
        lw.per_batch.update(node.outputs)
    _fold(lw, node, host)


def _lowering(table: Table, fallback: OpLowering | None, node: Node, opset: int
              ) -> OpLowering:
    """The lowering of `node` at `opset`: the table's last entry at or below it."""
    versions = table.get(node.op)
    if versions is None and fallback is not None:
        return fallback
    if versions is None:
        raise UnsupportedOpError(
            f"op {node.op!r} (domain 'ai.onnx', opset {opset}) of node {node.name!r} "
            "is not an op of the OpenCL engine on activations (only where its inputs are "
            "constants or shapes)")
    covering = [lowering for since, lowering in versions if since <= opset]
    if not covering:
        raise UnsupportedOpError(
            f"op {node.op!r} (domain 'ai.onnx', opset {opset}) of node {node.name!r}: the "
            f"OpenCL engine lowers it from opset {versions[0][0]} on")
    return covering[-1]


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
