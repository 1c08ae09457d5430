"""Whole models on the OpenCL engine (PoCL) against onnxruntime: max relative error 1e-3 on the
logits and the same top-1. The example MNIST CNN on real held-out digits, and the classifiers of
tools/cnn_architectures.py (AlexNet, GoogLeNet, ResNet-50, MobileNetV2, MobileNetV3-Small,
EfficientNet-B0, DenseNet-121, ShuffleNetV2: the real architectures at 3x224x224, random
weights) at batch 1."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.support.daemon import MODEL, MODELS
from tests.support.numerics import fresh_rng, rel_err
from tools import cnn_architectures


def _ort(model) -> ort.InferenceSession:
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _compare(got: np.ndarray, ref: np.ndarray) -> None:
    assert rel_err(got, ref) <= 1e-3, f"relative error {rel_err(got, ref):.2e}"
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).all()


def test_mnist_matches_onnxruntime_on_held_out_digits(opencl_device, program_cache,
                                                      holdout) -> None:
    from accelerators.opencl.engine import OpenCLEngine
    path = MODELS / MODEL / "1" / "model.onnx"
    engine = OpenCLEngine(path, opencl_device, program_cache)
    session = _ort(str(path))
    images, labels = holdout
    for batch in (1, 8, 64):
        x = images[:batch]
        got = engine.run({"image": x}, ["logits"])["logits"]
        _compare(got, session.run(None, {"image": x})[0])
    assert engine.plan(8) is engine.plan(8)  # plans are compiled once per batch size
    got = np.concatenate([engine.run({"image": images[i:i + 100]}, ["logits"])["logits"]
                          for i in range(0, 1000, 100)])
    _compare(got, session.run(None, {"image": images})[0])
    assert (got.argmax(axis=1) == labels).mean() > 0.9
    # The GEMMs that GPUs and FPGAs run, through local memory, on the same device.
    tiled = OpenCLEngine(path, opencl_device, program_cache, local_tiles=True)
    assert {la.kernel for la in tiled.plan(16).launches} >= {"gemm_local"}
    _compare(tiled.run({"image": images[:16]}, ["logits"])["logits"],
             session.run(None, {"image": images[:16]})[0])


LOCAL_TILES = {"mobilenet_v2", "shufflenet_v2", "googlenet"}


@pytest.mark.parametrize("name", list(cnn_architectures.ARCHITECTURES))
def test_architecture_matches_onnxruntime(engine_for, name) -> None:
    model = cnn_architectures.ARCHITECTURES[name]()
    engine = engine_for(model)
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, 3, 224, 224), np.float32)
    got = engine.run({"image": x}, ["logits"])["logits"]
    _compare(got, _ort(model).run(None, {"image": x})[0])
    plan = engine.plan(1)
    assert plan.peak_bytes < plan.sum_bytes  # buffers are reused
    if name in LOCAL_TILES:  # the GPU/FPGA path: implicit-GEMM convolutions, local tiles
        tiled = engine_for(model, local_tiles=True)
        assert "conv_local" in {la.kernel for la in tiled.plan(1).launches}
        _compare(tiled.run({"image": x}, ["logits"])["logits"], _ort(model).run(
            None, {"image": x})[0])
    if name == "resnet50":
        assert engine.graph.fused["BatchNormalization"] == 53
        assert engine.graph.fused["Add+Relu"] == 16
        assert plan.peak_bytes < plan.sum_bytes / 4
