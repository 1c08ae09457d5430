"""Lowering of convolutions to the pipelined kernels of kernels/pipelined.cl (engine option
`pipelined`, built with -DPIPELINED): three single work-item stages chained by FIFOs, each on its
own queue (executor.py). With channels or pipes (FPGAs, `Build.fifo`) the stages run at once
and take no FIFO argument; elsewhere the FIFOs are buffers in global memory and each stage
waits for the one before."""

from __future__ import annotations

import numpy as np

from accelerators.opencl.ir import Node, UnsupportedModelError
from accelerators.opencl.launch import Dyn, Launch, Ref, activation_args, ints
from accelerators.opencl.lowering_state import Lowering

PIPE_MAX_K = 4608  # kernels/pipelined.cl: the longest window kept on chip
STAGES = ("pipe_conv_feed", "pipe_conv_mac", "pipe_conv_drain")  # Launch.stage 1, 2, 3


def _stage(lw: Lowering, node: Node, kernel: str, args: list, flops: int = 0) -> None:
    stage = STAGES.index(kernel) + 1
    lw.out.launches.append(Launch(kernel, (1,), (1,), args, node.name, flops, stage))


def conv_pipelined(lw: Lowering, node: Node, args: list, out: Dyn,
                   geometry: list[int]) -> None:
    """`out` and `geometry`: conv_lowering's output and im2col arguments."""
    x, w = args[0], args[1]
    n, oc, g = x.shape[0], w.shape[0], node.attrs.get("group", 1)
    cg, oh, ow, kh, kw = geometry[0], geometry[3], geometry[4], geometry[5], geometry[6]
    mg, kg, p, planes = oc // g, cg * kh * kw, oh * ow, n * g
    if kg > PIPE_MAX_K:
        raise UnsupportedModelError(
            f"Conv node {node.name!r}: a window of {kg} values exceeds the pipelined "
            f"kernels' {PIPE_MAX_K}")
    if lw.build.fifo:  # program-scope channels or pipes
        col, sums = [], []
    else:
        col = [Ref(lw.new(f"{node.name}:col_fifo", (planes * p * kg,)).storage)]
        sums = [Ref(lw.new(f"{node.name}:sum_fifo", (planes * p * mg,)).storage)]
    weights = lw.ref(w.reshape(oc, kg), node.inputs[1])
    has_bias = len(args) > 2 and args[2] is not None
    bias = lw.ref(args[2], node.inputs[2]) if has_bias else weights
    _stage(lw, node, "pipe_conv_feed", [Ref(x.storage), *col, np.int32(planes),
                                        *ints(*geometry)])
    _stage(lw, node, "pipe_conv_mac", [weights, *col, *sums, *ints(planes, g, p, mg, kg)],
           2 * n * oc * kg * p)
    _stage(lw, node, "pipe_conv_drain", [bias, Ref(out.storage), *sums, *ints(
        planes, g, p, mg, has_bias), *activation_args(node, lw.values)])
