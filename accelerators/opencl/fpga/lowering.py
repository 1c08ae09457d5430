"""A model on an FPGA: each Conv, Gemm and MatMul of an activation by a constant matrix becomes
one pass of the pipeline (kernels/fpga/pipeline.cl: read -> conv -> pool -> write, one launch
per stage, each on its own queue), with a following MaxPool fused into its pool stage; a fully
connected layer is a 1x1 convolution of a 1x1 image. Every other node, and a layer the board's
buffers cannot hold, is computed on the host (host.py); why is kept in `Lowered.on_host`, which
the engine logs once per model."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from accelerators.opencl.fpga import host
from accelerators.opencl.host_ops import window
from accelerators.opencl.ir import Graph, Grid, Node, UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.launch import (
    HOST,
    Build,
    Dyn,
    HostStep,
    Launch,
    Lowered,
    Pipeline,
    Ref,
    Samples,
    activation_args,
    ints,
)
from accelerators.opencl.lowering import lower
from accelerators.opencl.lowering_state import Lowering, Table, always
from accelerators.opencl.qdq import Int8Weight
from accelerators.opencl.recurrent_lowering import check_attributes
from accelerators.opencl.view_lowering import VIEWS

STAGES = ("fpga_read", "fpga_conv", "fpga_pool", "fpga_write")  # Launch.stage 1 to 4
# fpga_read's integer arguments after the input, and fpga_pool's: the one spelling the lowering
# writes and the hardware model (estimate.py) reads.
READ_ARGS = ("n", "groups", "blocks", "c", "cv", "c_total", "h", "w", "oh", "ow", "kh", "kw",
             "sh", "sw", "ph", "pw", "ring")
POOL_ARGS = ("planes", "oh", "ow", "pk", "ps", "pp", "poh", "pow")


def lower_fpga(graph: Graph, batch: int, build: Build, samples: Samples | None = None
               ) -> Lowered:
    return lower(graph, batch, build, samples, _TABLE, host_node)


@dataclass(frozen=True)
class Layer:
    """One pass of the pipeline: `groups` groups of c -> m channels over an h x w input."""
    n: int
    groups: int
    c: int
    h: int
    w: int
    m: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    oh: int = 1
    ow: int = 1


@dataclass(frozen=True)
class Pool:
    """A MaxPool fused into a pass's pool stage."""
    k: int
    s: int
    p: int
    oh: int
    ow: int
    output: str  # the MaxPool's


def epilogue_acts(pipeline: Pipeline) -> tuple[str, ...]:
    """The activations the conv stage's epilogue has: a max, a min, and with `leaky` a multiply;
    never a transcendental function."""
    return ("Relu", "Clip", "LeakyRelu") if pipeline.leaky else ("Relu", "Clip")


def conv(lw: Lowering, node: Node, args: list) -> None:
    x, w = args[0], args[1]
    if not isinstance(x, Dyn) or len(x.shape) != 4 or not isinstance(w, np.ndarray) \
            or w.ndim != 4:
        host_node(lw, node, args, "not a 2-D convolution of an activation by constant weights")
        return
    n, c_total, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    (oh, ow), (sh, sw), (dh, dw), (ph, pw), _ = window(node, (h, wd), (kh, kw))
    if (dh, dw) != (1, 1):  # the bottom and right padding are rows and columns past h and w
        host_node(lw, node, args, "a dilated convolution")
        return
    g = node.attrs.get("group", 1)
    layer = Layer(n, g, cg, h, wd, oc // g, kh, kw, sh, sw, ph, pw, oh, ow)
    codes = lw.graph.int8[node.inputs[1]].codes if node.quant_in is not None else None
    _layer(lw, node, args, args, layer, w, codes)


def fully_connected(lw: Lowering, node: Node, args: list) -> None:
    """Gemm, and MatMul (none of Gemm's attributes; a bias graph.py fused in as args[2])."""
    a = node.attrs
    x, b = args[0], args[1]
    if not isinstance(x, Dyn) or len(x.shape) != 2 or not isinstance(b, np.ndarray) \
            or b.ndim != 2 or a.get("transA", 0):
        host_node(lw, node, args, "not a 2-D activation times a constant matrix")
        return
    weights = (b if a.get("transB", 0) else b.T) * np.float32(a.get("alpha", 1.0))  # (out, in)
    bias = None
    if len(args) > 2 and args[2] is not None:
        bias = np.asarray(args[2], np.float32).reshape(-1) * np.float32(a.get("beta", 1.0))
    _fully_connected(lw, node, args, weights, bias, a.get("transB", 0))


def _fully_connected(lw: Lowering, node: Node, args: list, weights: np.ndarray,
                     bias: np.ndarray | None, trans_b: bool) -> None:
    """`weights`: (out, in) floats; `args`: the node's own, for its host step."""
    x: Dyn = args[0]
    if weights.shape[1] != x.shape[1] or bias is not None and bias.size not in (
            1, weights.shape[0]):
        raise UnsupportedModelError(f"{node.op} node {node.name!r}: shapes {list(x.shape)} and "
                                    f"{list(weights.shape)} do not multiply")
    layer = Layer(x.shape[0], 1, x.shape[1], 1, 1, weights.shape[0])
    flat = Dyn((x.shape[0], x.shape[1], 1, 1), x.storage)
    codes = None
    if node.quant_in is not None:  # (out, in) as the floats
        stored = lw.graph.int8[node.inputs[1]].codes
        codes = (stored if trans_b else stored.T)[:, :, None, None]
    _layer(lw, node, [flat, None, bias], args, layer, weights[:, :, None, None], codes,
           shape=(x.shape[0], weights.shape[0]))


def _layer(lw: Lowering, node: Node, args: list, host_args: list, layer: Layer, w: np.ndarray,
           codes: np.ndarray | None, shape: tuple[int, ...] | None = None) -> None:
    """One pass for `node` (Conv, or a fully connected layer as a 1x1 one: `shape`, its output),
    or, with the reason, its host step on `host_args`. `codes`: int8 weights of `w`'s shape."""
    p = lw.build.pipeline
    assert p is not None  # lower_fpga is only used for FPGA builds
    reason = _does_not_fit(node, layer, p)
    if reason:
        host_node(lw, node, host_args, reason)
        return
    act = node.activation
    on_board = act is None or act.op in epilogue_acts(p)
    pool = _fused_pool(lw, node, layer, p) if on_board else None
    out_h, out_w = (pool.oh, pool.ow) if pool else (layer.oh, layer.ow)
    total = layer.groups * layer.m
    name = (pool.output if pool else node.outputs[0]) if on_board else f"{node.name}:pre"
    out = lw.values[name] = lw.new(name, shape or (layer.n, total, out_h, out_w))
    _emit(lw, node, args, layer, w, codes, out, pool, on_board)
    if not on_board:  # the pass without its activation, then the activation on the host
        assert act is not None
        host_node(lw, Node(act.op, act.name, [name, *act.inputs[1:]], node.outputs, act.attrs),
                  [out, *(lw.values.get(i) if i else None for i in act.inputs[1:])],
                  f"activation {act.op} has no FPGA epilogue")


def _fused_pool(lw: Lowering, node: Node, layer: Layer, p: Pipeline) -> Pool | None:
    """The MaxPool that alone reads `node`'s output, where the pool stage can run it."""
    pool = lw.graph.sole_consumer(node)
    if pool is None or pool.op != "MaxPool" or len(pool.outputs) > 1 and pool.outputs[1]:
        return None
    a = pool.attrs
    k = a.get("kernel_shape", [])
    s = a.get("strides", [1] * len(k))
    pads = a.get("pads", [0] * 2 * len(k))
    if len(k) != 2 or k[0] != k[1] or len(set(s)) != 1 or len(set(pads)) > 1 \
            or a.get("ceil_mode", 0) or a.get("auto_pad", "NOTSET") != "NOTSET" \
            or any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("storage_order", 0) \
            or pads[0] >= k[0] or k[0] * layer.ow > p.board.pool_buffer:
        return None
    pk, ps, pp = k[0], s[0], pads[0]
    lw.done.add(pool.name)
    return Pool(pk, ps, pp, (layer.oh + 2 * pp - pk) // ps + 1,
                      (layer.ow + 2 * pp - pk) // ps + 1, pool.outputs[0])


def _does_not_fit(node: Node, layer: Layer, p: Pipeline) -> str:
    """Why the pass cannot run on the board's pipeline; empty where it can."""
    cv = -(-layer.c // p.board.vec)
    if (node.quant_in is not None) != p.q8:
        return ("a float layer in an int8 build" if p.q8 else
                "an int8 layer in a float build")
    if layer.kh * layer.kw * cv > p.board.weight_buffer:
        return (f"its window of {layer.kh} x {layer.kw} x {cv} words exceeds the weight "
                f"buffer's {p.board.weight_buffer}")
    if (layer.kh + layer.sh) * layer.w * cv > p.board.line_buffer:
        return (f"its {layer.kh + layer.sh} rows of {layer.w} x {cv} words exceed the line "
                f"buffer's {p.board.line_buffer}")
    return ""


def _emit(lw: Lowering, node: Node, args: list, layer: Layer, w: np.ndarray,
          codes: np.ndarray | None, out: Dyn, pool: Pool | None, with_act: bool) -> None:
    p = lw.build.pipeline
    assert p is not None
    x: Dyn = args[0]
    g, mg, c = layer.groups, layer.m, layer.c
    cv, blocks = -(-c // p.board.vec), -(-mg // p.board.lane)
    scale = np.zeros(g * blocks * p.board.lane, np.float32)
    shift = np.zeros_like(scale)
    bias = np.zeros(g * mg, np.float32)
    if len(args) > 2 and args[2] is not None:
        bias[:] = np.broadcast_to(np.asarray(args[2], np.float32).reshape(-1), (g * mg,))
    lanes = (np.arange(g)[:, None] * blocks * p.board.lane + np.arange(mg)[None, :]).reshape(-1)
    quant: Grid | None = node.quant_in
    if quant is not None and codes is not None:
        weight: Int8Weight = lw.graph.int8[node.inputs[1]]
        per_channel = np.broadcast_to(weight.scale.reshape(-1), (g * mg,)).astype(np.float64)
        sums = codes.reshape(g * mg, -1).astype(np.int64).sum(axis=1)
        scale[lanes] = quant.scale * per_channel
        shift[lanes] = bias - quant.stored[0] * sums * scale[lanes]
        packed, key = _pack(codes, layer, p, np.int8), f"{node.inputs[1]}:fpga_q8"
        read_q = [np.float32(1 / quant.scale), np.int32(quant.stored[0])]
    else:
        scale[lanes], shift[lanes] = 1.0, bias
        packed, key = _pack(w, layer, p, lw.build.dtype), f"{node.inputs[1]}:fpga"
        read_q = [np.float32(1), np.int32(0)]
    weights = lw.ref(packed, key, packed.dtype.type)
    window = layer.kh * layer.kw * cv
    act = activation_args(node, lw.values) if with_act else [np.int32(0), np.float32(0),
                                                             np.float32(0)]
    requant: Grid | None = node.requant
    rq = [np.int32(1), np.float32(requant.scale), np.float32(1 / requant.scale),
          *ints(requant.zero, requant.lo, requant.hi)] if requant and with_act else [
        np.int32(0), np.float32(1), np.float32(1), *ints(0, 0, 0)]
    flops = 2 * layer.n * g * mg * c * layer.kh * layer.kw * layer.oh * layer.ow
    pk, ps, pp, poh, pow_ = (pool.k, pool.s, pool.p, pool.oh, pool.ow) if pool else (
        0, 1, 0, layer.oh, layer.ow)
    read = dict(n=layer.n, groups=g, blocks=blocks, c=c, cv=cv, c_total=x.shape[1], h=layer.h,
                w=layer.w, oh=layer.oh, ow=layer.ow, kh=layer.kh, kw=layer.kw, sh=layer.sh,
                sw=layer.sw, ph=layer.ph, pw=layer.pw, ring=layer.kh + layer.sh)
    pooling = dict(planes=g * blocks * layer.n, oh=layer.oh, ow=layer.ow, pk=pk, ps=ps, pp=pp,
                   poh=poh, pow=pow_)
    stages = [
        [Ref(x.storage), *ints(*(read[k] for k in READ_ARGS)), *read_q],
        [weights, lw.ref(scale, f"{node.name}:fpga_scale", np.float32),
         lw.ref(shift, f"{node.name}:fpga_shift", np.float32),
         *ints(layer.n, g, blocks, layer.oh * layer.ow, window), *act, *rq],
        ints(*(pooling[k] for k in POOL_ARGS)),
        [Ref(out.storage), *ints(layer.n, g, blocks, mg, g * mg, poh * pow_)]]
    for stage, (kernel, stage_args) in enumerate(zip(STAGES, stages), 1):
        lw.out.launches.append(Launch(kernel, (1,), (1,), stage_args, node.name,
                                      flops if kernel == "fpga_conv" else 0, stage))


def _pack(w: np.ndarray, layer: Layer, p: Pipeline, dtype: type) -> np.ndarray:
    """(g * m, c, kh, kw) weights in the order the conv stage loads them:
    [group][block][ky][kx][cv][LANE][VEC], zero past c and m."""
    g, mg, c, kh, kw = layer.groups, layer.m, layer.c, layer.kh, layer.kw
    vec, lane = p.board.vec, p.board.lane
    cv, blocks = -(-c // vec), -(-mg // lane)
    full: np.ndarray = np.zeros((g, blocks * lane, kh, kw, cv * vec), dtype)
    full[:, :mg, :, :, :c] = w.reshape(g, mg, c, kh, kw).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(full.reshape(g, blocks, lane, kh, kw, cv, vec).transpose(
        0, 1, 3, 4, 5, 2, 6))


def host_node(lw: Lowering, node: Node, args: list, reason: str = "") -> None:
    """`node` computed on the host; a fused activation is a host step of its own."""
    act: Node | None = node.activation
    if act is not None:
        pre = f"{node.name}:pre"
        host_node(lw, replace(node, outputs=[pre, *node.outputs[1:]], activation=None), args,
                  reason)
        host_node(lw, Node(act.op, act.name, [pre, *act.inputs[1:]], node.outputs[:1],
                           act.attrs),
                  [lw.values[pre], *(lw.values.get(i) if i else None for i in act.inputs[1:])],
                  reason)
        return
    shapes = host.output_shapes(node, [a.shape if isinstance(a, Dyn) else a for a in args],
                                lw.graph.opset)
    outs = []
    for name, shape in zip(node.outputs, shapes):
        if name:
            outs.append(lw.new(name, shape))
            lw.values[name] = outs[-1]
    lw.out.launches.append(Launch(
        HOST, (1,), (1,), [Ref(a.storage) for a in args if isinstance(a, Dyn)]
        + [Ref(o.storage) for o in outs], node.name,
        host=HostStep(node, tuple(args), tuple(outs), lw.graph.opset)))
    lw.out.on_host.setdefault(node.name, reason or f"op {node.op} has no FPGA kernel")


def recurrent(lw: Lowering, node: Node, args: list) -> None:
    """LSTM, GRU, RNN on the host, refusing what ONNX's reference evaluator would silently
    ignore there: other activations, clip, input_forget, and sequences shorter than X."""
    check_attributes(node)
    lens = args[4] if len(args) > 4 else None
    x = args[0]
    steps = x.shape[1] if node.attrs.get("layout", 0) else x.shape[0]
    if isinstance(lens, Dyn) or lens is not None and (np.asarray(lens) != steps).any():
        raise UnsupportedOpError(
            f"op {node.op!r} of node {node.name!r}: input sequence_lens "
            f"({node.inputs[4]!r}) shorter than the sequence: the FPGA's host step (ONNX's "
            f"reference evaluator) runs every sequence to its end")
    host_node(lw, node, args)


_TABLE: Table = {**VIEWS, "Conv": always(conv), "Gemm": always(fully_connected),
                 "MatMul": always(fully_connected),
                 **dict.fromkeys(("LSTM", "GRU", "RNN"), always(recurrent))}
