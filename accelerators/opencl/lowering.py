"""Compiles a graph for one batch size into a launch list: shapes are inferred and constant
subgraphs folded with that batch size, each remaining node becomes one or two kernel launches
on named buffers (`Ref`), and reshapes become aliases of their input's buffer."""

from __future__ import annotations

import math

import numpy as np

from accelerators.opencl.elementwise_lowering import ElementwiseLowering
from accelerators.opencl.host_ops import evaluate, view_shape, window
from accelerators.opencl.ir import Graph, Node, UnsupportedModelError
from accelerators.opencl.launch import (
    WG_1D,
    Build,
    Dyn,
    Launch,
    Lowered,
    Ref,
    Samples,
    activation_args,
    ints,
    round_up,
)
from accelerators.opencl.layout_lowering import LayoutLowering
from accelerators.opencl.matmul_lowering import MatMulLowering
from accelerators.opencl.norm_lowering import NormLowering, axis_range
from accelerators.opencl.pipeline_lowering import PipelineLowering
from accelerators.opencl.quant_lowering import QuantLowering


class Lowering(MatMulLowering, LayoutLowering, ElementwiseLowering, NormLowering, QuantLowering,
               PipelineLowering):
    def __init__(self, graph: Graph, batch: int, build: Build,
                 samples: Samples | None = None) -> None:
        self.graph, self.out, self.build = graph, Lowered(dtype=build.dtype), build
        self.tiling, self.pipelined = build.tiling, build.pipelined
        self.values: dict[str, np.ndarray | Dyn] = dict(graph.consts)
        # Folded values that depend on this batch size (on a Shape): their device copies are
        # keyed apart from other batch sizes' (the engine shares constants between plans).
        self.batch, self.per_batch = batch, set[str]()
        for name, dims in graph.inputs:
            sample = samples.get(name) if samples else None
            shape = tuple(batch if d == -1 else d for d in dims) if sample is None else (
                batch if dims[0] == -1 else dims[0], *sample)
            self.values[name] = self.out.inputs[name] = self._new(name, shape)

    def run(self) -> Lowered:
        for node in self.graph.nodes:
            args = [self.values.get(i) if i else None for i in node.inputs]
            missing = [i for i, v in zip(node.inputs, args) if i and v is None]
            if missing:
                raise UnsupportedModelError(f"node {node.name!r} reads unknown {missing}")
            if node.op in ("Shape", "Size") and isinstance(args[0], Dyn):
                args = [np.broadcast_to(np.float32(0), args[0].shape)]  # only its shape is read
                self.per_batch.update(node.outputs)
            if all(not isinstance(v, Dyn) for v in args):
                self._fold(node, args)
            elif node.op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
                shape = view_shape(node, args[0].shape, args[1:], self.graph.opset)
                self.values[node.outputs[0]] = Dyn(shape, args[0].storage)
            else:
                lower = getattr(self, f"_{node.op.lower()}", None)
                if lower is None:
                    raise UnsupportedModelError(
                        f"op {node.op!r} (domain 'ai.onnx') of node {node.name!r} is not "
                        f"supported by the OpenCL engine on activations (only where its inputs "
                        f"are constants or shapes)")
                lower(node, args)
        for name, _ in self.graph.outputs:
            value = self.values[name]
            if not isinstance(value, Dyn):
                raise UnsupportedModelError(f"graph output {name!r} is a constant")
            self.out.outputs[name] = value
        return self.out

    def _fold(self, node: Node, args: list) -> None:
        """A node whose inputs are all known on the host (constants, shapes) becomes constants,
        its fused activation applied."""
        outs = evaluate(node, args, self.graph.opset)
        act = node.attrs.get("activation")
        if act is not None:
            outs[0] = evaluate(act, [outs[0]] + [self.values.get(i) if i else None
                                                 for i in act.inputs[1:]], self.graph.opset)[0]
        self.values.update(zip(node.outputs, outs))
        if self.per_batch.intersection(node.inputs):
            self.per_batch.update(node.outputs)

    # --- buffers
    def _new(self, name: str, shape: tuple[int, ...], itemsize: int | None = None) -> Dyn:
        """A tensor of `itemsize` bytes per value; by default the build's (fp32 or fp16)."""
        size = itemsize or np.dtype(self.build.dtype).itemsize
        self.out.storages[name] = size * math.prod(shape)
        return Dyn(tuple(shape), name)

    def _ref(self, value: np.ndarray | Dyn, key: str, dtype: type | None = None) -> Ref:
        """A device constant, by default of the build's float type."""
        if isinstance(value, Dyn):
            return Ref(value.storage)
        if key in self.per_batch:
            key = f"{key}@batch{self.batch}"
        self.out.consts.setdefault(key, np.ascontiguousarray(value, dtype or self.build.dtype))
        return Ref(key)

    def _emit(self, node: Node, kernel: str, size: int | tuple[int, ...], args: list,
              flops: int = 0) -> None:
        """A launch of work-groups of WG_1D along the first dimension of `size`."""
        size = (size,) if isinstance(size, int) else size
        self.out.launches.append(Launch(kernel, (round_up(size[0], WG_1D), *size[1:]),
                                        (WG_1D,) + (1,) * (len(size) - 1), args, node.name,
                                        flops))

    def _pool(self, node: Node, args: list, is_max: bool) -> None:
        x = args[0]
        if len(x.shape) != 4:
            raise UnsupportedModelError(f"node {node.name!r}: only 2-D pooling is supported")
        n, c, h, w = x.shape
        kh, kw = node.attrs["kernel_shape"]
        (oh, ow), (sh, sw), (dh, dw), (ph, pw), (eh, ew) = window(node, (h, w), (kh, kw))
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (n, c, oh, ow))
        valid = (ph, pw) == (0, 0) and (oh - 1) * sh + (kh - 1) * dh < h \
            and (ow - 1) * sw + (kw - 1) * dw < w  # every window inside the input
        if valid and not self.tiling:  # CPUs (GPUs and FPGAs: a work-item per pixel)
            self._emit(node, "pool2d_rows", n * c * oh, [
                Ref(x.storage), Ref(out.storage), *ints(n * c * oh, h, w, oh, ow, kh, kw, sh, sw,
                                                         dh, dw, is_max)])
            return
        if valid:
            self._emit(node, "pool2d_valid", (oh * ow, n * c), [
                Ref(x.storage), Ref(out.storage), *ints(h, w, oh, ow, kh, kw, sh, sw, dh, dw,
                                                         is_max)])
            return
        self._emit(node, "pool2d", (oh * ow, n * c), [Ref(x.storage), Ref(out.storage), *ints(
            n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, dh, dw, is_max,
            node.attrs.get("count_include_pad", 0))])

    def _maxpool(self, node: Node, args: list) -> None:
        self._pool(node, args, True)

    def _averagepool(self, node: Node, args: list) -> None:
        self._pool(node, args, False)

    def _mean_of_last_axes(self, node: Node, x: Dyn, first: int, keep: bool) -> None:
        """The mean over axes first.. of x, one work-item per value kept."""
        rank = len(x.shape)
        shape = x.shape[:first] + ((1,) * (rank - first) if keep else ())
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], shape)
        rows = math.prod(x.shape[:first])
        self._emit(node, "global_avg_pool", rows, [Ref(x.storage), Ref(out.storage),
                                                   *ints(rows, math.prod(x.shape[first:]))])

    def _globalaveragepool(self, node: Node, args: list) -> None:
        self._mean_of_last_axes(node, args[0], 2, True)

    def _reducemean(self, node: Node, args: list) -> None:
        """Over trailing axes: torchvision's `x.mean([2, 3])` (ShuffleNet's global pool), by the
        global pool's kernel; over other adjacent axes (MLP-Mixer's mean over tokens):
        norm_lowering's row reduction."""
        x, rank = args[0], len(args[0].shape)
        axes = node.attrs.get("axes") if len(args) < 2 or args[1] is None else args[1]
        first, last = axis_range(node, axes, rank) if isinstance(axes, np.ndarray | list) \
            and np.size(axes) else (0, 0)  # no axes: all, or none (_reduce_rows decides)
        if last != rank - 1:
            self._reduce_rows(node, args)
            return
        self._mean_of_last_axes(node, x, first, bool(node.attrs.get("keepdims", 1)))

    def _lrn(self, node: Node, args: list) -> None:
        x, a = args[0], node.attrs
        n, c = x.shape[:2]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        hw = math.prod(x.shape[2:])
        self._emit(node, "lrn", (hw, c, n), [
            Ref(x.storage), Ref(out.storage), *ints(c, hw, a["size"]),
            np.float32(a.get("alpha", 1e-4)), np.float32(a.get("beta", 0.75)),
            np.float32(a.get("bias", 1.0))])

    def _activation(self, node: Node, args: list) -> None:
        x = args[0]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        self._emit(node, "activation", math.prod(x.shape), [
            Ref(x.storage), Ref(out.storage), np.int32(math.prod(x.shape)),
            *activation_args(node, self.values)])

    _relu = _leakyrelu = _clip = _sigmoid = _hardsigmoid = _hardswish = _silu = _activation

    def _batchnormalization(self, node: Node, args: list) -> None:
        """One not folded into a convolution: a scale and shift per channel (axis 1)."""
        x = args[0]
        if any(isinstance(v, Dyn) for v in args[1:5]):
            raise UnsupportedModelError(f"BatchNormalization node {node.name!r}: scale, bias, "
                                        f"mean and variance must be constant")
        gamma, beta, mean, var = (np.asarray(v, np.float64) for v in args[1:5])
        scale = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
        c, hw = x.shape[1], math.prod(x.shape[2:])
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        self._emit(node, "channel_affine", (hw, x.shape[0] * c), [
            Ref(x.storage), self._ref(scale, f"{node.name}:scale"),
            self._ref(beta - mean * scale, f"{node.name}:shift"), Ref(out.storage),
            *ints(c, hw), *activation_args(node, self.values)], 2 * math.prod(x.shape))

    def _concat(self, node: Node, args: list) -> None:
        rank = len(args[0].shape)
        axis = node.attrs["axis"] % rank
        shape = list(args[0].shape)
        shape[axis] = sum(v.shape[axis] for v in args)
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], tuple(shape))
        outer, offset = math.prod(shape[:axis]), 0
        for v, name in zip(args, node.inputs):
            inner = math.prod(v.shape[axis:])
            self._emit(node, "copy_strided", outer * inner, [
                self._ref(v, name), Ref(out.storage),
                *ints(outer, inner, math.prod(shape[axis:]), offset)])
            offset += inner

    def _softmax(self, node: Node, args: list) -> None:
        """Over one axis from opset 13 (its values `inner` apart where it is not the last),
        over the axes from `axis` on before (the input coerced to 2-D)."""
        x = args[0]
        rank = len(x.shape)
        axis = node.attrs.get("axis", 1 if self.graph.opset < 13 else -1) % rank
        last = axis if self.graph.opset >= 13 else rank - 1
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        cols = math.prod(x.shape[axis:last + 1])
        rows = math.prod(x.shape) // cols
        self._emit(node, "softmax_rows", rows, [Ref(x.storage), Ref(out.storage), *ints(
            rows, cols, math.prod(x.shape[last + 1:]))])


def lower(graph: Graph, batch: int, build: Build = Build(),
          samples: Samples | None = None) -> Lowered:
    """`build.tiling`: GEMMs and convolutions staged through local memory in tiles of that size
    (GPUs, FPGAs) instead of the register tiles that suit CPUs. `build.pipelined`: fp32
    convolutions through the pipelined kernels (kernels/pipelined.cl). `build.half`: tensors
    and float weights stored as fp16. `samples`: each input's shape after the batch axis, where
    the graph leaves dims variable (a request's shape); by default the graph's."""
    return Lowering(graph, batch, build, samples).run()
