"""The example model and its repository, and a real daemon on ports and a socket it picks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from service.local_daemon import DaemonProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


MODELS = ROOT / "models"


MODEL = "mnist_cnn"


def self_signed(cert: Path, key: Path, name: str = "localhost") -> None:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)


class Daemon:
    def __init__(self, tmp: Path, models: Path = MODELS, *extra: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.socket = tmp / "grpc.sock"
        self.url = f"127.0.0.1:{self.port}"
        self.socket_url = f"unix:{self.socket}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.process = DaemonProcess(
            ["--models", str(models), "--port", str(self.port), "--socket", str(self.socket),
             "--metrics-port", str(self.metrics_port), *extra], self.url, tmp / "daemon.log")
        self.process.wait_ready()

    def stop(self) -> int:
        return self.process.stop()


def example_repository(root: Path, devices: str) -> Path:
    """The example model alone, served by `devices` (a `devices` parameter) in that order: under
    a latency budget no loaded machine misses, and pinned (`prefer_order: strict`), so that a
    device measured much slower, as the emulator is, still comes first."""
    repo = root / "models"
    shutil.copytree(MODELS / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    text = config.read_text().replace('"opencl:fpga0, onnxruntime"', f'"{devices}"')
    config.write_text(text + 'parameters { key: "latency_budget_ms" value: { string_value: '
                             '"60000" } }\n'
                      'parameters { key: "prefer_order" value: { string_value: "strict" } }\n')
    return repo


def image_input(images: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images, np.float32))
    return [tensor]
