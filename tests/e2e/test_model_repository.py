"""The model repository end to end: a model whose config names paths outside its folder fails
alone, and the others serve."""

from __future__ import annotations

import shutil

import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.repository import copy_model, example_config


def test_config_paths_leading_outside_a_model_fail_it_and_others_serve(tmp_path, holdout) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(MODELS / MODEL, models / MODEL)
    # Both files exist and fit: before paths were confined, both models loaded.
    copy_model(models, "model_file", [1], example_config(
        "model_file", 'default_model_filename: "../../mnist_cnn/1/model.onnx"'))
    (tmp_path / "secret").write_bytes(np.zeros(28 * 28, np.float32).tobytes())
    copy_model(models, "warmup_file", [1], example_config("warmup_file", (
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "image" value: { '
        'data_type: TYPE_FP32 dims: [1, 28, 28] input_data_file: "../../../secret" } } } ]')))
    daemon = Daemon(tmp_path, models)
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            index = {m["name"]: m for m in
                     client.get_model_repository_index(as_json=True)["models"]}
            assert index[MODEL]["state"] == "READY"
            assert not client.is_model_ready("model_file")
            assert not client.is_model_ready("warmup_file")
            logits = client.infer(MODEL, image_input(holdout[0][:2])).as_numpy("logits")
        assert logits.shape == (2, 10)
        assert index["model_file"]["state"] == index["warmup_file"]["state"] == "UNAVAILABLE"
        assert "default_model_filename '../../mnist_cnn/1/model.onnx' is not a plain file " \
            "name" in index["model_file"]["reason"]
        assert "model_warmup[0].inputs['image'].input_data_file '../../../secret' is not a " \
            "plain file name" in index["warmup_file"]["reason"]
    finally:
        assert daemon.stop() == 0
