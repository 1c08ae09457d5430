"""uint8 inputs normalised where the model runs: the same answers as the float model given the
normalised pixels, a clear refusal of a malformed option, and a daemon that serves uint8
requests (its OpenCL device declining them with the reason)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from accelerators.engine_options import EngineOptions, OptionError
from accelerators.input_normalization import Normalization, parse
from accelerators.onnx_models import make_model
from accelerators.onnxruntime_engine import OnnxRuntimeEngine
from service.core.engine_settings import parse_engine_options
from tests.support.daemon import MODEL, MODELS, Daemon, example_repository


def test_the_option_names_inputs_and_their_scale_mean_and_std() -> None:
    assert parse("image") == {"image": Normalization()}
    assert parse("a scale=1 mean=0.5,0.25,0 std=2; b std=0.5") == {
        "a": Normalization(1.0, (0.5, 0.25, 0.0), (2.0,)), "b": Normalization(std=(0.5,))}


@pytest.mark.parametrize("text, message", [
    ("image mean=x", r"'mean=x' in 'image mean=x'; expected scale=N"),
    ("image offset=3", r"'offset=3'"),
    ("image std=1 std=2", r"'std=2'"),
    ("image scale=0", r"scale is one positive number and std has no zero"),
    ("image std=1,0,1", r"std has no zero"),
])
def test_a_malformed_option_is_refused_naming_the_part(text, message) -> None:
    with pytest.raises(OptionError, match=message):
        parse_engine_options(_config(text))


def _config(uint8_inputs: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    return text_format.Parse(f'parameters {{ key: "uint8_inputs" value: {{ string_value: '
                             f'"{uint8_inputs}" }} }}', model_config_pb2.ModelConfig())


def test_uint8_pixels_give_the_float_models_answers(holdout) -> None:
    path = MODELS / MODEL / "1" / "model.onnx"
    pixels = np.round(holdout[0][:64] * 255).astype(np.uint8)
    floats = OnnxRuntimeEngine(path, 1, use_gpu=False).run(
        {"image": pixels.astype(np.float32) / 255}, ["logits"])["logits"]
    engine = OnnxRuntimeEngine(path, 1, use_gpu=False,
                               options=EngineOptions(uint8_inputs=parse("image")))
    assert [(t.name, t.datatype) for t in engine.inputs] == [("image", "UINT8")]
    got = engine.run({"image": pixels}, ["logits"])["logits"]
    np.testing.assert_allclose(got, floats, rtol=1e-5, atol=1e-5)


def test_per_channel_mean_and_std_broadcast_along_the_channels(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 2, 2])
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "g", [x], [y], [two]),
        17).SerializeToString())
    norm = "x scale=1 mean=10,20,30 std=1,2,4"
    engine = OnnxRuntimeEngine(path, 1, use_gpu=False,
                               options=EngineOptions(uint8_inputs=parse(norm)))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 3, 2, 2), dtype=np.uint8)
    mean = np.array([10, 20, 30], np.float32).reshape(3, 1, 1)
    std = np.array([1, 2, 4], np.float32).reshape(3, 1, 1)
    np.testing.assert_allclose(engine.run({"x": pixels}, ["y"])["y"],
                               2 * (pixels - mean) / std, rtol=1e-6)


def test_a_daemon_serves_uint8_requests(tmp_path, holdout) -> None:
    repo = example_repository(tmp_path, "opencl:cpu0, onnxruntime:cpu0")
    config = repo / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace("data_type: TYPE_FP32 dims: [ 1, 28, 28 ]",
                                                 "data_type: TYPE_UINT8 dims: [ 1, 28, 28 ]")
                      + 'parameters { key: "uint8_inputs" value: { string_value: "image" } }\n')
    served = Daemon(tmp_path, repo)
    try:
        pixels = np.round(holdout[0][:128] * 255).astype(np.uint8)
        tensor = grpcclient.InferInput("image", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        with grpcclient.InferenceServerClient(served.url) as client:
            reply = client.infer(MODEL, [tensor])
            devices = client.get_model_config(MODEL).config.parameters["devices"].string_value
    finally:
        assert served.stop() == 0
    assert devices == "onnxruntime:cpu0"  # the OpenCL engine declined uint8 inputs
    assert (reply.as_numpy("logits").argmax(1) == holdout[1][:128]).mean() >= 0.95
    log = (tmp_path / "daemon.log").read_text()
    assert "ONNX Runtime normalises uint8 inputs" in log
