"""Compiles a graph for one batch size into a launch list: shapes are inferred and constant
subgraphs folded with that batch size, each remaining node becomes one or two kernel launches
on named buffers (`Ref`), and reshapes become aliases of their input's buffer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from accelerators.opencl.graph import Graph, Node, UnsupportedModelError
from accelerators.opencl.host_ops import fold, view_shape, window

# Work-group sizes and vector width: program_cache.BUILD_OPTIONS passes them to the kernels.
WG_1D, GEMM_WG, VN = 64, 4, 16
GEMV_SPLIT_K = 1024  # one-row GEMMs with K at least this split K across work-items
LOCAL_TILE, LOCAL_ROWS = 32, 4  # gemm_local's TS x TS tile, TS / WPT rows of work-items
ACT = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4}
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Sum": 0}
BIAS_NONE, BIAS_ROW, BIAS_COL = 0, 1, 2


@dataclass(frozen=True)
class Ref:
    """A device buffer: a planned buffer (`storage`) or an uploaded constant."""
    name: str


@dataclass(frozen=True)
class Dyn:
    shape: tuple[int, ...]
    storage: str  # the buffer holding it; reshapes share their input's


@dataclass
class Launch:
    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    args: list
    node: str
    flops: int = 0


@dataclass
class Lowered:
    launches: list[Launch] = field(default_factory=list)
    storages: dict[str, int] = field(default_factory=dict)  # name -> bytes
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # device constants, float32
    inputs: dict[str, Dyn] = field(default_factory=dict)
    outputs: dict[str, Dyn] = field(default_factory=dict)


def _up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _i(*values: int) -> list[np.int32]:
    return [np.int32(v) for v in values]


def _act(node: Node, consts: dict[str, np.ndarray]) -> list:
    """(code, a, b) of the activation fused into `node`, or of `node` itself."""
    act = node if node.op in ACT else node.attrs.get("activation")
    if act is None:
        return [np.int32(0), np.float32(0), np.float32(0)]
    a = b = 0.0
    if act.op == "LeakyRelu":
        a = act.attrs.get("alpha", 0.01)
    elif act.op == "Clip":
        bounds = [consts[i] if i else None for i in act.inputs[1:3]] + [None, None]
        a = float(bounds[0]) if bounds[0] is not None else act.attrs.get("min", -3.4e38)
        b = float(bounds[1]) if bounds[1] is not None else act.attrs.get("max", 3.4e38)
    return [np.int32(ACT[act.op]), np.float32(a), np.float32(b)]


class Lowering:
    def __init__(self, graph: Graph, batch: int, local_tiles: bool) -> None:
        self.graph, self.out, self.local_tiles = graph, Lowered(), local_tiles
        self.values: dict[str, np.ndarray | Dyn] = dict(graph.consts)
        for name, dims in graph.inputs:
            shape = tuple(batch if d == -1 else d for d in dims)
            self.values[name] = self.out.inputs[name] = self._new(name, shape)

    def run(self) -> Lowered:
        for node in self.graph.nodes:
            args = [self.values.get(i) if i else None for i in node.inputs]
            missing = [i for i, v in zip(node.inputs, args) if i and v is None]
            if missing:
                raise UnsupportedModelError(f"node {node.name!r} reads unknown {missing}")
            if all(not isinstance(v, Dyn) for v in args) and node.op != "Shape":
                self.values[node.outputs[0]] = fold(node, args, self.graph.opset)
            elif node.op == "Shape":
                shape = args[0].shape
                start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
                self.values[node.outputs[0]] = np.array(shape[start:end], np.int64)
            elif node.op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze"):
                shape = view_shape(node, args[0].shape, args[1:], self.graph.opset)
                self.values[node.outputs[0]] = Dyn(shape, args[0].storage)
            else:
                lower = getattr(self, f"_{node.op.lower()}", None)
                if lower is None:
                    raise UnsupportedModelError(
                        f"op {node.op!r} of node {node.name!r} is supported on constants only")
                lower(node, args)
        for name, _ in self.graph.outputs:
            value = self.values[name]
            if not isinstance(value, Dyn):
                raise UnsupportedModelError(f"graph output {name!r} is a constant")
            self.out.outputs[name] = value
        return self.out

    # --- buffers
    def _new(self, name: str, shape: tuple[int, ...]) -> Dyn:
        self.out.storages[name] = 4 * math.prod(shape)
        return Dyn(tuple(shape), name)

    def _ref(self, value: np.ndarray | Dyn, key: str) -> Ref:
        if isinstance(value, Dyn):
            return Ref(value.storage)
        self.out.consts.setdefault(key, np.ascontiguousarray(value, np.float32))
        return Ref(key)

    def _emit(self, node: Node, kernel: str, size: int | tuple[int, ...], args: list,
              flops: int = 0) -> None:
        """A launch of work-groups of WG_1D along the first dimension of `size`."""
        size = (size,) if isinstance(size, int) else size
        self.out.launches.append(Launch(kernel, (_up(size[0], WG_1D), *size[1:]),
                                        (WG_1D,) + (1,) * (len(size) - 1), args, node.name,
                                        flops))

    def _launch_gemm(self, node: Node, a: Ref, b: Ref, bias: Ref | None, c: Ref, m: int,
                     n: int, k: int, lds: tuple[int, int, int], groups: int,
                     strides: tuple[int, ...], bias_mode: int, act: list, flops: int) -> None:
        """C = act(A x B + bias) for each z; `lds` are the row strides of A, B, C; `strides`
        the per-batch and per-group offsets of A, B, C, then the number of z."""
        args = [a, b, bias or a, c, *_i(m, n, k, *lds, groups, *strides[:-1], bias_mode), *act]
        if self.local_tiles:
            size = (_up(n, LOCAL_TILE), _up(m, LOCAL_TILE) // LOCAL_TILE * LOCAL_ROWS,
                    strides[-1])
            self.out.launches.append(Launch("gemm_local", size, (LOCAL_TILE, LOCAL_ROWS, 1),
                                            args + [np.int32(0)], node.name, flops))
            return
        tm = 8 if m >= 8 else 1
        rows_first = n >= m  # B (k x n) is the larger operand: walk row tiles fastest
        tiles = (-(-m // tm), -(-n // VN)) if rows_first else (-(-n // VN), -(-m // tm))
        size = (_up(tiles[0], GEMM_WG), tiles[1], strides[-1])
        self.out.launches.append(Launch(f"gemm{tm}", size, (GEMM_WG, 1, 1),
                                        args + [np.int32(rows_first)], node.name, flops))

    # --- kernel ops
    def _conv(self, node: Node, args: list) -> None:
        x, w = args[0], args[1]
        if not isinstance(w, np.ndarray) or len(w.shape) != 4 or len(x.shape) != 4:
            raise UnsupportedModelError(
                f"node {node.name!r}: only 2-D Conv with constant weights is supported")
        n, c, h, wd = x.shape
        oc, cg, kh, kw = w.shape
        g = node.attrs.get("group", 1)
        (oh, ow), (sh, sw), (dh, dw), (ph, pw), _ = window(node, (h, wd), (kh, kw))
        mg, kg, p = oc // g, cg * kh * kw, oh * ow
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (n, oc, oh, ow))
        if (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd):
            col = Ref(x.storage)  # a 1x1 convolution reads its input as the GEMM's B
        else:
            col = Ref(self._new(f"{node.name}:col", (n * g * kg * p,)).storage)
            self._emit(node, "im2col", (kg, n * g), [Ref(x.storage), col, *_i(
                cg, h, wd, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw)])
        weights = self._ref(w.reshape(oc, kg), node.inputs[1])
        bias = self._ref(args[2], node.inputs[2]) if len(args) > 2 and args[2] is not None \
            else None
        self._launch_gemm(node, weights, col, bias, Ref(out.storage), mg, p, kg, (kg, p, p), g,
                          (0, mg * kg, g * kg * p, kg * p, oc * p, mg * p, n * g),
                          BIAS_ROW if bias else BIAS_NONE, _act(node, self.values),
                          2 * n * oc * kg * p)

    def _gemm_node(self, node: Node, args: list, alpha: float, beta: float,
                   trans_b: bool) -> None:
        x, w = args[0], args[1]
        if not isinstance(x, Dyn) or len(x.shape) != 2 or not isinstance(w, np.ndarray) \
                or w.ndim != 2 or node.attrs.get("transA", 0):
            raise UnsupportedModelError(
                f"{node.op} node {node.name!r}: only a 2-D activation times a constant 2-D "
                f"matrix (transA=0) is supported")
        wkey = f"{node.inputs[1]}:T" if trans_b or alpha != 1 else node.inputs[1]
        if wkey not in self.graph.derived:  # transposed once, whatever the batch size
            self.graph.derived[wkey] = np.ascontiguousarray(
                (w.T if trans_b else w) * np.float32(alpha), np.float32)
        wt = self.graph.derived[wkey]
        m, k = x.shape
        n = wt.shape[1]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (m, n))
        bias = None
        if len(args) > 2 and args[2] is not None:
            c = np.asarray(args[2], np.float32) * np.float32(beta)
            if c.size not in (1, n) or c.ndim > 1 and c.shape[0] != 1:
                raise UnsupportedModelError(
                    f"Gemm node {node.name!r}: bias of shape {list(c.shape)} is not a row")
            bias = self._ref(np.broadcast_to(c.reshape(-1), (n,)), f"{node.name}:bias")
        if m == 1 and k >= GEMV_SPLIT_K and not self.local_tiles:
            self._gemv(node, Ref(x.storage), self._ref(wt, wkey), bias, Ref(out.storage), n, k)
            return
        self._launch_gemm(node, Ref(x.storage), self._ref(wt, wkey), bias, Ref(out.storage),
                          m, n, k, (k, n, n), 1, (0, 0, 0, 0, 0, 0, 1),
                          BIAS_COL if bias else BIAS_NONE, _act(node, self.values), 2 * m * n * k)

    def _gemv(self, node: Node, x: Ref, w: Ref, bias: Ref | None, out: Ref, n: int,
              k: int) -> None:
        """One sample, K split in chunks of GEMV_SPLIT_K / 4 summed by a second launch."""
        chunk = GEMV_SPLIT_K // 4
        splits = -(-k // chunk)
        partial = Ref(self._new(f"{node.name}:partial", (splits, n)).storage)
        self.out.launches.append(Launch(
            "gemv_partial", (_up(-(-n // VN), GEMM_WG), splits), (GEMM_WG, 1), [
                x, w, partial, *_i(n, k, n, chunk)], node.name, 2 * n * k))
        self._emit(node, "gemv_reduce", n, [partial, bias or w, out,
                                             *_i(n, splits, bias is not None),
                                             *_act(node, self.values)])

    def _gemm(self, node: Node, args: list) -> None:
        a = node.attrs
        self._gemm_node(node, args, a.get("alpha", 1.0), a.get("beta", 1.0), a.get("transB", 0))

    def _matmul(self, node: Node, args: list) -> None:
        self._gemm_node(node, args[:2], 1.0, 0.0, False)

    def _pool(self, node: Node, args: list, is_max: bool) -> None:
        x = args[0]
        if len(x.shape) != 4:
            raise UnsupportedModelError(f"node {node.name!r}: only 2-D pooling is supported")
        n, c, h, w = x.shape
        kh, kw = node.attrs["kernel_shape"]
        (oh, ow), (sh, sw), (dh, dw), (ph, pw), (eh, ew) = window(node, (h, w), (kh, kw))
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], (n, c, oh, ow))
        self._emit(node, "pool2d", (oh * ow, n * c), [Ref(x.storage), Ref(out.storage), *_i(
            n * c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, dh, dw, is_max,
            node.attrs.get("count_include_pad", 0))])

    def _maxpool(self, node: Node, args: list) -> None:
        self._pool(node, args, True)

    def _averagepool(self, node: Node, args: list) -> None:
        self._pool(node, args, False)

    def _globalaveragepool(self, node: Node, args: list) -> None:
        x = args[0]
        n, c = x.shape[:2]
        out = self.values[node.outputs[0]] = self._new(
            node.outputs[0], (n, c) + (1,) * (len(x.shape) - 2))
        self._emit(node, "global_avg_pool", n * c, [Ref(x.storage), Ref(out.storage),
                                                    *_i(n * c, math.prod(x.shape[2:]))])

    def _lrn(self, node: Node, args: list) -> None:
        x, a = args[0], node.attrs
        n, c = x.shape[:2]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        hw = math.prod(x.shape[2:])
        self._emit(node, "lrn", (hw, c, n), [
            Ref(x.storage), Ref(out.storage), *_i(c, hw, a["size"]),
            np.float32(a.get("alpha", 1e-4)), np.float32(a.get("beta", 0.75)),
            np.float32(a.get("bias", 1.0))])

    def _binary(self, node: Node, args: list) -> None:
        if len(args) == 1:  # a one-input Sum is its input
            self.values[node.outputs[0]] = args[0]
            return
        if len(args) != 2:
            raise UnsupportedModelError(f"node {node.name!r}: {node.op} of {len(args)} inputs "
                                        f"is supported only with 1 or 2")
        shapes = [tuple(v.shape) for v in args]
        shape = np.broadcast_shapes(*shapes)
        if len(shape) > 4:
            raise UnsupportedModelError(f"node {node.name!r}: {node.op} over rank "
                                        f"{len(shape)} > 4")
        dims = (1,) * (4 - len(shape)) + tuple(shape)
        strides = []
        for s in shapes:
            s = (1,) * (4 - len(s)) + s
            contiguous = [math.prod(s[i + 1:]) for i in range(4)]
            strides += [0 if s[i] == 1 and dims[i] != 1 else contiguous[i] for i in range(4)]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], shape)
        refs = [self._ref(v, i) for v, i in zip(args, node.inputs)]
        self._emit(node, "binary4d", (dims[2] * dims[3], dims[0] * dims[1]), [
            *refs, Ref(out.storage), *_i(*dims[1:], *strides, BINARY[node.op]),
            *_act(node, self.values)])

    _add = _sub = _mul = _div = _sum = _binary

    def _activation(self, node: Node, args: list) -> None:
        x = args[0]
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        self._emit(node, "activation", math.prod(x.shape), [
            Ref(x.storage), Ref(out.storage), np.int32(math.prod(x.shape)),
            *_act(node, self.values)])

    _relu = _leakyrelu = _clip = _sigmoid = _activation

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
                *_i(outer, inner, math.prod(shape[axis:]), offset)])
            offset += inner

    def _softmax(self, node: Node, args: list) -> None:
        x = args[0]
        rank = len(x.shape)
        axis = node.attrs.get("axis", 1 if self.graph.opset < 13 else -1) % rank
        if self.graph.opset >= 13 and axis != rank - 1:
            raise UnsupportedModelError(f"Softmax node {node.name!r}: only the last axis is "
                                        f"supported, not axis {axis} of {rank}")
        out = self.values[node.outputs[0]] = self._new(node.outputs[0], x.shape)
        rows = math.prod(x.shape[:axis])
        self._emit(node, "softmax_rows", rows, [Ref(x.storage), Ref(out.storage),
                                                *_i(rows, math.prod(x.shape[axis:]))])


def lower(graph: Graph, batch: int, local_tiles: bool = False) -> Lowered:
    """`local_tiles`: GEMMs staged through local memory (GPUs, FPGAs) instead of the register
    tiles that suit CPUs."""
    return Lowering(graph, batch, local_tiles).run()
