"""The daemon serving MNIST through the OpenCL engine on PoCL, chosen by the model's `devices`
parameter: the same predictions as onnxruntime, metrics labelled engine="opencl"; a model with an
op the engine lacks falls back to onnxruntime; `hetserve devices --models` says which runs where."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from tests.support.daemon import MODEL, MODELS, Daemon, image_input
from tests.support.metrics import scrape, total
from tests.support.onnx_graphs import single_op, sized_head, symbolic_conv
from tests.support.served import DEVICES


def _repository(root: Path) -> Path:
    """MNIST, and `hardmax_net` (Hardmax: not an op of the OpenCL engine), both preferring
    OpenCL."""
    repo = root / "models"
    shutil.copytree(MODELS / MODEL, repo / MODEL)
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text() + DEVICES)
    x = np.zeros((1, 4), np.float32)
    model = single_op("Hardmax", {"x": x}, {}, x.shape)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    (repo / "hardmax_net" / "1").mkdir(parents=True)
    onnx.save(model, str(repo / "hardmax_net" / "1" / "model.onnx"))
    (repo / "hardmax_net" / "config.pbtxt").write_text(
        'name: "hardmax_net"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n' + DEVICES)
    return repo


def test_devices_command_says_which_models_each_device_runs(tmp_path) -> None:
    listed = json.loads(subprocess.run(
        [sys.executable, "-m", "service", "devices", "--json", "--models",
         str(_repository(tmp_path))], capture_output=True, text=True, check=True).stdout)
    assert listed["models"]["opencl:cpu0"][MODEL] == "yes"
    assert listed["models"]["onnxruntime:cpu0"] == {MODEL: "yes", "hardmax_net": "yes"}
    assert "op 'Hardmax'" in listed["models"]["opencl:cpu0"]["hardmax_net"]


def test_daemon_serves_mnist_through_opencl(tmp_path, holdout) -> None:
    repo = _repository(tmp_path)
    daemon = Daemon(tmp_path, repo)
    try:
        images = holdout[0][:64]
        ref = ort.InferenceSession(str(MODELS / MODEL / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"]).run(
            None, {"image": images})[0]
        with grpcclient.InferenceServerClient(daemon.url) as client:
            for lo, hi in ((0, 1), (1, 9), (9, 64)):
                mnist = client.infer(MODEL, image_input(images[lo:hi]))
                got = mnist.as_numpy("logits")
                assert np.abs(got - ref[lo:hi]).max() <= 1e-3 * np.abs(ref[lo:hi]).max()
                assert (got.argmax(1) == ref[lo:hi].argmax(1)).all()
            x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
            tensor = grpcclient.InferInput("x", [2, 4], "FP32")
            tensor.set_data_from_numpy(x)
            reply = client.infer("hardmax_net", [tensor])
            np.testing.assert_array_equal(reply.as_numpy("y"), np.eye(4)[x.argmax(1)])
            # Hardmax is no op of the FLOP counter: the reply and the metric say partial.
            assert reply.get_response().parameters["flops_partial"].bool_param
            assert reply.get_response().parameters["flops_unknown_ops"].string_param == \
                "Hardmax"
            assert "flops_partial" not in mnist.get_response().parameters
        assert total(scrape(daemon.metrics_url), "hetserve_inferences_total", model=MODEL) == 64
        body = urllib.request.urlopen(daemon.metrics_url).read().decode()
        assert f'hetserve_inferences_total{{device="cpu0",engine="opencl",kind="cpu",' \
               f'model="{MODEL}",version="1"}} 64.0' in body
        assert re.search(r'hetserve_flops_total\{count="partial",[^}]*model="hardmax_net"', body)
        assert re.search(rf'hetserve_flops_total\{{count="complete",[^}}]*model="{MODEL}"', body)
        # The fallback, on whichever device onnxruntime finds (a GPU node's GPU).
        assert re.search(r'engine="onnxruntime",kind="\w+",model="hardmax_net"', body)
    finally:
        assert daemon.stop() == 0


TWO_SHAPES = 'parameters { key: "opencl_shapes" value: { string_value: "2" } }\n'
WARMUP_WIDTH_32 = ('model_warmup [ { name: "w32" batch_size: 1 inputs { key: "x" value: { '
                   'data_type: TYPE_FP32 dims: [ 3, 32 ] zero_data: true } } } ]\n')


def test_symbolic_dims_are_served_at_the_configs_sizes_or_planned_per_request_shape(
        tmp_path) -> None:
    """A model with symbolic spatial dims (as detectors export) under two configs: fixed sizes,
    and variable ones (-1, as Triton allows), both served by the OpenCL engine, the variable one
    planned per request shape, the plans of `opencl_shapes` shapes kept, and counted. A head
    that fixes a dim declared variable is refused there naming the dim, and ONNX Runtime serves
    it. `hetserve devices --models` gives the same verdicts before start-up."""
    repo = tmp_path / "models"
    for name, dims, out in (("conv_fixed", "3, 10, 12", "4, 10, 12"),
                            ("conv_any", "3, -1, -1", "4, -1, -1"), ("head_any", "3, -1", "4")):
        (repo / name / "1").mkdir(parents=True)
        (sized_head if name == "head_any" else symbolic_conv)(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
            f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {out} ] }} ]\n'
            + DEVICES.replace("opencl:cpu0, onnxruntime", "opencl:cpu0, onnxruntime:cpu0")
            # A warm-up at the width the head takes (a model with free dims gets none else).
            + (WARMUP_WIDTH_32 if name == "head_any" else "")
            + (TWO_SHAPES if name == "conv_any" else ""))
    listed = json.loads(subprocess.run(
        [sys.executable, "-m", "service", "devices", "--json", "--models", str(repo)],
        capture_output=True, text=True, check=True).stdout)["models"]
    assert listed["opencl:cpu0"]["conv_fixed"] == listed["opencl:cpu0"]["conv_any"] == "yes"
    assert "input 'x': dim 2 is variable" in listed["opencl:cpu0"]["head_any"]
    daemon = Daemon(tmp_path, repo)
    try:
        with grpcclient.InferenceServerClient(daemon.url) as client:
            devices = {name: client.get_model_config(name).config.parameters[
                "devices"].string_value for name in ("conv_fixed", "conv_any", "head_any")}
            for name, size in (("conv_fixed", (10, 12)), ("conv_any", (7, 9)),
                               ("conv_any", (16, 5)), ("conv_any", (7, 9))):
                tensor = grpcclient.InferInput("x", [1, 3, *size], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 3, *size), np.float32))
                reply = client.infer(name, [tensor])
                assert reply.as_numpy("y").shape == (1, 4, *size)
                # FLOPs at this request's shape (variable dims: counted per shape)
                parameters = reply.get_response().parameters
                assert parameters["flops"].int64_param == 2 * 4 * size[0] * size[1] * 27
                assert "flops_partial" not in parameters
            tensor = grpcclient.InferInput("x", [2, 3, 32], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 3, 32), np.float32))
            np.testing.assert_array_equal(client.infer("head_any", [tensor]).as_numpy("y"), 96)
        metrics = scrape(daemon.metrics_url)
        opencl = dict(device="cpu0", kind="cpu", engine="opencl")
        assert total(metrics, "hetserve_inferences_total", model="conv_any", **opencl) == 3
        # No warm-up for free dims: two request shapes at batch 1, both kept (opencl_shapes 2),
        # the first coming back to its plan. The fixed model: its bucket sizes, warmed.
        plans = {(model, event): total(metrics, "hetserve_opencl_plans_total", model=model,
                                       event=event, **opencl)
                 for model in ("conv_any", "conv_fixed") for event in ("built", "evicted")}
        assert plans == {("conv_any", "built"): 2, ("conv_any", "evicted"): 0,
                         ("conv_fixed", "built"): 3, ("conv_fixed", "evicted"): 0}
    finally:
        assert daemon.stop() == 0
    assert devices == {"conv_fixed": "opencl:cpu0, onnxruntime:cpu0",
                       "conv_any": "opencl:cpu0, onnxruntime:cpu0",
                       "head_any": "onnxruntime:cpu0"}
    log = (tmp_path / "daemon.log").read_text()
    assert re.search(r"'head_any' version 1 cannot run on opencl:cpu0: .*input 'x': dim 2 is "
                     r"variable", log)
