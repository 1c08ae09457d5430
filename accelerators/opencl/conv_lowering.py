"""Lowering of the convolutions: Conv 2-D (1-D as 2-D of height 1) to im2col and
matmul_lowering's GEMMs, an implicit GEMM (`conv_local`) or a depthwise kernel on GPUs, and
to quant_lowering's int8 kernels where the node asks; ConvTranspose 1-D and 2-D to
`conv_transpose`. (FPGAs run their own pipeline: fpga/lowering.py.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from accelerators.opencl.host_ops import window
from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import BIAS_NONE, BIAS_ROW, Dyn, Launch, Ref, activation_args, ints
from accelerators.opencl.lowering_state import Lowering
from accelerators.opencl.matmul_lowering import launch_gemm, tiled_size
from accelerators.opencl.quant_lowering import conv_q8


def _conv_geometry(lw: Lowering, node: Node, x: Dyn, w: np.ndarray) -> tuple[Dyn, list[int]]:
    """The output and the im2col arguments (channels per group, h, w, oh, ow, kh, kw, sh,
    sw, ph, pw, dh, dw)."""
    if not isinstance(w, np.ndarray) or len(w.shape) != 4 or len(x.shape) != 4:
        raise UnsupportedModelError(
            f"node {node.name!r}: only 2-D Conv with constant weights is supported")
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    (oh, ow), (sh, sw), (dh, dw), (ph, pw), _ = window(node, (h, wd), (kh, kw))
    out = lw.values[node.outputs[0]] = lw.new(node.outputs[0], (n, oc, oh, ow))
    return out, [cg, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw]


def conv_transpose(lw: Lowering, node: Node, args: list) -> None:
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
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in
            zip(strides, (h, wd), a.get("output_padding", [0, 0]), kernel, dilations)]
    pads = _transpose_pads(a, full, (h, wd), strides)
    out_hw = [f - pads[i] - pads[i + 2] for i, f in enumerate(full)]
    out = lw.new(node.outputs[0], (n, c_out, *out_hw))
    lw.values[node.outputs[0]] = Dyn((n, c_out, out_hw[1]) if one_d else out.shape,
                                     out.storage)
    weights = lw.ref(w, node.inputs[1])
    has_bias = len(args) > 2 and args[2] is not None
    bias = lw.ref(args[2], node.inputs[2]) if has_bias else weights
    lw.emit(node, "conv_transpose", (out_hw[0] * out_hw[1], n * c_out), [
        Ref(x.storage), weights, bias, Ref(out.storage),
        *ints(c_in, c_out, groups, h, wd, *out_hw, *kernel, *strides, pads[0], pads[1],
              *dilations, has_bias), *activation_args(node, lw.values)],
            2 * n * c_in * h * wd * w.shape[1] * kernel[0] * kernel[1])


def _transpose_pads(a: dict, full: list[int], hw: tuple[int, int], strides: list[int]
                    ) -> list[int]:
    """A ConvTranspose's pads: attribute `pads`, or where an output size is asked
    (output_shape, or auto_pad SAME_*: the input's times the strides) what crops its full
    output `full` to it, by ONNX's rule (SAME_UPPER crops less at the start)."""
    auto = a.get("auto_pad", "NOTSET")
    shape = a.get("output_shape") or (
        [i * s for i, s in zip(hw, strides)] if auto in ("SAME_UPPER", "SAME_LOWER") else None)
    if shape is None:
        return list(a.get("pads", [0, 0, 0, 0]))
    total = [f - o for f, o in zip(full, shape[-2:])]
    upper = auto == "SAME_UPPER"
    return [t // 2 if upper else t - t // 2 for t in total] + [
        t - t // 2 if upper else t // 2 for t in total]


def conv(lw: Lowering, node: Node, args: list) -> None:
    if len(args[0].shape) == 3 and isinstance(args[1], np.ndarray) and args[1].ndim == 3:
        _conv1d(lw, node, args)
        return
    x, w = args[0], args[1]
    out, geometry = _conv_geometry(lw, node, x, w)
    if node.quant_in is not None:
        conv_q8(lw, node, args, out, geometry)
        return
    cg, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = geometry
    n, oc, g = x.shape[0], w.shape[0], node.attrs.get("group", 1)
    mg, kg, p = oc // g, cg * kh * kw, oh * ow
    weights = lw.ref(w.reshape(oc, kg), node.inputs[1])
    bias = lw.ref(args[2], node.inputs[2]) if len(args) > 2 and args[2] is not None \
        else None
    tiling = lw.build.tiling
    if tiling and cg == 1 and g == x.shape[1] > 1:
        # Depthwise on GPUs and FPGAs: one output pixel per work-item, not one-row GEMMs.
        # (Under PoCL it measured 2-4x slower than im2col + gemm1's vector tiles.)
        lw.emit(node, "conv_depthwise", (p, n * oc), [
            Ref(x.storage), weights, bias or weights, Ref(out.storage),
            *ints(g, mg, *geometry[1:], bias is not None),
            *activation_args(node, lw.values)], 2 * n * oc * kg * p)
        return
    direct = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd)
    if tiling and not direct:  # implicit GEMM: no im2col buffer
        lw.out.launches.append(Launch(
            "conv_local", tiled_size(tiling, mg, p, n * g), (tiling.ts, tiling.rows, 1),
            [Ref(x.storage), weights, bias or weights, Ref(out.storage),
             *ints(mg, p, kg, g, *geometry, BIAS_ROW if bias else BIAS_NONE),
             *activation_args(node, lw.values)], node.name, 2 * n * oc * kg * p))
        return
    if direct:
        col = Ref(x.storage)  # a 1x1 convolution reads its input as the GEMM's B
    else:
        col = Ref(lw.new(f"{node.name}:col", (n * g * kg * p,)).storage)
        lw.emit(node, "im2col", (kg, n * g), [Ref(x.storage), col, *ints(*geometry)])
    launch_gemm(lw, node, weights, col, bias, Ref(out.storage), mg, p, kg, (kg, p, p), g,
                (0, mg * kg, g * kg * p, kg * p, oc * p, mg * p, n * g),
                BIAS_ROW if bias else BIAS_NONE, activation_args(node, lw.values),
                2 * n * oc * kg * p)


def _conv1d(lw: Lowering, node: Node, args: list) -> None:
    """A 1-D Conv (ECA-Net's channel attention) as a 2-D one of height 1: its input and
    output are views, its weights and attributes gain a leading spatial axis of size 1."""
    x, w = args[0], args[1]
    attrs = dict(node.attrs)
    for key in ("kernel_shape", "strides", "dilations"):
        if key in attrs:
            attrs[key] = [1, *attrs[key]]
    if "pads" in attrs:
        attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    flat = replace(node, outputs=[f"{node.name}:2d"], attrs=attrs)
    conv(lw, flat, [Dyn((*x.shape[:2], 1, x.shape[2]), x.storage), w[:, :, None, :],
                    *args[2:]])
    out = lw.values[flat.outputs[0]]
    assert isinstance(out, Dyn)
    lw.values[node.outputs[0]] = Dyn((*out.shape[:2], out.shape[3]), out.storage)
