"""Daemons serving variants of the example model on the faulty test engine."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from accelerators.devices import gpu_count
from accelerators.engine import parse_device_name
from accelerators.onnxruntime_engine import OnnxRuntimeEngine, providers
from tests.accelerators.conftest import emulated_fpga
from tests.conftest import MODEL, MODELS, Daemon
from tests.service.faulty_engine import CONTROL_ENV

ENGINE_MODULE = "tests.service.faulty_engine"


class Control:
    """Slows down or breaks the faulty engine of a running daemon."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set()

    def set(self, delay_s: float = 0.0, fail: bool = False,
            delays: dict[str, float] | None = None) -> None:
        self.path.write_text(json.dumps({"delay_s": delay_s, "fail": fail,
                                         "delays": delays or {}}))


def write_model(root: Path, max_batch_size: int, dynamic_batching: str | None,
                parameters: dict[str, str], instances: int = 1) -> Path:
    """The example model with its batching, engine instances per device (one by default, so
    that a device's capacity is one engine's) and parameters replaced."""
    folder = root / MODEL
    shutil.copytree(MODELS / MODEL / "1", folder / "1")
    shutil.copy(MODELS / MODEL / "labels.txt", folder)
    config = (MODELS / MODEL / "config.pbtxt").read_text()
    config = config.replace("max_batch_size: 128", f"max_batch_size: {max_batch_size}")
    config = re.sub(r"dynamic_batching \{.*\}\n",
                    f"dynamic_batching {{ {dynamic_batching} }}\n" if dynamic_batching else "",
                    config)
    config = re.sub(r"instance_group .*\n",
                    f"instance_group [ {{ kind: KIND_AUTO count: {instances} }} ]\n", config)
    config += "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                      for k, v in parameters.items())
    (folder / "config.pbtxt").write_text(config)
    return root


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """serve(max_batch_size, dynamic_batching, *daemon_args, instances=1, **parameters)
    -> (Daemon, Control);
    stopped at the end of the test (exit status 0 checked)."""
    control = Control(tmp_path / "control.json")
    monkeypatch.setenv(CONTROL_ENV, str(control.path))
    started: list[Daemon] = []

    def start(max_batch_size: int, dynamic_batching: str | None, *daemon_args: str,
              instances: int = 1, **parameters: str) -> tuple[Daemon, Control]:
        models = write_model(tmp_path / "models", max_batch_size, dynamic_batching, parameters,
                             instances)
        started.append(Daemon(tmp_path, models, "--engine-modules", ENGINE_MODULE,
                              *daemon_args))
        return started[-1], control

    yield start
    for d in started:
        assert d.stop() == 0


def scrape(url: str) -> dict[str, float]:
    """Every sample of the daemon's /metrics, keyed by name and labels as exposed."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {key: float(value) for key, value in
            re.findall(r"^(\w+(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE)}


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and all(
        f'{label}="{value}"' in k for label, value in labels.items()))


@functools.cache
def node_devices() -> list[str]:
    """The devices the example model (`devices: opencl:fpga0, onnxruntime`) is served on here,
    as metrics name them: fpga0 where it is Intel's emulator (a board needs its binary), then
    every GPU where onnxruntime-gpu can use them, else the CPU."""
    fpga = [emulated_fpga()] if emulated_fpga() else []
    if gpu_count() and "CUDAExecutionProvider" in providers():
        return fpga + [f"gpu{i}" for i in range(gpu_count())]
    return fpga + ["cpu0"]


def reply_devices() -> list[str]:
    """node_devices() as replies name them, with their engine: the emulator as
    `opencl:fpga0 (emulated)`, the others `onnxruntime:gpu0` or `onnxruntime:cpu0`."""
    return [f"opencl:{d} (emulated)" if d.startswith("fpga") else f"onnxruntime:{d}"
            for d in node_devices()]


@functools.cache
def _reference(device: str) -> OnnxRuntimeEngine:
    kind, index = parse_device_name(device)
    return OnnxRuntimeEngine(MODELS / MODEL / "1" / "model.onnx", 1, use_gpu=kind == "gpu",
                             device_id=index)


def assert_served(reply: np.ndarray, device: str, images: np.ndarray) -> None:
    """`reply` equals the example model run in-process by the same engine on the device that
    served it (the reply's `device`), within the tolerance that engine declares (TF32 on GPUs);
    hetserve's OpenCL kernels (the emulated FPGA) within 1e-4 of ONNX Runtime on the CPU."""
    device = device.partition(":")[2].removesuffix(" (emulated)")  # the engine's device
    if device.startswith("fpga"):
        reference, tolerance = _reference("cpu0"), 1e-4
    else:
        reference = _reference(device)
        tolerance = reference.tolerance
    expected = reference.run({"image": np.ascontiguousarray(images)}, ["logits"])["logits"]
    np.testing.assert_allclose(reply, expected, rtol=tolerance, atol=tolerance)


def as_nobody(code: str) -> subprocess.CompletedProcess:
    """`code` run with this Python by another local user (nobody), via setpriv; skipped where
    this is not root, setpriv is missing or nobody cannot run this checkout's Python."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a second local user (nobody) with setpriv")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")
    run = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                          sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                         timeout=60)
    if "Permission denied" in run.stderr and "python" in run.stderr.lower():
        pytest.skip("nobody cannot run this checkout's Python (its folder is private)")
    return run
