"""Lowering of the matrix-product ops (Conv, Gemm, MatMul) to im2col and the GEMM kernels:
register tiles on CPUs, local-memory tiles on GPUs and FPGAs, split K for one wide row; MatMul
of N-D activations (attention) as one batched GEMM."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.host_ops import window
from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import (
    BIAS_COL,
    BIAS_NONE,
    BIAS_ROW,
    GEMM_WG,
    GEMV_SPLIT_K,
    VN,
    Dyn,
    Launch,
    Ref,
    activation_args,
    ints,
    round_up,
)
from accelerators.opencl.layout_lowering import broadcast_strides, merged


def padded_stride(n: int) -> int:
    """The row stride of a constant matrix of n columns: n, or n + VN where n floats span a
    multiple of 1 KiB, whose rows would otherwise share a few cache sets as the GEMM walks
    down a column tile (a ViT's 768 and 3072 columns ran at a third of 2304's speed)."""
    return n + VN if n % 256 == 0 else n


class MatMulLowering:
    """Mixed into lowering.Lowering, whose graph, values, out, build, tiling, _new, _ref and
    _emit these methods use."""

    def _launch_gemm(self, node: Node, a: Ref, b: Ref, bias: Ref | None, c: Ref, m: int,
                     n: int, k: int, lds: tuple[int, int, int], groups: int,
                     strides: tuple[int, ...], bias_mode: int, act: list, flops: int) -> None:
        """C = act(A x B + bias) for each z; `lds` are the row strides of A, B, C; `strides`
        the per-batch and per-group offsets of A, B, C, then the number of z."""
        args = [a, b, bias or a, c, *ints(m, n, k, *lds, groups, *strides[:-1], bias_mode), *act]
        if self.tiling:
            self.out.launches.append(Launch("gemm_local", self._tiled_size(m, n, strides[-1]),
                                            (self.tiling.ts, self.tiling.rows, 1),
                                            args + [np.int32(0)], node.name, flops))
            return
        tm = self.build.rows if m >= self.build.rows else 1
        rows_first = n >= m  # B (k x n) is the larger operand: walk row tiles fastest
        tiles = (-(-m // tm), -(-n // VN)) if rows_first else (-(-n // VN), -(-m // tm))
        size = (round_up(tiles[0], GEMM_WG), tiles[1], strides[-1])
        self.out.launches.append(Launch("gemm1" if tm == 1 else "gemm_tile", size, (GEMM_WG, 1, 1),
                                        args + [np.int32(rows_first)], node.name, flops))

    def _tiled_size(self, m: int, n: int, z: int) -> tuple[int, int, int]:
        ts = self.tiling.ts
        return round_up(n, ts), round_up(m, ts) // ts * self.tiling.rows, z

    # --- kernel ops
    def _conv_geometry(self, node: Node, x: Dyn, w: np.ndarray) -> tuple[Dyn, list[int]]:
        """The output and the im2col arguments (channels per group, h, w, oh, ow, kh, kw, sh,
        sw, ph, pw, dh, dw)."""
        if not isinstance(w, np.ndarray) or len(w.shape) != 4 or len(x.shape) != 4:
            raise UnsupportedModelError(
                f"node {node.name!r}: only 2-D Conv with constant weights is supported")
        n, c, h, wd = x.shape
        oc, cg, kh, kw = w.shape
        (oh, ow), (sh, sw), (dh, dw), (ph, pw), _ = window(node, (h, wd), (kh, kw))
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (n, oc, oh, ow))
        return out, [cg, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw]

    def _convtranspose(self, node: Node, args: list) -> None:
        """1-D and 2-D, constant weights; output_shape or pads, auto_pad, output_padding."""
        x, w, a = args[0], args[1], node.attrs
        if not isinstance(w, np.ndarray) or w.ndim != len(x.shape) or w.ndim not in (3, 4):
            raise UnsupportedModelError(f"ConvTranspose node {node.name!r}: only 1-D and 2-D "
                                        f"with constant weights are supported")
        one_d = w.ndim == 3
        if one_d:  # as 2-D of height 1
            x, w = Dyn((*x.shape[:2], 1, x.shape[2]), x.storage), w[:, :, None, :]
            height = {"pads": lambda v: [0, v[0], 0, v[1]], "output_padding": lambda v: [0, *v]}
            a = {k: height.get(k, lambda v: [1, *v])(v) if isinstance(v, list) else v
                 for k, v in a.items()}
        n, c_in, h, wd = x.shape
        groups, kernel = a.get("group", 1), w.shape[2:]
        c_out = w.shape[1] * groups
        strides, dilations = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
        extra, pads = a.get("output_padding", [0, 0]), a.get("pads", [0, 0, 0, 0])
        full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in
                zip(strides, (h, wd), extra, kernel, dilations)]
        shape = a.get("output_shape") or (
            [i * s for i, s in zip((h, wd), strides)]
            if a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER") else None)
        if shape is not None:  # the pads follow from the asked size (ONNX's rule): SAME_UPPER
            total = [f - o for f, o in zip(full, shape[-2:])]  # crops less at the start
            upper = a.get("auto_pad", "NOTSET") == "SAME_UPPER"
            pads = [t // 2 if upper else t - t // 2 for t in total] + [
                t - t // 2 if upper else t // 2 for t in total]
        out_hw = [f - pads[i] - pads[i + 2] for i, f in enumerate(full)]
        out = self._new(node.outputs[0], (n, c_out, *out_hw))
        self.values[node.outputs[0]] = Dyn((n, c_out, out_hw[1]) if one_d else out.shape,
                                           out.storage)
        weights = self._ref(w, node.inputs[1])
        has_bias = len(args) > 2 and args[2] is not None
        bias = self._ref(args[2], node.inputs[2]) if has_bias else weights
        self._emit(node, "conv_transpose", (out_hw[0] * out_hw[1], n * c_out), [
            Ref(x.storage), weights, bias, Ref(out.storage),
            *ints(c_in, c_out, groups, h, wd, *out_hw, *kernel, *strides, pads[0], pads[1],
                  *dilations, has_bias), *activation_args(node, self.values)],
            2 * n * c_in * h * wd * w.shape[1] * kernel[0] * kernel[1])

    def _conv(self, node: Node, args: list) -> None:
        if len(args[0].shape) == 3 and isinstance(args[1], np.ndarray) and args[1].ndim == 3:
            self._conv1d(node, args)
            return
        if "quant_in" in node.attrs:
            self._conv_q8(node, args)
            return
        if self.pipelined:
            self._conv_pipelined(node, args)
            return
        x, w = args[0], args[1]
        out, geometry = self._conv_geometry(node, x, w)
        cg, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = geometry
        n, oc, g = x.shape[0], w.shape[0], node.attrs.get("group", 1)
        mg, kg, p = oc // g, cg * kh * kw, oh * ow
        weights = self._ref(w.reshape(oc, kg), node.inputs[1])
        bias = self._ref(args[2], node.inputs[2]) if len(args) > 2 and args[2] is not None \
            else None
        if self.tiling and cg == 1 and g == x.shape[1] > 1:
            # Depthwise on GPUs and FPGAs: one output pixel per work-item, not one-row GEMMs.
            # (Under PoCL it measured 2-4x slower than im2col + gemm1's vector tiles.)
            self._emit(node, "conv_depthwise", (p, n * oc), [
                Ref(x.storage), weights, bias or weights, Ref(out.storage),
                *ints(g, mg, *geometry[1:], bias is not None),
                *activation_args(node, self.values)], 2 * n * oc * kg * p)
            return
        direct = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd)
        if self.tiling and not direct:  # implicit GEMM: no im2col buffer
            self.out.launches.append(Launch(
                "conv_local", self._tiled_size(mg, p, n * g),
                (self.tiling.ts, self.tiling.rows, 1),
                [Ref(x.storage), weights, bias or weights, Ref(out.storage),
                 *ints(mg, p, kg, g, *geometry, BIAS_ROW if bias else BIAS_NONE),
                 *activation_args(node, self.values)], node.name, 2 * n * oc * kg * p))
            return
        if direct:
            col = Ref(x.storage)  # a 1x1 convolution reads its input as the GEMM's B
        else:
            col = Ref(self._new(f"{node.name}:col", (n * g * kg * p,)).storage)
            self._emit(node, "im2col", (kg, n * g), [Ref(x.storage), col, *ints(*geometry)])
        self._launch_gemm(node, weights, col, bias, Ref(out.storage), mg, p, kg, (kg, p, p), g,
                          (0, mg * kg, g * kg * p, kg * p, oc * p, mg * p, n * g),
                          BIAS_ROW if bias else BIAS_NONE, activation_args(node, self.values),
                          2 * n * oc * kg * p)

    def _conv1d(self, node: Node, args: list) -> None:
        """A 1-D Conv (ECA-Net's channel attention) as a 2-D one of height 1: its input and
        output are views, its weights and attributes gain a leading spatial axis of size 1."""
        x, w = args[0], args[1]
        attrs = dict(node.attrs)
        for key in ("kernel_shape", "strides", "dilations"):
            if key in attrs:
                attrs[key] = [1, *attrs[key]]
        if "pads" in attrs:
            attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
        flat = Node("Conv", node.name, node.inputs, [f"{node.name}:2d"], attrs)
        self._conv(flat, [Dyn((*x.shape[:2], 1, x.shape[2]), x.storage), w[:, :, None, :],
                          *args[2:]])
        out = self.values[flat.outputs[0]]
        self.values[node.outputs[0]] = Dyn((*out.shape[:2], out.shape[3]), out.storage)

    def _gemm_node(self, node: Node, args: list, alpha: float, beta: float,
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
        if wkey not in self.graph.derived:  # transposed once, whatever the batch size
            wt = np.zeros((w.shape[1] if trans_b else w.shape[0], ldb), np.float32)
            wt[:, :n] = (w.T if trans_b else w) * np.float32(alpha)
            self.graph.derived[wkey] = wt
        wt = self.graph.derived[wkey]
        m, k = math.prod(x.shape[:-1]), x.shape[-1]
        if k != wt.shape[0]:  # a head sized for other input dims: never read past the weights
            raise UnsupportedModelError(
                f"{node.op} node {node.name!r}: the activation's last axis has {k} values, the "
                f"matrix {wt.shape[0]} rows ({list(x.shape)} x {list(w.shape)})")
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (*x.shape[:-1], n))
        bias = None
        if len(args) > 2 and args[2] is not None:
            c = np.asarray(args[2], np.float32) * np.float32(beta)
            if c.size not in (1, n) or c.ndim > 1 and c.shape[0] != 1:
                raise UnsupportedModelError(
                    f"Gemm node {node.name!r}: bias of shape {list(c.shape)} is not a row")
            bias = self._ref(np.broadcast_to(c.reshape(-1), (n,)), f"{node.name}:bias")
        if m == 1 and k >= GEMV_SPLIT_K and not self.tiling:
            self._gemv(node, Ref(x.storage), self._ref(wt, wkey), bias, Ref(out.storage), n, k,
                       ldb)
            return
        self._launch_gemm(node, Ref(x.storage), self._ref(wt, wkey), bias, Ref(out.storage),
                          m, n, k, (k, ldb, n), 1, (0, 0, 0, 0, 0, 0, 1),
                          BIAS_COL if bias else BIAS_NONE, activation_args(node, self.values),
                          2 * m * n * k)

    def _gemv(self, node: Node, x: Ref, w: Ref, bias: Ref | None, out: Ref, n: int, k: int,
              ldb: int) -> None:
        """One sample, K split in chunks of GEMV_SPLIT_K / 4 summed by a second launch."""
        chunk = GEMV_SPLIT_K // 4
        splits = -(-k // chunk)
        partial = Ref(self._new(f"{node.name}:partial", (splits, n)).storage)
        self.out.launches.append(Launch(
            "gemv_partial", (round_up(-(-n // VN), GEMM_WG), splits), (GEMM_WG, 1), [
                x, w, partial, *ints(n, k, ldb, chunk)], node.name, 2 * n * k))
        self._emit(node, "gemv_reduce", n, [partial, bias or w, out,
                                             *ints(n, splits, bias is not None),
                                             *activation_args(node, self.values)])

    def _gemm(self, node: Node, args: list) -> None:
        if "quant_in" in node.attrs:
            self._gemm_q8(node, args)
            return
        a = node.attrs
        self._gemm_node(node, args, a.get("alpha", 1.0), a.get("beta", 1.0), a.get("transB", 0))

    def _matmul(self, node: Node, args: list) -> None:
        """`args`: A, B and a constant row that graph.py fused in (a Linear layer's bias)."""
        a, b = args[0], args[1]
        if isinstance(a, Dyn) and isinstance(b, np.ndarray) and b.ndim == 2:
            self._gemm_node(node, args, 1.0, 1.0, False)
            return
        self._batched_matmul(node, a, b)

    def _batched_matmul(self, node: Node, a: Dyn | np.ndarray, b: Dyn | np.ndarray) -> None:
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
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], shape)
        dims, (za, zb, zc) = merged(
            batch, *([s * size for s in broadcast_strides(own[:-2], batch)]
                     for own, size in ((a2, m * k), (b2, k * n), (batch + (m, n), m * n))))
        if len(dims) > 2:
            raise UnsupportedModelError(f"MatMul node {node.name!r}: batch axes {list(batch)} "
                                        f"of {list(sa)} x {list(sb)} do not merge into two")
        if len(dims) == 1:
            dims, za, zb, zc = (dims[0], 1), (za[0], 0), (zb[0], 0), (zc[0], 0)
        z = dims[0] * dims[1]
        self._launch_gemm(node, self._ref(a, node.inputs[0]), self._ref(b, node.inputs[1]), None,
                          Ref(out.storage), m, n, k, (k, n, n), dims[1],
                          (za[0], za[1], zb[0], zb[1], zc[0], zc[1], z), BIAS_NONE,
                          activation_args(node, self.values), 2 * z * m * n * k)
