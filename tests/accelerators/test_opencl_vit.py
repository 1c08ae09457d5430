"""A small vision transformer, end to end: patch embedding, class token, position embedding, one
encoder block (LayerNorm, multi-head attention, MLP with GELU) and the head, spelled the way
torch.onnx exports torchvision's ViT (its shape code, attention's packed projection and head
reshapes, GELU as Div, Erf, Add, Mul, Mul; LayerNormalization at opset 17, decomposed before),
built with onnx.helper and compared with ONNX Runtime at several batch sizes, on the engine and
through the daemon."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.accelerators.conftest import SMALL_GRID, fresh_rng, rel_err
from tests.accelerators.test_opencl_blocks import Block, served
from tests.accelerators.test_opencl_ops import graph
from tests.accelerators.test_opencl_tensor_ops import check_batches, ints

IMAGE, PATCH, DIM, HEADS, MLP, CLASSES = 32, 8, 32, 4, 64, 10
TOKENS = (IMAGE // PATCH) ** 2 + 1


class ViT(Block):
    """The block builder of test_opencl_blocks.py, with what a ViT adds."""

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        return self.op(op, *inputs, **attrs)

    def dim(self, x: str, axis: int) -> str:
        """x.shape[axis] as a 1-D tensor, the way torch's export reads sizes."""
        return self("Unsqueeze", self("Gather", self("Shape", x), self.const(np.int64(axis))),
                    self.const(ints(0)))

    def norm(self, x: str, form: str) -> str:
        """LayerNormalization (opset 17), or decomposed as exporters write it before."""
        if form == "LayerNormalization":
            return self.layer_norm(x, DIM)
        d = self("Sub", x, self("ReduceMean", x, axes=[-1]))
        var = self("ReduceMean", self("Pow", d, self.const(np.float32(2))), axes=[-1])
        std = self("Sqrt", self("Add", var, self.const(np.float32(1e-5))))
        gamma = self.const(self.rng.uniform(0.5, 1.5, DIM).astype(np.float32))
        beta = self.const(self.rng.uniform(-0.5, 0.5, DIM).astype(np.float32))
        return self("Add", self("Mul", self("Div", d, std), gamma), beta)

    def attention(self, x: str) -> str:
        """torch's F.multi_head_attention_forward for a batch-first module, as exported."""
        hd = DIM // HEADS
        seq = self("Transpose", x, perm=[1, 0, 2])  # (t, n, d)
        qkv = self.linear(seq, DIM, 3 * DIM)
        packed = self("Concat", self("Slice", self("Shape", qkv), self.const(ints(0)),
                                     self.const(ints(2))), self.const(ints(3, DIM)), axis=0)
        qkv = self("Reshape", qkv, packed)  # (t, n, 3, d)
        qkv = self("Squeeze", self("Transpose", self("Unsqueeze", qkv, self.const(ints(0))),
                                   perm=[3, 1, 2, 0, 4]), self.const(ints(-2)))  # (3, t, n, d)
        heads = []
        for i in range(3):
            part = self("Gather", qkv, self.const(np.int64(i)), axis=0)
            split = self("Concat", self.dim(part, 0),
                         self("Mul", self.dim(part, 1), self.const(ints(HEADS))),
                         self.const(ints(hd)), axis=0)
            part = self("Transpose", self("Reshape", part, split), perm=[1, 0, 2])
            by_sample = self("Concat", self.dim(x, 0), self.const(ints(HEADS, -1, hd)), axis=0)
            heads.append(self("Reshape", part, by_sample))  # (n, h, t, hd)
        q, k, v = heads
        size = self("Cast", self("Slice", self("Shape", q), self.const(ints(-1)),
                                 self.const(ints(2**62))), to=TensorProto.FLOAT)
        root = self("Sqrt", self("Div", self.const(np.float32(1)), self("Sqrt", size)))
        scores = self("MatMul", self("Mul", q, root),
                      self("Mul", self("Transpose", k, perm=[0, 1, 3, 2]), root))
        out = self("MatMul", self("Softmax", scores, axis=-1), v)  # (n, h, t, hd)
        out = self("Reshape", self("Transpose", out, perm=[2, 0, 1, 3]),
                   self.const(ints(-1, DIM)))
        out = self("Gemm", out, self.weight(DIM, DIM), self.weight(DIM, scale=0.1), transB=1)
        by_token = self("Concat", self.dim(seq, 0), self.const(ints(-1, DIM)), axis=0)
        return self("Transpose", self("Reshape", out, by_token), perm=[1, 0, 2])


def vit(form: str, rng: np.random.Generator) -> onnx.ModelProto:
    b = ViT(rng)
    patches = b("Conv", "image", b.weight(DIM, 3, PATCH, PATCH), b.weight(DIM, scale=0.1),
                kernel_shape=[PATCH, PATCH], strides=[PATCH, PATCH])
    flat = b("Concat", b.dim(patches, 0), b.const(ints(DIM, -1)), axis=0)
    tokens = b("Transpose", b("Reshape", patches, flat), perm=[0, 2, 1])
    # class_token.expand(n, -1, -1): torch resolves the -1s with Equal and Where
    target = b("Concat", b.dim(tokens, 0), b.const(ints(-1, -1)), axis=0)
    ones = b("ConstantOfShape", b.const(ints(3)),
             value=helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    target = b("Where", b("Equal", target, b.const(ints(-1))), ones, target)
    cls = b("Expand", b.weight(1, 1, DIM), target)
    x = b("Add", b("Concat", cls, tokens, axis=1), b.weight(1, TOKENS, DIM))
    x = b("Add", x, b.attention(b.norm(x, form)))
    mlp = b.linear(b.gelu(b.linear(b.norm(x, form), DIM, MLP)), MLP, DIM)
    x = b("Add", x, mlp)
    first = b("Gather", b.norm(x, form), b.const(np.int64(0)), axis=1)
    b("Gemm", first, b.weight(CLASSES, DIM), b.weight(CLASSES, scale=0.1), transB=1)
    b.nodes[-1].output[0] = "logits"
    return graph(b.nodes, {"image": ("n", 3, IMAGE, IMAGE)}, b.consts, ["logits"],
                 opset=17 if form == "LayerNormalization" else 13)


@pytest.mark.parametrize("form", ["LayerNormalization", "decomposed"])
@pytest.mark.parametrize("local_tiles", [False, True])
def test_vit_encoder_block(engine_for, form, local_tiles) -> None:
    model = vit(form, fresh_rng()[0])
    check_batches(engine_for, model, {"image": ("n", 3, IMAGE, IMAGE)},
                  batches=(1, 2) if SMALL_GRID else (1, 2, 5), local_tiles=local_tiles)
    fused = engine_for(model).graph.fused
    assert fused["MatMul+Add"] == 3 and fused["Gelu(none)"] == 1, fused


def test_daemon_serves_the_vit_through_opencl(tmp_path) -> None:
    model = vit("LayerNormalization", fresh_rng()[0])
    model.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", CLASSES]))
    x = fresh_rng()[0].standard_normal((5, 3, IMAGE, IMAGE)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    for (lo, hi), got in zip(((0, 2), (2, 5)), served(tmp_path, "vit", model, x,
                                                      [(0, 2), (2, 5)])):
        assert rel_err(got, ref[lo:hi]) <= 1e-4
        assert (got.argmax(1) == ref[lo:hi].argmax(1)).all()
