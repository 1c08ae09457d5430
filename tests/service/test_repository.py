"""Reading the model repository: layout, versions, names that cannot escape it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.errors import ConfigError, ModelNotFoundError
from service.repository import ModelRepository, check_model_name
from tests.conftest import MODEL, MODELS


def _copy_model(root: Path, name: str, versions: list[int], config: str | None = None) -> None:
    folder = root / name
    folder.mkdir()
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
        shutil.copy(MODELS / MODEL / "1" / "model.onnx", folder / str(v) / "model.onnx")
    text = (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, name)
    (folder / "config.pbtxt").write_text(config if config is not None else text)


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
