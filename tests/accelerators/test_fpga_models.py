"""Whole classifiers on the emulated FPGA's pipeline, against ONNX Runtime (`make fpga-check`,
which CI runs after `make test`; the emulator runs single work-item loops one iteration at a
time, so these take minutes): AlexNet (the original, 224 x 224, grouped convolutions and LRN),
ResNet-50 (224 x 224) and MobileNetV2 (torchvision's architecture, 128 x 128), built by
tools/cnn_architectures.py with random weights, each in fp16 (within fp16's tolerance of the
fp32 reference, same top-1) and quantized to int8 QDQ (within a few output steps of ONNX's QDQ
semantics, the same clear winners: hidden layers' one-step rounding differences propagate)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from accelerators.engine_options import TOLERANCE
from accelerators.opencl.engine import OpenCLEngine
from tests.support.numerics import rel_err
from tests.support.onnx_graphs import literal_qdq, output_step
from tests.support.opencl_devices import NO_EMULATOR, emulated_fpga
from tools import cnn_architectures, quantize_int8

pytestmark = [pytest.mark.fpga_models,
              pytest.mark.skipif(emulated_fpga() is None, reason=NO_EMULATOR)]
MODELS = {"alexnet": (lambda: cnn_architectures.alexnet(7), 224),
          "resnet50": (lambda: cnn_architectures.resnet50(7), 224),
          "mobilenet_v2": (lambda: cnn_architectures.mobilenet_v2(7, size=128), 128)}
BATCH = 2


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory) -> tuple[str, object, int]:
    make, size = MODELS[request.param]
    path = tmp_path_factory.mktemp(request.param) / "fp32.onnx"
    onnx.save(make(), str(path))
    return request.param, path, size


def _images(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, 3, size, size), np.float32)


def test_fp16_agrees_with_onnxruntime(model, program_cache) -> None:
    name, path, size = model
    engine = OpenCLEngine(path, "fpga0", program_cache, precision="fp16")
    kernels = [la.kernel for la in engine.plan(BATCH).launches]
    assert kernels.count("fpga_conv") >= 8, name  # the convolutions are on the board
    x = _images(size, 1)
    got = engine.run({"image": x}, ["logits"])["logits"]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"image": x})[0]
    assert rel_err(got, ref) < TOLERANCE["fp16"], name
    assert (got.argmax(1) == ref.argmax(1)).all(), name


def test_int8_agrees_with_qdq_semantics(model, program_cache, tmp_path) -> None:
    name, path, size = model
    quantized = quantize_int8.quantize(path, tmp_path / "int8.onnx", "image",
                                       _images(size, 2)[:BATCH])
    engine = OpenCLEngine(quantized, "fpga0", program_cache)
    assert "-DQ8" in engine.build.defines
    x = _images(size, 3)
    got = engine.run({"image": x}, ["logits"])["logits"]
    ref = literal_qdq(quantized).run(["logits"], {"image": x})[0]
    step = output_step(quantized, "logits")
    assert np.abs(got - ref).max() <= 8.01 * step, name
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 16 * step
    assert (got.argmax(1) == ref.argmax(1))[clear].all(), name
