"""The pipelined convolution kernels (kernels/pipelined.cl, built with -DPIPELINED): three single
work-item stages chained by FIFOs, here the global-memory FIFOs used where the device has no
channels or pipes (PoCL, Oclgrind), and the Intel channels that the emulated FPGA runs at once.
Convolutions against the float64 reference of the kernel tests; the MNIST example and two
classifiers against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pyopencl as cl
import pytest

from accelerators.opencl.engine import OpenCLEngine
from accelerators.opencl.ir import UnsupportedModelError
from tests.accelerators.conftest import SMALL_GRID, fresh_rng, rel_err, single_op
from tests.accelerators.test_opencl_kernels import CONV, conv_model
from tests.conftest import MODEL, MODELS
from tools import cnn_architectures

STAGES = ["pipe_conv_feed", "pipe_conv_mac", "pipe_conv_drain"]


@pytest.mark.parametrize("case", CONV[:4] if SMALL_GRID else CONV, ids=str)
def test_pipelined_conv(tmp_path, opencl_device, program_cache, case) -> None:
    n = case[0]
    x, model, ref, seed = conv_model(case, relu=True)
    onnx.save(model, str(tmp_path / "conv.onnx"))
    engine = OpenCLEngine(tmp_path / "conv.onnx", opencl_device, program_cache, pipelined=True)
    assert [la.kernel for la in engine.plan(n).launches] == STAGES
    assert all(la.global_size == (1,) for la in engine.plan(n).launches)  # single work-items
    got = engine.run({"x": x}, ["y"])["y"]
    assert rel_err(got, ref) <= 1e-4, f"relative error {rel_err(got, ref):.2e} (seed {seed})"
    # Each stage on its own queue (with channels they run at once; here each waits for the
    # one before), none on the main queue.
    plan = engine.plan(engine.step(n))  # the plan that ran last
    queues = [e.get_info(cl.event_info.COMMAND_QUEUE) for e in plan._events]
    assert len(set(queues)) == 3 and engine._dev.queue not in queues


def test_pipelined_mnist_matches_onnxruntime(opencl_device, program_cache, holdout,
                                             monkeypatch) -> None:
    monkeypatch.setenv("HETSERVE_OPENCL_PIPELINED", "1")  # the build flag's setting
    path = MODELS / MODEL / "1" / "model.onnx"
    engine = OpenCLEngine(path, opencl_device, program_cache)
    kernels = [la.kernel for la in engine.plan(4).launches]
    assert kernels.count("pipe_conv_mac") == 2 and "im2col" not in kernels
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for images in (holdout[0][:4], holdout[0][4:8]):  # the second run reuses the plan
        got = engine.run({"image": images}, ["logits"])["logits"]
        ref = session.run(None, {"image": images})[0]
        assert rel_err(got, ref) <= 1e-3
        assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.skipif(SMALL_GRID, reason="whole classifiers are too slow under Oclgrind")
@pytest.mark.parametrize("name, size", [("mobilenet_v2", 32), ("shufflenet_v2", 64)])
def test_pipelined_classifiers_match_onnxruntime(tmp_path, opencl_device, program_cache, name,
                                                 size) -> None:
    """Depthwise and grouped convolutions, channel shuffles, every Conv through the three
    stages; on the emulated FPGA joined by channels, at a small input (emulated channels are
    slow)."""
    model = cnn_architectures.ARCHITECTURES[name](size=size)
    onnx.save(model, str(tmp_path / "model.onnx"))
    engine = OpenCLEngine(tmp_path / "model.onnx", opencl_device, program_cache, pipelined=True)
    assert "pipe_conv_mac" in {la.kernel for la in engine.plan(1).launches}
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, 3, size, size), np.float32)
    got = engine.run({"image": x}, ["logits"])["logits"]
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    assert rel_err(got, ref) <= 1e-3 and got.argmax() == ref.argmax(), seed


def test_a_window_too_long_for_the_chip_is_refused(tmp_path, opencl_device,
                                                   program_cache) -> None:
    x = np.zeros((1, 520, 3, 3), np.float32)
    model = single_op("Conv", {"x": x}, {"w": np.zeros((2, 520, 3, 3), np.float32)},
                      (1, 2, 1, 1))
    onnx.save(model, str(tmp_path / "wide.onnx"))
    with pytest.raises(UnsupportedModelError, match="window of 4680 values exceeds"):
        OpenCLEngine(tmp_path / "wide.onnx", opencl_device, program_cache, pipelined=True)
