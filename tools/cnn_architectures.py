"""The classic benchmark CNNs as ONNX graphs with random weights, built with onnx.helper (no
torch): AlexNet (the original, with LRN and grouped convolutions), GoogLeNet (Inception v1) and
ResNet-50 (v1.5, BatchNormalization after every convolution), all at 3x224x224 with 1000
logits. Used by the OpenCL engine's model tests and its benchmark."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, op: str) -> str:
        self._count += 1
        return f"{op.lower()}{self._count}"

    def _const(self, name: str, value: np.ndarray) -> str:
        self.weights.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        name = self._name(op)
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
             group: int = 1, bias: bool = True) -> str:
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        inputs = [x, self._const(f"{self._name('w')}", w)]
        if bias:
            inputs.append(self._const(self._name("b"), self.rng.uniform(-0.1, 0.1, cout)))
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=group)

    def bn(self, x: str, c: int) -> str:
        params = [self.rng.uniform(0.5, 1.0, c), self.rng.uniform(-0.1, 0.1, c),
                  self.rng.uniform(-0.1, 0.1, c), self.rng.uniform(0.5, 1.5, c)]
        return self.op("BatchNormalization",
                       [x] + [self._const(self._name(p), v)
                              for p, v in zip(("gamma", "beta", "mean", "var"), params)],
                       epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0, ceil: int = 0) -> str:
        return self.op("MaxPool", [x], kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, ceil_mode=ceil)

    def lrn(self, x: str) -> str:
        return self.op("LRN", [x], size=5, alpha=1e-4, beta=0.75, bias=1.0)

    def fc(self, x: str, cin: int, cout: int) -> str:
        w = self.rng.standard_normal((cout, cin)) * np.sqrt(2.0 / cin)
        return self.op("Gemm", [x, self._const(self._name("fc_w"), w),
                                self._const(self._name("fc_b"), np.zeros(cout))], transB=1)

    def model(self, out: str, name: str) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "logits"
        for node in self.nodes:  # the last node's output was renamed
            node.input[:] = ["logits" if i == out else i for i in node.input]
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 224, 224])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])],
            self.weights)
        # IR version 8: readable by every onnxruntime the project supports
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def alexnet(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.maxpool(g.lrn(g.relu(g.conv("image", 3, 96, 11, stride=4))), 3, 2)
    x = g.maxpool(g.lrn(g.relu(g.conv(x, 96, 256, 5, pad=2, group=2))), 3, 2)
    x = g.relu(g.conv(x, 256, 384, 3, pad=1))
    x = g.relu(g.conv(x, 384, 384, 3, pad=1, group=2))
    x = g.maxpool(g.relu(g.conv(x, 384, 256, 3, pad=1, group=2)), 3, 2)
    x = g.op("Flatten", [x], axis=1)
    x = g.op("Dropout", [g.relu(g.fc(x, 256 * 5 * 5, 4096))])
    x = g.op("Dropout", [g.relu(g.fc(x, 4096, 4096))])
    return g.model(g.fc(x, 4096, 1000), "alexnet")


# GoogLeNet's inception modules: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection.
INCEPTION = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
             "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
             "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
             "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
             "5b": (384, 192, 384, 48, 128, 128)}


def _inception(g: GraphBuilder, x: str, cin: int, widths: tuple[int, ...]) -> tuple[str, int]:
    c1, r3, c3, r5, c5, pp = widths
    b1 = g.relu(g.conv(x, cin, c1, 1))
    b3 = g.relu(g.conv(g.relu(g.conv(x, cin, r3, 1)), r3, c3, 3, pad=1))
    b5 = g.relu(g.conv(g.relu(g.conv(x, cin, r5, 1)), r5, c5, 5, pad=2))
    bp = g.relu(g.conv(g.maxpool(x, 3, 1, pad=1), cin, pp, 1))
    return g.op("Concat", [b1, b3, b5, bp], axis=1), c1 + c3 + c5 + pp


def googlenet(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.lrn(g.maxpool(g.relu(g.conv("image", 3, 64, 7, stride=2, pad=3)), 3, 2, ceil=1))
    x = g.relu(g.conv(g.relu(g.conv(x, 64, 64, 1)), 64, 192, 3, pad=1))
    x, c = g.maxpool(g.lrn(x), 3, 2, ceil=1), 192
    for stage in ("3a", "3b", "pool", "4a", "4b", "4c", "4d", "4e", "pool", "5a", "5b"):
        if stage == "pool":
            x = g.maxpool(x, 3, 2, ceil=1)
        else:
            x, c = _inception(g, x, c, INCEPTION[stage])
    x = g.op("AveragePool", [x], kernel_shape=[7, 7], strides=[1, 1])
    x = g.op("Flatten", [g.op("Dropout", [x])], axis=1)
    return g.model(g.fc(x, c, 1000), "googlenet")


def resnet50(seed: int = 0) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.relu(g.bn(g.conv("image", 3, 64, 7, stride=2, pad=3, bias=False), 64))
    x, c = g.maxpool(x, 3, 2, pad=1), 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = g.relu(g.bn(g.conv(x, c, width, 1, bias=False), width))
            y = g.relu(g.bn(g.conv(y, width, width, 3, stride=s, pad=1, bias=False), width))
            y = g.bn(g.conv(y, width, width * 4, 1, bias=False), width * 4)
            if i == 0:
                x = g.bn(g.conv(x, c, width * 4, 1, stride=s, bias=False), width * 4)
            x, c = g.relu(g.op("Add", [y, x])), width * 4
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    return g.model(g.fc(x, c, 1000), "resnet50")


ARCHITECTURES = {"alexnet": alexnet, "googlenet": googlenet, "resnet50": resnet50}
