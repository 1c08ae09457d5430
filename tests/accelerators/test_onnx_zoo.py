"""The ONNX light zoo (the model-zoo graphs that onnx's backend tests ship, opset 9, weights
made by ConstantOfShape): AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet,
SqueezeNet, VGG-19, ZFNet-512, whole on the OpenCL engine against onnxruntime, and counted
in full by the FLOP counter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from accelerators.flops import count_flops
from tests.support.numerics import SMALL_GRID, fresh_rng, rel_err

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(LIGHT.glob("light_*.onnx"))


def test_the_light_zoo_is_there() -> None:
    assert len(MODELS) == 9, MODELS


@pytest.mark.skipif(SMALL_GRID, reason="whole models are too slow under Oclgrind")
@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_light_zoo_model_matches_onnxruntime(engine_for, path) -> None:
    model = onnx.load(str(path))
    engine = engine_for(model)
    (name, dims), = engine.graph.inputs
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, *dims[1:])).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {name: x})[0]
    output = engine.outputs[0].name
    assert rel_err(engine.run({name: x}, [output])[output], ref) <= 1e-3, seed
    count = count_flops(path)
    assert not count.partial and count.total > 0, count.uncounted
