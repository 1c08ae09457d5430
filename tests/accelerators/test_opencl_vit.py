"""A small vision transformer end to end (tools/vit_architecture.py: patch embedding, class
token, position embedding, encoder blocks of LayerNorm, multi-head attention and a GELU MLP,
the head, spelled the way torch.onnx exports torchvision's ViT, with LayerNormalization at opset
17 and decomposed before), compared with ONNX Runtime at several batch sizes, on the engine and
through the daemon."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.support.numerics import SMALL_GRID, fresh_rng, rel_err
from tests.support.onnx_graphs import check_batches
from tests.support.served import served
from tools import vit_architecture

SMALL = {"size": 32, "patch": 8, "dim": 32, "heads": 4, "mlp": 64, "layers": 2}


@pytest.mark.parametrize("layer_norm", ["LayerNormalization", "decomposed"])
@pytest.mark.parametrize("local_tiles", [False, True])
def test_vit(engine_for, layer_norm, local_tiles) -> None:
    model = vit_architecture.vit(0, layer_norm=layer_norm, **SMALL)
    check_batches(engine_for, model, {"image": ("n", 3, 32, 32)},
                  batches=(1, 2) if SMALL_GRID else (1, 2, 5), local_tiles=local_tiles)
    fused = engine_for(model).graph.fused
    assert fused["MatMul+Add"] == 6 and fused["Gelu(none)"] == 2, fused


def test_daemon_serves_the_vit_through_opencl(tmp_path) -> None:
    model = vit_architecture.vit(0, **SMALL)
    x = fresh_rng()[0].standard_normal((5, 3, 32, 32)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    for (lo, hi), got in zip(((0, 2), (2, 5)), served(tmp_path, "vit", model, x,
                                                      [(0, 2), (2, 5)])):
        assert rel_err(got, ref[lo:hi]) <= 1e-4
        assert (got.argmax(1) == ref[lo:hi].argmax(1)).all()
