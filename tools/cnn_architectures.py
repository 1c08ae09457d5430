"""The classic benchmark CNNs as ONNX graphs with random weights, built with onnx.helper (no
torch): AlexNet (the original, with LRN and grouped convolutions), GoogLeNet (Inception v1),
ResNet-50 (v1.5, BatchNormalization after every convolution), and the mobile and densely
connected families as torchvision exports them: MobileNetV2 (depthwise convolutions, ReLU6 as
Clip), MobileNetV3-Small (HardSwish, squeeze-excitation gated by HardSigmoid), EfficientNet-B0
(SiLU as Sigmoid and Mul, squeeze-excitation), DenseNet-121 (Concat, BatchNormalization before
ReLU and convolution) and ShuffleNetV2 x1.0 (Split, channel shuffle by Reshape and Transpose).
All take 3 x size x size images (224 unless told) and give 1000 logits. Used by the OpenCL
engine's model tests and its benchmark."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from accelerators.onnx_models import make_model


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

    def const(self, value: np.ndarray, dtype=np.float32) -> str:
        name = self._name("const")
        self.weights.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def act(self, x: str, kind: str) -> str:
        """relu, relu6 (Clip 0..6), hswish, hsigmoid (HardSigmoid 1/6, 1/2), sigmoid, silu
        (Sigmoid then Mul, as exporters write it)."""
        if kind == "relu":
            return self.relu(x)
        if kind == "relu6":
            return self.op("Clip", [x, self.const(0.0), self.const(6.0)])
        if kind == "hswish":
            return self.op("HardSwish", [x])
        if kind == "hsigmoid":
            return self.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
        if kind == "sigmoid":
            return self.op("Sigmoid", [x])
        assert kind == "silu", kind
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = None) -> str:
        """Convolution without bias, BatchNormalization, optional activation; padding k // 2."""
        y = self.bn(self.conv(x, cin, cout, k, stride, k // 2, group, bias=False), cout)
        return self.act(y, act) if act else y

    def squeeze_excite(self, x: str, c: int, squeeze: int, inner: str, gate: str) -> str:
        s = self.op("GlobalAveragePool", [x])
        s = self.act(self.conv(self.act(self.conv(s, c, squeeze, 1), inner), squeeze, c, 1), gate)
        return self.op("Mul", [x, s])

    def classifier(self, x: str, c: int, hidden: int = 0, act: str = "relu") -> str:
        x = self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)
        if hidden:
            x, c = self.act(self.fc(x, c, hidden), act), hidden
        return self.fc(self.op("Dropout", [x]), c, 1000)

    def model(self, out: str, name: str, size: int = 224, opset: int = 13) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "logits"
        for node in self.nodes:  # the last node's output was renamed
            node.input[:] = ["logits" if i == out else i for i in node.input]
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, size, size])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])],
            self.weights)
        return make_model(graph, opset)


def alexnet(seed: int = 0, caffe: bool = False) -> onnx.ModelProto:
    """The original AlexNet (224 x 224, LRN before pooling); `caffe`: as Caffe's reference model
    (CaffeNet) has it, 227 x 227 with pooling before LRN, the network PipeCNN's published figures
    were measured on."""
    g = GraphBuilder(seed)

    def stage(x: str) -> str:  # ReLU, then LRN and max pooling in the model's order
        x = g.relu(x)
        return g.lrn(g.maxpool(x, 3, 2)) if caffe else g.maxpool(g.lrn(x), 3, 2)

    x = stage(g.conv(stage(g.conv("image", 3, 96, 11, stride=4)), 96, 256, 5, pad=2, group=2))
    x = g.relu(g.conv(x, 256, 384, 3, pad=1))
    x = g.relu(g.conv(x, 384, 384, 3, pad=1, group=2))
    x = g.maxpool(g.relu(g.conv(x, 384, 256, 3, pad=1, group=2)), 3, 2)
    x = g.op("Flatten", [x], axis=1)
    side = 6 if caffe else 5
    x = g.op("Dropout", [g.relu(g.fc(x, 256 * side * side, 4096))])
    x = g.op("Dropout", [g.relu(g.fc(x, 4096, 4096))])
    return g.model(g.fc(x, 4096, 1000), "caffenet" if caffe else "alexnet",
                   size=227 if caffe else 224)


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


def resnet50(seed: int = 0, size: int = 224) -> onnx.ModelProto:
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
    return g.model(g.fc(x, c, 1000), "resnet50", size)


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: channel counts rounded to multiples of 8."""
    rounded = max(d, int(v + d / 2) // d * d)
    return rounded + d if rounded < 0.9 * v else rounded


def mobilenet_v2(seed: int = 0, size: int = 224) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x, c = g.conv_bn("image", 3, 32, 3, 2, act="relu6"), 32
    for t, out, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = s if i == 0 else 1, c * t
            y = g.conv_bn(x, c, hidden, 1, act="relu6") if t != 1 else x
            y = g.conv_bn(y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            y = g.conv_bn(y, hidden, out, 1)
            x, c = (g.op("Add", [x, y]) if stride == 1 and c == out else y), out
    x = g.conv_bn(x, c, 1280, 1, act="relu6")
    return g.model(g.classifier(x, 1280), "mobilenet_v2", size, 17)


def mobilenet_v3_small(seed: int = 0, size: int = 224) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x, c = g.conv_bn("image", 3, 16, 3, 2, act="hswish"), 16
    # kernel, expanded channels, out channels, squeeze-excitation, activation, stride
    for k, exp, out, se, act, s in (
            (3, 16, 16, 1, "relu", 2), (3, 72, 24, 0, "relu", 2), (3, 88, 24, 0, "relu", 1),
            (5, 96, 40, 1, "hswish", 2), (5, 240, 40, 1, "hswish", 1),
            (5, 240, 40, 1, "hswish", 1), (5, 120, 48, 1, "hswish", 1),
            (5, 144, 48, 1, "hswish", 1), (5, 288, 96, 1, "hswish", 2),
            (5, 576, 96, 1, "hswish", 1), (5, 576, 96, 1, "hswish", 1)):
        y = g.conv_bn(x, c, exp, 1, act=act) if exp != c else x
        y = g.conv_bn(y, exp, exp, k, s, group=exp, act=act)
        if se:
            y = g.squeeze_excite(y, exp, _divisible(exp / 4), "relu", "hsigmoid")
        y = g.conv_bn(y, exp, out, 1)
        x, c = (g.op("Add", [y, x]) if s == 1 and c == out else y), out
    x = g.conv_bn(x, c, 576, 1, act="hswish")
    return g.model(g.classifier(x, 576, 1024, "hswish"), "mobilenet_v3_small", size, 17)


def efficientnet_b0(seed: int = 0, size: int = 224) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x, c = g.conv_bn("image", 3, 32, 3, 2, act="silu"), 32
    # expansion, kernel, stride, out channels, repeats
    for t, k, s, out, n in ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2),
                            (6, 3, 2, 80, 3), (6, 5, 1, 112, 3), (6, 5, 2, 192, 4),
                            (6, 3, 1, 320, 1)):
        for i in range(n):
            stride, hidden = s if i == 0 else 1, c * t
            y = g.conv_bn(x, c, hidden, 1, act="silu") if t != 1 else x
            y = g.conv_bn(y, hidden, hidden, k, stride, group=hidden, act="silu")
            y = g.squeeze_excite(y, hidden, max(1, c // 4), "silu", "sigmoid")
            y = g.conv_bn(y, hidden, out, 1)
            x, c = (g.op("Add", [y, x]) if stride == 1 and c == out else y), out
    x = g.conv_bn(x, c, 1280, 1, act="silu")
    return g.model(g.classifier(x, 1280), "efficientnet_b0", size, 17)


def densenet121(seed: int = 0, size: int = 224) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.maxpool(g.conv_bn("image", 3, 64, 7, 2, act="relu"), 3, 2, pad=1)
    c, growth = 64, 32
    for b, layers in enumerate((6, 12, 24, 16)):
        features = [x]
        for _ in range(layers):  # BN -> ReLU -> 1x1 conv -> BN -> ReLU -> 3x3 conv
            y = g.relu(g.bn(x, c))
            y = g.conv(g.relu(g.bn(g.conv(y, c, 4 * growth, 1, bias=False), 4 * growth)),
                       4 * growth, growth, 3, pad=1, bias=False)
            features.append(y)
            c += growth
            x = g.op("Concat", features, axis=1)
        if b < 3:  # transition: BN -> ReLU -> 1x1 conv halving the channels -> 2x2 average
            x = g.conv(g.relu(g.bn(x, c)), c, c // 2, 1, bias=False)
            x, c = g.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2]), c // 2
    return g.model(g.classifier(g.relu(g.bn(x, c)), c), "densenet121", size, 17)


def _shuffle(g: GraphBuilder, x: str, c: int, size: int) -> str:
    """Channel shuffle of two groups: (n, 2, c/2, h, w) -> swap the two channel axes -> back."""
    r = g.op("Reshape", [x, g.const([0, 2, c // 2, size, size], np.int64)])
    t = g.op("Transpose", [r], perm=[0, 2, 1, 3, 4])
    return g.op("Reshape", [t, g.const([0, c, size, size], np.int64)])


def shufflenet_v2(seed: int = 0, size: int = 224) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x, c = g.maxpool(g.conv_bn("image", 3, 24, 3, 2, act="relu"), 3, 2, pad=1), 24
    side = -(-size // 4)
    for repeats, out in ((4, 116), (8, 232), (4, 464)):
        side = -(-side // 2)
        half = out // 2
        left = g.conv_bn(g.conv_bn(x, c, c, 3, 2, group=c), c, half, 1, act="relu")
        right = g.conv_bn(g.conv_bn(x, c, half, 1, act="relu"), half, half, 3, 2, group=half)
        right = g.conv_bn(right, half, half, 1, act="relu")
        x, c = _shuffle(g, g.op("Concat", [left, right], axis=1), out, side), out
        for _ in range(repeats - 1):
            name = g._name("split")
            parts = [f"{name}_a", f"{name}_b"]
            g.nodes.append(helper.make_node("Split", [x, g.const([half, half], np.int64)],
                                            parts, name=name, axis=1))
            right = g.conv_bn(g.conv_bn(parts[1], half, half, 1, act="relu"), half, half, 3,
                              group=half)
            right = g.conv_bn(right, half, half, 1, act="relu")
            x = _shuffle(g, g.op("Concat", [parts[0], right], axis=1), c, side)
    x = g.conv_bn(x, c, 1024, 1, act="relu")
    x = g.op("ReduceMean", [x], axes=[2, 3], keepdims=0)  # torchvision's x.mean([2, 3])
    return g.model(g.fc(x, 1024, 1000), "shufflenet_v2", size, 17)


ARCHITECTURES = {"alexnet": alexnet, "googlenet": googlenet, "resnet50": resnet50,
                 "mobilenet_v2": mobilenet_v2, "mobilenet_v3_small": mobilenet_v3_small,
                 "efficientnet_b0": efficientnet_b0, "densenet121": densenet121,
                 "shufflenet_v2": shufflenet_v2}
