"""Lowering of the int8 nodes that qdq.py marks (Conv and Gemm with `quant_in`) to the kernels of
kernels/quantized.cl: the input quantized in one pass (quantize_q8), a convolution's windows
gathered as int8 codes (im2col_q8), int8 x int8 products summed in int32 (gemm_q8), and the
per-channel scales, bias, activation and the output's re-quantization in the GEMM's epilogue.
Leftover FakeQuant nodes run as their own kernel."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.ir import Grid, Node, UnsupportedModelError
from accelerators.opencl.launch import (
    GEMM_WG,
    VN,
    Dyn,
    Launch,
    Ref,
    activation_args,
    ints,
    round_up,
)
from accelerators.opencl.lowering_state import Lowering
from accelerators.opencl.qdq import Int8Weight

Q8_TM = 8  # rows of a gemm_q8 work-item's tile (kernels/quantized.cl)


def _requant_args(node: Node) -> list:
    grid: Grid | None = node.requant
    if grid is None:
        return [np.int32(0), np.float32(1), *ints(0, 0, 0)]
    return [np.int32(1), np.float32(grid.scale), *ints(grid.zero, grid.lo, grid.hi)]


def _per_channel(weight: Int8Weight, channels: int, name: str) -> np.ndarray:
    if weight.scale.size not in (1, channels):
        raise UnsupportedModelError(f"node {name!r}: int8 weight scales of shape "
                                    f"{list(weight.scale.shape)} for {channels} channels")
    return np.broadcast_to(weight.scale.reshape(-1).astype(np.float64), (channels,))


def _launch_q8(lw: Lowering, node: Node, a: Ref, b: Ref, scale: np.ndarray, offset: np.ndarray,
               bias: np.ndarray | None, c: Ref, m: int, n: int, k: int,
               lds: tuple[int, int, int], groups: int, strides: tuple[int, ...],
               per_row: bool, flops: int) -> None:
    key = node.name
    args = [a, b, lw.ref(scale, f"{key}:q8_scale"),
            lw.ref(offset, f"{key}:q8_offset", np.int32),
            lw.ref(bias, f"{key}:q8_bias") if bias is not None else a, c,
            *ints(m, n, k, *lds, groups, *strides[:-1], per_row, bias is not None),
            *activation_args(node, lw.values), *_requant_args(node)]
    size = (round_up(-(-n // VN), GEMM_WG), -(-m // Q8_TM), strides[-1])
    lw.out.launches.append(Launch("gemm_q8", size, (GEMM_WG, 1, 1), args, node.name,
                                  flops))


def _quantize(lw: Lowering, node: Node, x: Dyn, grid: Grid) -> Ref:
    """x's int8 codes on `grid`, in a new buffer."""
    total = math.prod(x.shape)
    xq = Ref(lw.new(f"{node.name}:x_q8", x.shape, itemsize=1).storage)
    lw.emit(node, "quantize_q8", total, [Ref(x.storage), xq, np.int32(total),
                                         np.float32(grid.scale), *ints(*grid.stored)])
    return xq


def conv_q8(lw: Lowering, node: Node, args: list, out: Dyn, geometry: list[int]) -> None:
    """`out` and `geometry`: conv_lowering's output and im2col arguments."""
    x, grid = args[0], node.quant_in
    assert grid is not None  # conv_lowering calls it for int8 nodes only
    weight: Int8Weight = lw.graph.int8[node.inputs[1]]
    cg, kh, kw, oh, ow = geometry[0], geometry[5], geometry[6], geometry[3], geometry[4]
    n, oc, g = x.shape[0], weight.codes.shape[0], node.attrs.get("group", 1)
    mg, kg, p = oc // g, cg * kh * kw, oh * ow
    zero, lo, hi = grid.stored
    # Quantized once, then gathered as codes: kh x kw times fewer divisions.
    xq = _quantize(lw, node, x, grid)
    col = Ref(lw.new(f"{node.name}:col_q8", (n * g * kg * p,), itemsize=1).storage)
    lw.emit(node, "im2col_q8", (kg, n * g), [xq, col, *ints(*geometry, zero)])
    codes = weight.codes.reshape(oc, kg)
    bias = np.asarray(args[2], np.float32) if len(args) > 2 and args[2] is not None else None
    _launch_q8(
        lw, node, lw.ref(codes, f"{node.inputs[1]}:q8", np.int8), col,
        grid.scale * _per_channel(weight, oc, node.name),
        zero * codes.astype(np.int64).sum(axis=1), bias, Ref(out.storage), mg, p, kg,
        (kg, p, p), g, (0, mg * kg, g * kg * p, kg * p, oc * p, mg * p, n * g), True,
        2 * n * oc * kg * p)


def gemm_q8(lw: Lowering, node: Node, args: list) -> None:
    x, grid, a = args[0], node.quant_in, node.attrs
    assert grid is not None  # matmul_lowering calls it for int8 nodes only
    weight: Int8Weight = lw.graph.int8[node.inputs[1]]
    if len(x.shape) != 2 or weight.codes.ndim != 2:
        raise UnsupportedModelError(f"Gemm node {node.name!r}: only 2-D operands")
    codes = weight.codes.T if a.get("transB", 0) else weight.codes  # (k, n)
    m, k = x.shape
    n = codes.shape[1]
    zero = grid.stored[0]
    xq = _quantize(lw, node, x, grid)
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], (m, n))
    bias = None
    if len(args) > 2 and args[2] is not None:
        bias = np.broadcast_to(np.asarray(args[2], np.float32).reshape(-1)
                               * np.float32(a.get("beta", 1.0)), (n,))
    _launch_q8(
        lw, node, xq, lw.ref(codes, f"{node.inputs[1]}:q8T", np.int8),
        grid.scale * a.get("alpha", 1.0) * _per_channel(weight, n, node.name),
        zero * codes.astype(np.int64).sum(axis=0), bias, Ref(out.storage), m, n, k,
        (k, n, n), 1, (0, 0, 0, 0, 0, 0, 1), False, 2 * m * n * k)


def fake_quant(lw: Lowering, node: Node, args: list) -> None:
    x, grid = args[0], node.grid
    assert grid is not None  # qdq.py makes each FakeQuant with its grid
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], x.shape)
    total = math.prod(x.shape)
    lw.emit(node, "fake_quant_f32", total, [
        Ref(x.storage), Ref(out.storage), np.int32(total), np.float32(grid.scale),
        *ints(grid.zero, grid.lo, grid.hi)])
