"""Helpers of the model repository's tests: a copy of the example model under another name, its
config with extra lines."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.daemon import MODEL, MODELS


def copy_model(root: Path, name: str, versions: list[int], config: str | None = None) -> None:
    folder = root / name
    folder.mkdir()
    shutil.copy(MODELS / MODEL / "labels.txt", folder)
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
        shutil.copy(MODELS / MODEL / "1" / "model.onnx", folder / str(v) / "model.onnx")
    text = (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, name)
    (folder / "config.pbtxt").write_text(config if config is not None else text)


def example_config(name: str, extra: str) -> str:
    """The example model's config, named `name`, with `extra` lines."""
    return (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, name) + extra + "\n"
