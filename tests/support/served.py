"""Daemons serving variants of the example model (on the faulty test engine, on opencl:cpu0), and
the check that a reply is what the device that served it computes."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient

from accelerators.devices import gpu_count
from accelerators.engine import parse_device_name
from accelerators.onnxruntime_engine import OnnxRuntimeEngine, providers
from tests.support.daemon import MODEL, MODELS, Daemon
from tests.support.metrics import scrape, total
from tests.support.opencl_devices import emulated_fpga

ENGINE_MODULE = "tests.support.faulty_engine"


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


# Both devices load; `prefer` keeps OpenCL first under a budget no loaded machine misses, and
# with the order pinned, however much slower than ONNX Runtime it measures.
DEVICES = ('parameters { key: "devices" value: { string_value: "opencl:cpu0, onnxruntime" } }\n'
           'parameters { key: "latency_budget_ms" value: { string_value: "60000" } }\n'
           'parameters { key: "prefer_order" value: { string_value: "strict" } }\n')


def served(tmp_path: Path, name: str, model: onnx.ModelProto, x: np.ndarray,
           slices: list[tuple[int, int]]) -> list[np.ndarray]:
    """The answers of a daemon serving `model` (one input, one output, a free batch axis) on
    opencl:cpu0 to the slices of `x`; the metrics must show the OpenCL engine ran them all."""
    repo = tmp_path / "models"
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (inp,), (out,) = model.graph.input, model.graph.output
    dims = [d.dim_value for d in out.type.tensor_type.shape.dim[1:]]
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "{inp.name}" data_type: TYPE_FP32 dims: {list(x.shape[1:])} }} ]\n'
        f'output [ {{ name: "{out.name}" data_type: TYPE_FP32 dims: {dims} }} ]\n' + DEVICES)
    daemon = Daemon(tmp_path, repo)
    try:
        answers = []
        with grpcclient.InferenceServerClient(daemon.url) as client:
            for lo, hi in slices:
                tensor = grpcclient.InferInput(inp.name, list(x[lo:hi].shape), "FP32")
                tensor.set_data_from_numpy(x[lo:hi])
                answers.append(client.infer(name, [tensor]).as_numpy(out.name))
        rows = sum(hi - lo for lo, hi in slices)
        assert total(scrape(daemon.metrics_url), "hetserve_inferences_total", engine="opencl",
                     kind="cpu", model=name) == rows
        return answers
    finally:
        assert daemon.stop() == 0
