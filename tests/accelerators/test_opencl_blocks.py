"""Whole blocks of today's vision models, built with onnx.helper as torch exports them, against
ONNX Runtime: a ConvNeXt block served by the daemon through the OpenCL engine, and a Swin block
with shifted windows (roll as Slice + Concat, rank-6 window partition, relative position bias
gathered from a constant table, the shift's attention mask) on the engine; and the pieces
they need beside the normalizations: Einsum as a batched matrix product (MaxViT's attention),
a Pad of zero amounts (Swin's windows); for other zoos' models, Softmax over any axis (ResNeSt,
CoaT), Pad by reflection (TResNet), edge or wrap, and 1-D Conv (ECA-Net)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from accelerators.onnx_models import make_model
from accelerators.opencl.ir import UnsupportedModelError
from tests.support.numerics import fresh_rng, rel_err
from tests.support.onnx_graphs import check, gelu_nodes, graph
from tests.support.served import served

TOL = 1e-4


class Block:
    """Nodes and initializers of a graph under construction, with fresh names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.nodes, self.consts, self.count = rng, [], {}, 0

    def const(self, value: np.ndarray) -> str:
        self.count += 1
        name = f"k{self.count}"
        self.consts[name] = np.asarray(value)
        return name

    def weight(self, *shape: int, scale: float = 1.0) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        return self.const((self.rng.standard_normal(shape) * scale / np.sqrt(fan_in)).astype(
            np.float32))

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}{self.count}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int) -> str:
        """nn.Linear on (..., cin) as torch exports it: MatMul, then Add of the bias."""
        bias = self.const((self.rng.standard_normal(cout) * 0.1).astype(np.float32))
        return self.op("Add", self.op("MatMul", x, self.weight(cin, cout)), bias)

    def layer_norm(self, x: str, c: int) -> str:
        return self.op("LayerNormalization", x,
                       self.const(self.rng.uniform(0.5, 1.5, c).astype(np.float32)),
                       self.const(self.rng.uniform(-0.5, 0.5, c).astype(np.float32)),
                       axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        """Exact GELU spelled out as torch exports it (its names are fixed: once per graph)."""
        nodes, consts = gelu_nodes("erf", x, "gelu")
        self.nodes += nodes
        self.consts |= consts
        return "gelu"

    def mlp(self, x: str, c: int) -> str:
        return self.linear(self.gelu(self.linear(x, c, 4 * c)), 4 * c, c)

    def model(self, x: str, shape: list, y: str) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [y], ["y"]))
        model = make_model(helper.make_graph(
            self.nodes, "block", [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
            [numpy_helper.from_array(v, k) for k, v in self.consts.items()]), 17)
        return model


def convnext_block(rng: np.random.Generator, c: int, size: int) -> onnx.ModelProto:
    """torchvision's CNBlock: depthwise 7x7, permute to NHWC, LayerNorm, Linear, GELU, Linear,
    permute back, layer scale, residual."""
    b = Block(rng)
    dw = b.op("Conv", "x", b.weight(c, 1, 7, 7), b.const(np.zeros(c, np.float32)), group=c,
              kernel_shape=[7, 7], pads=[3, 3, 3, 3])
    h = b.mlp(b.layer_norm(b.op("Transpose", dw, perm=[0, 2, 3, 1]), c), c)
    scaled = b.op("Mul", b.op("Transpose", h, perm=[0, 3, 1, 2]),
                  b.const(rng.uniform(0.5, 1, (c, 1, 1)).astype(np.float32)))
    return b.model("x", ["batch", c, size, size], b.op("Add", scaled, "x"))


def test_daemon_serves_a_convnext_block_through_opencl(tmp_path) -> None:
    c, size = 16, 14
    model = convnext_block(fresh_rng()[0], c, size)
    x = fresh_rng()[0].standard_normal((5, c, size, size)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for (lo, hi), got in zip(((0, 1), (1, 5)), served(tmp_path, "convnext_block", model, x,
                                                      [(0, 1), (1, 5)])):
        assert rel_err(got, ref[lo:hi]) <= TOL


def _roll(b: Block, x: str, shift: int, size: int) -> str:
    """torch.roll(x, (shift, shift), dims=(1, 2)) as exported: two Slices and a Concat per axis."""
    for axis in (1, 2):
        cut = -shift % size
        head = b.op("Slice", x, b.const(np.array([cut])), b.const(np.array([size])),
                    b.const(np.array([axis])))
        tail = b.op("Slice", x, b.const(np.array([0])), b.const(np.array([cut])),
                    b.const(np.array([axis])))
        x = b.op("Concat", head, tail, axis=axis)
    return x


def _windows(size: int, window: int) -> np.ndarray:
    """For each position of a window-sized grid, its window's offsets (as torchvision's
    relative_position_index): index into the (2 window - 1)^2 bias table."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(
        2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + window - 1
    return (rel[..., 0] * (2 * window - 1) + rel[..., 1]).reshape(-1)


def _shift_mask(size: int, window: int, shift: int) -> np.ndarray:
    """torchvision's attention mask of shifted windows: -100 between regions the roll joined."""
    regions = np.zeros((size, size))
    count = 0
    for hs in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
        for ws in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
            regions[hs, ws] = count
            count += 1
    n = size // window
    wins = regions.reshape(n, window, n, window).transpose(0, 2, 1, 3).reshape(n * n, -1)
    mask = wins[:, None, :] - wins[:, :, None]
    return np.where(mask != 0, -100.0, 0.0).astype(np.float32)


def swin_block(rng: np.random.Generator, size: int, c: int, heads: int, window: int,
               shift: int) -> onnx.ModelProto:
    """torchvision's SwinTransformerBlock on (n, size, size, c) with shifted windows."""
    b = Block(rng)
    n_win, tokens, d = (size // window) ** 2, window * window, c // heads
    x = _roll(b, b.layer_norm("x", c), -shift, size)
    x = b.op("Reshape", x, b.const(np.array([-1, size // window, window, size // window,
                                            window, c])))
    x = b.op("Reshape", b.op("Transpose", x, perm=[0, 1, 3, 2, 4, 5]),
             b.const(np.array([-1, tokens, c])))
    qkv = b.op("Reshape", b.linear(x, c, 3 * c), b.const(np.array([0, tokens, 3, heads, d])))
    qkv = b.op("Transpose", qkv, perm=[2, 0, 3, 1, 4])
    q, k, v = (b.op("Gather", qkv, b.const(np.array(i)), axis=0) for i in range(3))
    attn = b.op("MatMul", b.op("Mul", q, b.const(np.float32(d ** -0.5))),
                b.op("Transpose", k, perm=[0, 1, 3, 2]))
    table = b.const((rng.standard_normal(((2 * window - 1) ** 2, heads)) * 0.5).astype(
        np.float32))
    bias = b.op("Gather", table, b.const(_windows(size, window)), axis=0)  # folded at load
    bias = b.op("Transpose", b.op("Reshape", bias, b.const(np.array([tokens, tokens, -1]))),
                perm=[2, 0, 1])
    attn = b.op("Add", attn, b.op("Unsqueeze", bias, b.const(np.array([0]))))
    attn = b.op("Reshape", attn, b.const(np.array([-1, n_win, heads, tokens, tokens])))
    mask = _shift_mask(size, window, shift)[None, :, None]
    attn = b.op("Reshape", b.op("Add", attn, b.const(mask)),
                b.const(np.array([-1, heads, tokens, tokens])))
    out = b.op("MatMul", b.op("Softmax", attn, axis=-1), v)
    out = b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]),
               b.const(np.array([-1, tokens, c])))
    out = b.op("Reshape", b.linear(out, c, c), b.const(np.array(
        [-1, size // window, size // window, window, window, c])))
    out = b.op("Reshape", b.op("Transpose", out, perm=[0, 1, 3, 2, 4, 5]),
               b.const(np.array([-1, size, size, c])))
    x = b.op("Add", "x", _roll(b, out, shift, size))
    return b.model("x", ["batch", size, size, c], b.op("Add", x, b.mlp(b.layer_norm(x, c), c)))


def test_swin_block_with_shifted_windows(engine_for) -> None:
    rng, seed = fresh_rng()
    size, c = 8, 16
    model = swin_block(rng, size, c, heads=2, window=4, shift=2)
    engine = engine_for(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = rng.standard_normal((batch, size, size, c)).astype(np.float32)
        ref = session.run(None, {"x": x})[0]
        assert rel_err(engine.run({"x": x}, ["y"])["y"], ref) <= TOL, seed
    assert engine.graph.fused["Gelu(none)"] == 1
    kernels = {la.kernel for la in engine.plan(1).launches}
    norm = "norm_rows" if engine.build.tiling else "norm_rows_serial"
    assert norm in kernels and "softmax_rows" in kernels


@pytest.mark.parametrize("equation, shapes", [
    ("B G H I D, B G H J D -> B G H I J", [(2, 3, 2, 5, 4), (2, 3, 2, 6, 4)]),  # MaxViT's
    ("B G H I J, B G H J D -> B G H I D", [(2, 3, 2, 5, 6), (2, 3, 2, 6, 4)]),
    ("bkd,bjk->bdj", [(3, 7, 5), (3, 4, 7)]),
    ("byhwc,hkc->byhwk", [(2, 3, 4, 5, 6), (4, 7, 6)]),  # MViTv2's relative positions
    ("nqc,ck->kqn", [(2, 5, 3), (3, 4)])], ids=["qk", "av", "both_swapped", "mvit", "to_output"])
def test_einsum_of_a_batched_matrix_product(engine_for, equation, shapes) -> None:
    rng, _ = fresh_rng()
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    model = graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                  {"a": a.shape, "b": b.shape}, {}, ["y"])
    engine = check(engine_for, model, a=a, b=b)
    assert engine.graph.fused["Einsum->MatMul"] == 1


@pytest.mark.parametrize("equation, shapes", [
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("...qd,...kd", [(2, 3, 5, 4), (2, 3, 6, 4)]),  # implicit output: ...kq, sorted
    ("...ij,jk->...ik", [(2, 3, 4, 5), (5, 6)]),  # a weight without the ellipsis
    ("b...ik,b...kj->b...ij", [(2, 3, 4, 5), (2, 3, 5, 6)]),  # the ellipsis in the middle
    ("...ij,...jk->...ik", [(2, 1, 4, 5), (1, 3, 5, 6)]),  # broadcast size-1 dims
    ("...ij,...jk->...ik", [(4, 5), (5, 6)])], ids=[  # an empty ellipsis
        "batched", "implicit", "one_sided", "middle", "broadcast", "empty"])
def test_einsum_with_an_ellipsis(engine_for, equation, shapes) -> None:
    rng, _ = fresh_rng()
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    model = graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                  {"a": a.shape, "b": b.shape}, {}, ["y"])
    check(engine_for, model, a=a, b=b)


def test_einsum_with_an_ellipsis_of_another_kind_is_refused(engine_for) -> None:
    model = graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation="...i,...i->...",
                                    name="dot")], {"a": (2, 3), "b": (2, 3)}, {}, ["y"])
    with pytest.raises(UnsupportedModelError,
                       match=r"op 'Einsum' .* node 'dot', equation '...i,...i->...'"):
        engine_for(model)


def test_einsum_of_another_kind_is_refused(engine_for) -> None:
    model = graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,ij->i",
                                    name="dot")], {"a": (2, 3), "b": (2, 3)}, {}, ["y"])
    with pytest.raises(UnsupportedModelError, match=r"op 'Einsum' .* node 'dot'"):
        engine_for(model)


def test_a_pad_of_zero_amounts_is_a_view(engine_for) -> None:
    """Swin's window padding where the windows tile the feature map."""
    x = fresh_rng()[0].standard_normal((2, 8, 8, 3)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    engine = check(engine_for, graph(nodes, {"x": x.shape}, {"pads": np.zeros(8, np.int64)},
                                     ["y"]), x=x)
    assert [la.kernel for la in engine.plan(2).launches] == ["activation"]


@pytest.mark.parametrize("shape, axis, opset", [
    ((2, 2, 3, 16), 1, 17),  # ResNeSt's softmax over its radix
    ((2, 4, 49, 8), 2, 17),  # CoaT's over tokens
    ((3, 5, 7), 0, 17), ((3, 4, 5), 1, 11)], ids=str)  # opset 11: axes 1.. coerced to one
def test_softmax_over_any_axis(engine_for, shape, axis, opset) -> None:
    x = (fresh_rng()[0].standard_normal(shape) * 3).astype(np.float32)
    check(engine_for, graph([helper.make_node("Softmax", ["x"], ["y"], axis=axis)],
                            {"x": shape}, {}, ["y"], opset), x=x)


@pytest.mark.parametrize("mode, amounts, opset", [
    ("reflect", [0, 0, 1, 1, 0, 0, 1, 1], 17),  # TResNet's blur pool
    ("reflect", [0, 0, 2, 0, 0, 0, 0, 3], 17), ("edge", [0, 1, 2, 0, 0, 0, 1, 3], 17),
    ("wrap", [0, 0, 3, 1, 0, 0, 2, 4], 19)], ids=str)
def test_pad_by_reflection_edge_or_wrap(engine_for, mode, amounts, opset) -> None:
    x = fresh_rng()[0].standard_normal((2, 3, 5, 4)).astype(np.float32)
    node = helper.make_node("Pad", ["x", "amounts"], ["y"], mode=mode)
    check(engine_for, graph([node], {"x": x.shape}, {"amounts": np.array(amounts, np.int64)},
                            ["y"], opset), x=x)


@pytest.mark.parametrize("cin, cout, k, attrs, then", [
    (1, 1, 3, {"pads": [1, 1]}, "Sigmoid"),  # ECA-Net's channel attention
    (6, 4, 5, {"strides": [2], "dilations": [2], "pads": [3, 1]}, "BatchNormalization"),
    (6, 6, 3, {"group": 6, "auto_pad": "SAME_UPPER"}, "Relu")], ids=str)
@pytest.mark.parametrize("local_tiles", [False, True], ids=["registers", "local"])
def test_conv1d(engine_for, cin, cout, k, attrs, then, local_tiles) -> None:
    """A 1-D Conv runs as a 2-D one of height 1; BatchNormalization folds into it."""
    rng, _ = fresh_rng()
    consts = {"w": rng.standard_normal((cout, cin // attrs.get("group", 1), k)).astype(
        np.float32), "b": rng.standard_normal(cout).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    if then == "BatchNormalization":
        consts |= {n: rng.uniform(0.5, 1.5, cout).astype(np.float32)
                   for n in ("gamma", "beta", "mean", "var")}
        nodes.append(helper.make_node(then, ["c", "gamma", "beta", "mean", "var"], ["y"]))
    else:
        nodes.append(helper.make_node(then, ["c"], ["y"]))
    x = rng.standard_normal((3, cin, 17)).astype(np.float32)
    engine = check(lambda m: engine_for(m, local_tiles),
                   graph(nodes, {"x": x.shape}, consts, ["y"]), x=x)
    assert all(la.kernel not in ("activation", "channel_affine")
               for la in engine.plan(3).launches)
