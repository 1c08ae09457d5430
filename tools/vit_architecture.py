"""A vision transformer (torchvision's ViT: ViT-B/16 at its default sizes) as an ONNX graph with
random weights, built with onnx.helper (no torch) and spelled the way torch.onnx exports it:
the shape code around the class token (Shape, Gather, Equal, Where, Expand), attention's packed
projection, head reshapes and scaled dot product, GELU as Div, Erf, Add, Mul, Mul, and
LayerNormalization (opset 17) or its decomposed form (before). Used by the OpenCL engine's ViT
tests and its benchmark (`bench/opencl_engine.py --architectures vit_b_16`)."""

from __future__ import annotations

import numpy as np
import onnx

from tools.cnn_architectures import GraphBuilder


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


class ViTBuilder(GraphBuilder):
    def __init__(self, seed: int, dim: int, heads: int, layer_norm: str) -> None:
        super().__init__(seed)
        self.dim, self.heads, self.layer_norm = dim, heads, layer_norm

    def weight(self, *shape: int, scale: float = 1.0) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        return self.const(self.rng.standard_normal(shape) * scale / np.sqrt(fan_in))

    def size(self, x: str, axis: int) -> str:
        """x.shape[axis] as a 1-D tensor, the way torch's export reads sizes."""
        picked = self.op("Gather", [self.op("Shape", [x]), self.const(axis, np.int64)])
        return self.op("Unsqueeze", [picked, self.const(ints(0), np.int64)])

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        """nn.Linear on (..., n_in): MatMul, then Add of the bias."""
        return self.op("Add", [self.op("MatMul", [x, self.weight(n_in, n_out)]),
                               self.weight(n_out, scale=0.1)])

    def norm(self, x: str) -> str:
        gamma = self.const(self.rng.uniform(0.5, 1.5, self.dim))
        beta = self.const(self.rng.uniform(-0.5, 0.5, self.dim))
        if self.layer_norm == "LayerNormalization":
            return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-6)
        d = self.op("Sub", [x, self.op("ReduceMean", [x], axes=[-1])])
        var = self.op("ReduceMean", [self.op("Pow", [d, self.const(2.0)])], axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const(1e-6)])])
        return self.op("Add", [self.op("Mul", [self.op("Div", [d, std]), gamma]), beta])

    def gelu(self, x: str) -> str:
        erf = self.op("Erf", [self.op("Div", [x, self.const(1.4142135)])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, self.const(1.0)])]),
                               self.const(0.5)])

    def attention(self, x: str) -> str:
        """torch's F.multi_head_attention_forward for a batch-first module, as exported."""
        dim, heads = self.dim, self.heads
        hd = dim // heads
        seq = self.op("Transpose", [x], perm=[1, 0, 2])  # (tokens, n, dim)
        qkv = self.linear(seq, dim, 3 * dim)
        packed = self.op("Concat", [
            self.op("Slice", [self.op("Shape", [qkv]), self.const(ints(0), np.int64),
                              self.const(ints(2), np.int64)]),
            self.const(ints(3, dim), np.int64)], axis=0)
        qkv = self.op("Unsqueeze", [self.op("Reshape", [qkv, packed]),
                                    self.const(ints(0), np.int64)])
        qkv = self.op("Squeeze", [self.op("Transpose", [qkv], perm=[3, 1, 2, 0, 4]),
                                  self.const(ints(-2), np.int64)])  # (3, tokens, n, dim)
        q, k, v = [self._heads(x, self.op("Gather", [qkv, self.const(i, np.int64)], axis=0), hd)
                   for i in range(3)]
        size = self.op("Cast", [self.op("Slice", [self.op("Shape", [q]),
                                                  self.const(ints(-1), np.int64),
                                                  self.const(ints(2**62), np.int64)])],
                       to=onnx.TensorProto.FLOAT)
        root = self.op("Sqrt", [self.op("Div", [self.const(1.0), self.op("Sqrt", [size])])])
        scores = self.op("MatMul", [
            self.op("Mul", [q, root]),
            self.op("Mul", [self.op("Transpose", [k], perm=[0, 1, 3, 2]), root])])
        out = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])  # (n, h, t, hd)
        out = self.op("Reshape", [self.op("Transpose", [out], perm=[2, 0, 1, 3]),
                                  self.const(ints(-1, dim), np.int64)])
        out = self.op("Gemm", [out, self.weight(dim, dim), self.weight(dim, scale=0.1)],
                      transB=1)
        by_token = self.op("Concat", [self.size(seq, 0), self.const(ints(-1, dim), np.int64)],
                           axis=0)
        return self.op("Transpose", [self.op("Reshape", [out, by_token])], perm=[1, 0, 2])

    def _heads(self, x: str, part: str, hd: int) -> str:
        """(tokens, n, dim) -> (n, heads, tokens, hd) through torch's view and transpose."""
        split = self.op("Concat", [
            self.size(part, 0), self.op("Mul", [self.size(part, 1),
                                                self.const(ints(self.heads), np.int64)]),
            self.const(ints(hd), np.int64)], axis=0)
        part = self.op("Transpose", [self.op("Reshape", [part, split])], perm=[1, 0, 2])
        by_sample = self.op("Concat", [self.size(x, 0),
                                       self.const(ints(self.heads, -1, hd), np.int64)], axis=0)
        return self.op("Reshape", [part, by_sample])


def vit(seed: int = 0, size: int = 224, patch: int = 16, dim: int = 768, heads: int = 12,
        mlp: int = 3072, layers: int = 12, layer_norm: str = "LayerNormalization"
        ) -> onnx.ModelProto:
    """`layer_norm`: "LayerNormalization" (opset 17) or "decomposed" (opset 13)."""
    g = ViTBuilder(seed, dim, heads, layer_norm)
    patches = g.op("Conv", ["image", g.weight(dim, 3, patch, patch), g.weight(dim, scale=0.1)],
                   kernel_shape=[patch, patch], strides=[patch, patch])
    flat = g.op("Concat", [g.size(patches, 0), g.const(ints(dim, -1), np.int64)], axis=0)
    tokens = g.op("Transpose", [g.op("Reshape", [patches, flat])], perm=[0, 2, 1])
    # class_token.expand(n, -1, -1): torch resolves the -1s with Equal and Where
    target = g.op("Concat", [g.size(tokens, 0), g.const(ints(-1, -1), np.int64)], axis=0)
    ones = g.op("ConstantOfShape", [g.const(ints(3), np.int64)],
                value=onnx.helper.make_tensor("one", onnx.TensorProto.INT64, [1], [1]))
    target = g.op("Where", [g.op("Equal", [target, g.const(ints(-1), np.int64)]), ones, target])
    cls = g.op("Expand", [g.weight(1, 1, dim), target])
    x = g.op("Add", [g.op("Concat", [cls, tokens], axis=1),
                     g.weight(1, (size // patch) ** 2 + 1, dim)])
    for _ in range(layers):
        x = g.op("Add", [x, g.attention(g.norm(x))])
        x = g.op("Add", [x, g.linear(g.gelu(g.linear(g.norm(x), dim, mlp)), mlp, dim)])
    first = g.op("Gather", [g.norm(x), g.const(0, np.int64)], axis=1)  # the class token
    return g.model(g.fc(first, dim, 1000), f"vit_{layers}x{dim}", size,
                   17 if layer_norm == "LayerNormalization" else 13)
