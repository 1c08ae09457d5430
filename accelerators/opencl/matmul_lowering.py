"""Lowering of the matrix products (Gemm, MatMul; conv_lowering's GEMMs) to the GEMM kernels:
register tiles on CPUs, local-memory tiles on GPUs and FPGAs, split K for one wide row; MatMul
of N-D activations (attention) as one batched GEMM."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import (
    BIAS_COL,
    BIAS_NONE,
    GEMM_WG,
    GEMV_SPLIT_K,
    VN,
    Dyn,
    Launch,
    LocalTiling,
    Ref,
    activation_args,
    ints,
    round_up,
)
from accelerators.opencl.layout_lowering import broadcast_strides, merged
from accelerators.opencl.lowering_state import Lowering
from accelerators.opencl.quant_lowering import gemm_q8


def padded_stride(n: int) -> int:
    """The row stride of a constant matrix of n columns: n, or n + VN where n floats span a
    multiple of 1 KiB, whose rows would otherwise share a few cache sets as the GEMM walks
    down a column tile (a ViT's 768 and 3072 columns ran at a third of 2304's speed)."""
    return n + VN if n % 256 == 0 else n


def launch_gemm(lw: Lowering, node: Node, a: Ref, b: Ref, bias: Ref | None, c: Ref, m: int,
                n: int, k: int, lds: tuple[int, int, int], groups: int,
                strides: tuple[int, ...], bias_mode: int, act: list, flops: int) -> None:
    """C = act(A x B + bias) for each z; `lds` are the row strides of A, B, C; `strides`
    the per-batch and per-group offsets of A, B, C, then the number of z."""
    args = [a, b, bias or a, c, *ints(m, n, k, *lds, groups, *strides[:-1], bias_mode), *act]
    tiling = lw.build.tiling
    if tiling:
        lw.out.launches.append(Launch("gemm_local", tiled_size(tiling, m, n, strides[-1]),
                                      (tiling.ts, tiling.rows, 1), args + [np.int32(0)],
                                      node.name, flops))
        return
    tm = lw.build.rows if m >= lw.build.rows else 1
    rows_first = n >= m  # B (k x n) is the larger operand: walk row tiles fastest
    tiles = (-(-m // tm), -(-n // VN)) if rows_first else (-(-n // VN), -(-m // tm))
    size = (round_up(tiles[0], GEMM_WG), tiles[1], strides[-1])
    lw.out.launches.append(Launch("gemm1" if tm == 1 else "gemm_tile", size, (GEMM_WG, 1, 1),
                                  args + [np.int32(rows_first)], node.name, flops))


def tiled_size(tiling: LocalTiling, m: int, n: int, z: int) -> tuple[int, int, int]:
    """The global size of gemm_local and conv_local for an m x n product, z times."""
    return round_up(n, tiling.ts), round_up(m, tiling.ts) // tiling.ts * tiling.rows, z


def _gemm_node(lw: Lowering, node: Node, args: list, alpha: float, beta: float,
               trans_b: bool) -> None:
    """An activation, its leading axes taken as rows (MatMul on (n, tokens, dim); a 1-D one
    is one row), times a constant matrix, plus an optional constant row."""
    x, w = args[0], args[1]
    if not isinstance(x, Dyn) or not x.shape or not isinstance(w, np.ndarray) \
            or w.ndim != 2 or node.attrs.get("transA", 0):
        raise UnsupportedModelError(
            f"{node.op} node {node.name!r}: only an activation times a constant 2-D "
            f"matrix (transA=0) is supported")
    wkey = f"{node.inputs[1]}:T" if trans_b or alpha != 1 else node.inputs[1]
    n = w.shape[0] if trans_b else w.shape[1]
    ldb = padded_stride(n)
    if wkey not in lw.graph.derived:  # transposed once, whatever the batch size
        wt = np.zeros((w.shape[1] if trans_b else w.shape[0], ldb), np.float32)
        wt[:, :n] = (w.T if trans_b else w) * np.float32(alpha)
        lw.graph.derived[wkey] = wt
    _gemm_rows(lw, node, x, args, wkey, n, beta)


def _gemm_rows(lw: Lowering, node: Node, x: Dyn, args: list, wkey: str, n: int, beta: float
               ) -> None:
    """x's rows times the matrix `wkey` of graph.derived (n columns, rows padded), plus beta
    times the bias row of args[2] where there is one."""
    wt = lw.graph.derived[wkey]
    ldb = wt.shape[1]
    m, k = math.prod(x.shape[:-1]), x.shape[-1]
    if k != wt.shape[0]:  # a head sized for other input dims: never read past the weights
        raise UnsupportedModelError(
            f"{node.op} node {node.name!r}: the activation's last axis has {k} values, the "
            f"matrix {wt.shape[0]} rows ({list(x.shape)} x {list(args[1].shape)})")
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], (*x.shape[:-1], n))
    bias = _bias_row(lw, node, args[2], beta, n) if len(args) > 2 and args[2] is not None \
        else None
    if m == 1 and k >= GEMV_SPLIT_K and not lw.build.tiling:
        _gemv(lw, node, Ref(x.storage), lw.ref(wt, wkey), bias, Ref(out.storage), n, k,
              ldb)
        return
    launch_gemm(lw, node, Ref(x.storage), lw.ref(wt, wkey), bias, Ref(out.storage),
                m, n, k, (k, ldb, n), 1, (0, 0, 0, 0, 0, 0, 1),
                BIAS_COL if bias else BIAS_NONE, activation_args(node, lw.values),
                2 * m * n * k)


def _bias_row(lw: Lowering, node: Node, value: np.ndarray, beta: float, n: int) -> Ref:
    """beta times a Gemm's bias, a row of n values (or one, broadcast)."""
    c = np.asarray(value, np.float32) * np.float32(beta)
    if c.size not in (1, n) or c.ndim > 1 and c.shape[0] != 1:
        raise UnsupportedModelError(
            f"Gemm node {node.name!r}: bias of shape {list(c.shape)} is not a row")
    return lw.ref(np.broadcast_to(c.reshape(-1), (n,)), f"{node.name}:bias")


def _gemv(lw: Lowering, node: Node, x: Ref, w: Ref, bias: Ref | None, out: Ref, n: int, k: int,
          ldb: int) -> None:
    """One sample, K split in chunks of GEMV_SPLIT_K / 4 summed by a second launch."""
    chunk = GEMV_SPLIT_K // 4
    splits = -(-k // chunk)
    partial = Ref(lw.new(f"{node.name}:partial", (splits, n)).storage)
    lw.out.launches.append(Launch(
        "gemv_partial", (round_up(-(-n // VN), GEMM_WG), splits), (GEMM_WG, 1), [
            x, w, partial, *ints(n, k, ldb, chunk)], node.name, 2 * n * k))
    lw.emit(node, "gemv_reduce", n, [partial, bias or w, out,
                                     *ints(n, splits, bias is not None),
                                     *activation_args(node, lw.values)])


def gemm(lw: Lowering, node: Node, args: list) -> None:
    if node.quant_in is not None:
        gemm_q8(lw, node, args)
        return
    a = node.attrs
    _gemm_node(lw, node, args, a.get("alpha", 1.0), a.get("beta", 1.0), a.get("transB", 0))


def matmul(lw: Lowering, node: Node, args: list) -> None:
    """`args`: A, B and a constant row that graph.py fused in (a Linear layer's bias)."""
    a, b = args[0], args[1]
    if isinstance(a, Dyn) and isinstance(b, np.ndarray) and b.ndim == 2:
        _gemm_node(lw, node, args, 1.0, 1.0, False)
        return
    _batched_matmul(lw, node, a, b)


def _batched_matmul(lw: Lowering, node: Node, a: Dyn | np.ndarray, b: Dyn | np.ndarray) -> None:
    """Either or both operands activations, with numpy's broadcasting of the batch axes
    (attention's Q x K^T and weights x V): one GEMM launch whose z walks the batch axes,
    merged into the kernel's two levels (batch, group) with a stride each, 0 where an
    operand is broadcast."""
    sa, sb = tuple(a.shape), tuple(b.shape)
    if not sa or not sb:
        raise UnsupportedModelError(f"MatMul node {node.name!r}: a scalar operand")
    a2 = (1,) + sa if len(sa) == 1 else sa  # numpy's promotion of 1-D operands
    b2 = sb + (1,) if len(sb) == 1 else sb
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    if k != k2:
        raise UnsupportedModelError(f"MatMul node {node.name!r}: shapes {list(sa)} and "
                                    f"{list(sb)} do not multiply")
    shape = batch + (m,) * (len(sa) > 1) + (n,) * (len(sb) > 1)
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], shape)
    dims, (za, zb, zc) = merged(
        batch, *([s * size for s in broadcast_strides(own[:-2], batch)]
                 for own, size in ((a2, m * k), (b2, k * n), (batch + (m, n), m * n))))
    if len(dims) > 2:
        raise UnsupportedModelError(f"MatMul node {node.name!r}: batch axes {list(batch)} "
                                    f"of {list(sa)} x {list(sb)} do not merge into two")
    if len(dims) == 1:
        dims, za, zb, zc = (dims[0], 1), (za[0], 0), (zb[0], 0), (zc[0], 0)
    z = dims[0] * dims[1]
    launch_gemm(lw, node, lw.ref(a, node.inputs[0]), lw.ref(b, node.inputs[1]), None,
                Ref(out.storage), m, n, k, (k, n, n), dims[1],
                (za[0], za[1], zb[0], zb[1], zc[0], zc[1], z), BIAS_NONE,
                activation_args(node, lw.values), 2 * z * m * n * k)
