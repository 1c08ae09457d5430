"""Reading the model repository: layout, versions, names that cannot escape it, and paths in a
config that cannot leave the model's folder."""

from __future__ import annotations

import os

import pytest

from service.core.model import ModelSpec
from service.core.repository import ModelRepository, check_model_name
from service.core.warmup import warmup_batches
from service.errors import ConfigError, ModelNotFoundError
from tests.support.daemon import MODEL, MODELS
from tests.support.repository import copy_model, example_config


def test_example_repository() -> None:
    repo = ModelRepository(MODELS)
    assert repo.names() == [MODEL]
    entry = repo.load(MODEL)
    assert entry.config.max_batch_size == 128 and list(entry.versions) == [1]


def test_latest_version_is_served_unless_the_policy_says_otherwise(tmp_path) -> None:
    copy_model(tmp_path, "m", [1, 3, 2])
    assert list(ModelRepository(tmp_path).load("m").versions) == [3]
    config = (tmp_path / "m" / "config.pbtxt")
    config.write_text(config.read_text() + "version_policy { specific { versions: [1, 2] } }\n")
    assert sorted(ModelRepository(tmp_path).load("m").versions) == [1, 2]


@pytest.mark.parametrize("config, message", [
    ("max_batch_size: oops", "config.pbtxt"),
    ('name: "other"', "must agree"),
])
def test_bad_configs_are_reported(tmp_path, config, message) -> None:
    copy_model(tmp_path, "m", [1], config)
    with pytest.raises(ConfigError, match=message):
        ModelRepository(tmp_path).load("m")


def test_a_model_without_versions_is_reported(tmp_path) -> None:
    copy_model(tmp_path, "m", [])
    with pytest.raises(ConfigError, match="no version folder"):
        ModelRepository(tmp_path).load("m")


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", ".hidden", "-rf", "", "x" * 200])
def test_names_cannot_escape_the_repository(name) -> None:
    with pytest.raises(ModelNotFoundError):
        check_model_name(name)


@pytest.mark.parametrize("filename", ["../../other/1/model.onnx", "/etc/passwd", "1/model.onnx",
                                      "..", "."])
def test_default_model_filename_is_a_plain_file_name(tmp_path, filename) -> None:
    copy_model(tmp_path, "other", [1])
    copy_model(tmp_path, "m", [1], example_config("m", f'default_model_filename: "{filename}"'))
    with pytest.raises(ConfigError, match="model 'm': default_model_filename .* is not a plain "
                                          "file name; expected the name of a file"):
        ModelRepository(tmp_path).load("m")


@pytest.mark.parametrize("filename", ["../other/labels.txt", "/etc/passwd", "missing.txt"])
def test_a_label_file_is_a_plain_file_name_in_the_model_s_folder(tmp_path, filename) -> None:
    copy_model(tmp_path, "other", [1])
    copy_model(tmp_path, "m", [1], example_config("m", "").replace(
        'label_filename: "labels.txt"', f'label_filename: "{filename}"'))
    with pytest.raises(ConfigError, match=r"model 'm': output\[0\]\.label_filename"):
        ModelRepository(tmp_path).load("m")
    assert ModelRepository(tmp_path).load("other").labels["logits"][7] == "seven"


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
    copy_model(tmp_path / "repo", "m", [1], example_config("m", warmup))
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
    copy_model(tmp_path, "m", [1])
    (tmp_path / "m" / "labels.txt").unlink()
    os.mkfifo(tmp_path / "m" / "labels.txt")
    with pytest.raises(ConfigError, match="labels.txt is not a plain file"):
        ModelRepository(tmp_path).load("m")
