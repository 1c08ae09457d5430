"""Reading the model repository: layout, versions, names that cannot escape it, and paths in a
config that cannot leave the model's folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from service.core.model import ModelSpec
from service.core.repository import ModelRepository, check_model_name
from service.core.warmup import warmup_batches
from service.errors import ConfigError, ModelNotFoundError
from tests.support.daemon import MODEL, MODELS, Daemon, image_input


def _copy_model(root: Path, name: str, versions: list[int], config: str | None = None) -> None:
    folder = root / name
    folder.mkdir()
    shutil.copy(MODELS / MODEL / "labels.txt", folder)
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
        shutil.copy(MODELS / MODEL / "1" / "model.onnx", folder / str(v) / "model.onnx")
    text = (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, name)
    (folder / "config.pbtxt").write_text(config if config is not None else text)


def _config(name: str, extra: str) -> str:
    """The example model's config, named `name`, with `extra` lines."""
    return (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, name) + extra + "\n"


def test_example_repository() -> None:
    repo = ModelRepository(MODELS)
    assert repo.names() == [MODEL]
    entry = repo.load(MODEL)
    assert entry.config.max_batch_size == 128 and list(entry.versions) == [1]


def test_latest_version_is_served_unless_the_policy_says_otherwise(tmp_path) -> None:
    _copy_model(tmp_path, "m", [1, 3, 2])
    assert list(ModelRepository(tmp_path).load("m").versions) == [3]
    config = (tmp_path / "m" / "config.pbtxt")
    config.write_text(config.read_text() + "version_policy { specific { versions: [1, 2] } }\n")
    assert sorted(ModelRepository(tmp_path).load("m").versions) == [1, 2]


@pytest.mark.parametrize("config, message", [
    ("max_batch_size: oops", "config.pbtxt"),
    ('name: "other"', "must agree"),
])
def test_bad_configs_are_reported(tmp_path, config, message) -> None:
    _copy_model(tmp_path, "m", [1], config)
    with pytest.raises(ConfigError, match=message):
        ModelRepository(tmp_path).load("m")


def test_a_model_without_versions_is_reported(tmp_path) -> None:
    _copy_model(tmp_path, "m", [])
    with pytest.raises(ConfigError, match="no version folder"):
        ModelRepository(tmp_path).load("m")


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", ".hidden", "-rf", "", "x" * 200])
def test_names_cannot_escape_the_repository(name) -> None:
    with pytest.raises(ModelNotFoundError):
        check_model_name(name)


@pytest.mark.parametrize("filename", ["../../other/1/model.onnx", "/etc/passwd", "1/model.onnx",
                                      "..", "."])
def test_default_model_filename_is_a_plain_file_name(tmp_path, filename) -> None:
    _copy_model(tmp_path, "other", [1])
    _copy_model(tmp_path, "m", [1], _config("m", f'default_model_filename: "{filename}"'))
    with pytest.raises(ConfigError, match="model 'm': default_model_filename .* is not a plain "
                                          "file name; expected the name of a file"):
        ModelRepository(tmp_path).load("m")


@pytest.mark.parametrize("filename", ["../other/labels.txt", "/etc/passwd", "missing.txt"])
def test_a_label_file_is_a_plain_file_name_in_the_model_s_folder(tmp_path, filename) -> None:
    _copy_model(tmp_path, "other", [1])
    _copy_model(tmp_path, "m", [1], _config("m", "").replace(
        'label_filename: "labels.txt"', f'label_filename: "{filename}"'))
    with pytest.raises(ConfigError, match=r"model 'm': output\[0\]\.label_filename"):
        ModelRepository(tmp_path).load("m")
    assert ModelRepository(tmp_path).load("other").labels["logits"][7] == "seven"


def test_config_paths_leading_outside_a_model_fail_it_and_others_serve(tmp_path, holdout) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(MODELS / MODEL, models / MODEL)
    # Both files exist and fit: before paths were confined, both models loaded.
    _copy_model(models, "model_file", [1], _config(
        "model_file", 'default_model_filename: "../../mnist_cnn/1/model.onnx"'))
    (tmp_path / "secret").write_bytes(np.zeros(28 * 28, np.float32).tobytes())
    _copy_model(models, "warmup_file", [1], _config("warmup_file", (
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


@pytest.mark.parametrize("planted", ["labels.txt", "config.pbtxt", "1/model.onnx",
                                     "warmup/sample"])
def test_a_file_the_model_names_is_never_read_through_a_link(tmp_path, planted) -> None:
    """A link to a file only the daemon's user may read: the load fails naming the file, and
    the secret appears in no error (the index shows load errors to every caller)."""
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash\n" * 784)  # as many bytes as a 28x28 fp32 sample
    (tmp_path / "repo").mkdir()
    warmup = ('model_warmup [ { name: "w" batch_size: 1 inputs { key: "image" value: { '
              'data_type: TYPE_FP32 dims: [ 1, 28, 28 ] input_data_file: "sample" } } } ]')
    _copy_model(tmp_path / "repo", "m", [1], _config("m", warmup))
    folder = tmp_path / "repo" / "m"
    (folder / "warmup").mkdir()
    (folder / "warmup" / "sample").write_bytes(bytes(784 * 4))
    (folder / planted).unlink()
    (folder / planted).symlink_to(secret)
    with pytest.raises(ConfigError) as refused:
        entry = ModelRepository(tmp_path / "repo").load("m")
        warmup_batches(ModelSpec.from_config(entry.config, 1), None, folder)
    message = str(refused.value)
    assert planted.split("/")[-1] in message and "symbolic link" in message, message
    assert "root:" not in message


def test_a_label_file_that_is_a_fifo_is_refused_without_waiting(tmp_path) -> None:
    _copy_model(tmp_path, "m", [1])
    (tmp_path / "m" / "labels.txt").unlink()
    os.mkfifo(tmp_path / "m" / "labels.txt")
    with pytest.raises(ConfigError, match="labels.txt is not a plain file"):
        ModelRepository(tmp_path).load("m")
