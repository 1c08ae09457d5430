"""The benchmark models and a model repository that serves them: the example MNIST CNN and the
classic ImageNet CNNs of tools/cnn_architectures.py (random weights, built here, no downloads),
each with its input shape and FLOPs per image."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx

from accelerators import safe_files
from accelerators.flops import count_flops
from bench import ROOT

MNIST = "mnist_cnn"
NAMES = (MNIST, "alexnet", "googlenet", "resnet50")
TITLES = {MNIST: "MNIST CNN", "alexnet": "AlexNet", "googlenet": "GoogLeNet",
          "resnet50": "ResNet-50"}
INPUT, OUTPUT = "image", "logits"

_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
input [ {{ name: "image" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {classes} ] }} ]
{batching}instance_group [ {{ kind: KIND_AUTO count: {instances} }} ]
parameters {{ key: "devices" value: {{ string_value: "{devices}" }} }}
"""


@dataclass(frozen=True)
class BenchModel:
    name: str
    path: Path

    @property
    def title(self) -> str:
        return TITLES.get(self.name, self.name)

    @property
    def dims(self) -> tuple[int, ...]:
        return (1, 28, 28) if self.name == MNIST else (3, 224, 224)

    @property
    def classes(self) -> int:
        return 10 if self.name == MNIST else 1000

    @cached_property
    def flops_per_image(self) -> int:
        return count_flops(self.path).total

    def images(self, count: int, seed: int = 0) -> np.ndarray:
        """Inputs in [0, 1): synthetic, ImageNet- or MNIST-shaped."""
        return np.random.default_rng(seed).random((count, *self.dims), np.float32)


def build(names: list[str], folder: Path) -> list[BenchModel]:
    """ONNX files of the named models under `folder` (the MNIST CNN is the repository's)."""
    from tools import cnn_architectures

    out = []
    for name in names:
        if name == MNIST:
            out.append(BenchModel(name, ROOT / "models" / MNIST / "1" / "model.onnx"))
            continue
        if name not in cnn_architectures.ARCHITECTURES:
            raise ValueError(f"model {name!r} is unknown; expected one of {list(NAMES)}")
        path = folder / f"{name}.onnx"
        if not path.exists():
            onnx.save(cnn_architectures.ARCHITECTURES[name](), str(path))
        out.append(BenchModel(name, path))
    return out


def write_repository(root: Path, models: list[BenchModel], devices: str, max_batch: int,
                     queue_delay_us: int | None = None, instances: int = 1) -> Path:
    """A Triton-layout repository serving `models` on `devices` (the model's `devices`
    parameter); no dynamic batching unless `queue_delay_us` is given, so that a request of N
    images runs as one batch of N."""
    batching = ("" if queue_delay_us is None else
                f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n")
    for m in models:
        folder = root / m.name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        target = folder / "1" / "model.onnx"
        if not target.exists():  # the daemon reads no model file through a link
            try:
                os.link(m.path, target)
            except OSError:  # another file system
                shutil.copyfile(m.path, target)
        config = _CONFIG.format(
            name=m.name, max_batch=max_batch, dims=", ".join(map(str, m.dims)),
            classes=m.classes, batching=batching, instances=instances, devices=devices)
        safe_files.write_file(folder / "config.pbtxt", config, flag=None)
    return root
