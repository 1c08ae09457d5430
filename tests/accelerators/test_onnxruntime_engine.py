"""The ONNX Runtime engine: a session per batch size through IO binding, provider options read
as Triton's onnxruntime backend reads them, FP16 and TF32, GPU indexes. The sessions-per-bucket
path runs here on the CPU; the tests marked `gpu` run it on CUDA (`make test-gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from accelerators.devices import gpu_count
from accelerators.engine_factory import DeviceSpec, create_engine
from accelerators.engine_options import EngineOptions, OptionError
from accelerators.onnxruntime_engine import OnnxRuntimeEngine, providers
from service.core.engine_settings import parse_engine_options
from tests.support.daemon import MODEL, MODELS
from tools import mnist_digits

PATH = MODELS / MODEL / "1" / "model.onnx"
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
needs_gpu = pytest.mark.skipif(
    gpu_count() == 0 or "CUDAExecutionProvider" not in providers(),
    reason="needs an NVIDIA GPU and onnxruntime-gpu (docs/gpu.md)")


def _options(text: str) -> EngineOptions:
    return parse_engine_options(text_format.Parse(text, model_config_pb2.ModelConfig()))


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def _images(n: int) -> np.ndarray:
    return mnist_digits.holdout_split()[0][:n].astype(np.float32)


def test_a_session_per_batch_size_gives_the_single_session_results() -> None:
    engine = OnnxRuntimeEngine(PATH, 1, use_gpu=False)
    x = _images(4)
    expected = {n: engine.run({"image": x[:n]}, ["logits"])["logits"] for n in (1, 2, 4)}
    engine.fix_batch_sizes((1, 2, 4))
    got = {n: engine.run({"image": x[:n]}, ["logits"])["logits"] for n in (1, 2, 4)}
    engine.run({"image": x[::-1].copy()}, ["logits"])  # replies own their memory: not reused
    for n in (1, 2, 4):
        np.testing.assert_allclose(got[n], expected[n], rtol=engine.tolerance, atol=1e-6)


def test_provider_options_are_read_as_triton_writes_them() -> None:
    options = _options(
        _param("cudnn_conv_algo_search", "1") + _param("gpu_mem_limit", "1024")
        + _param("arena_extend_strategy", "kSameAsRequested") + _param("tf32", "off"))
    cuda = dict(options.providers(CUDA, 3, use_gpu=True)[0][1])
    assert cuda == {"device_id": "3", "use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC",
                    "gpu_mem_limit": "1024", "arena_extend_strategy": "kSameAsRequested"}
    assert options.providers(CUDA, 3, use_gpu=False) == ["CPUExecutionProvider"]
    graphs = _options("optimization { cuda { graphs: true } }")
    assert graphs.providers(CUDA, 0, use_gpu=True)[0][1]["enable_cuda_graph"] == "1"
    assert EngineOptions().tolerance(on_gpu=True) > EngineOptions().tolerance(on_gpu=False)


@pytest.mark.parametrize("config, message", [
    (_param("cudnn_conv_algo_search", "FAST"), r"cudnn_conv_algo_search: 'FAST' is unknown; "
                                               r"expected one of \['0', '1', '2'\]"),
    (_param("cudnn_conv_algo_serch", "1"), r"cudnn_conv_algo_serch: .*accepted: "
                                           r"\['cudnn_conv_algo_search'"),
    (_param("gpu_mem_limit", "lots"), "gpu_mem_limit: 'lots' is not a positive number"),
    (_param("precision", "int4"), r"precision: 'int4' is unknown; expected one of \['fp32'"),
    ('optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "openvino" '
     '} ] } }', r"gpu_execution_accelerator: 'openvino' is unknown; expected one of "
                r"\['tensorrt'\]"),
])
def test_unknown_options_are_errors_naming_the_accepted_ones(config, message) -> None:
    with pytest.raises(OptionError, match=message):
        _options(config)


def test_tensorrt_without_its_provider_says_what_is_missing() -> None:
    options = _options('optimization { execution_accelerators { gpu_execution_accelerator: [ '
                       '{ name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }'
                       ' ] } }')
    with pytest.raises(OptionError, match="TensorrtExecutionProvider is missing"):
        options.providers(CUDA, 0, use_gpu=True)
    trt = options.providers(["TensorrtExecutionProvider", *CUDA], 0, use_gpu=True)[0]
    assert trt == ("TensorrtExecutionProvider", {"device_id": "0", "trt_fp16_enable": "True"})


def test_fp16_keeps_fp32_on_the_wire_and_the_accuracy() -> None:
    images, labels = mnist_digits.holdout_split()
    images = images.astype(np.float32)
    fp32 = OnnxRuntimeEngine(PATH, 1, use_gpu=False)
    fp16 = OnnxRuntimeEngine(PATH, 1, use_gpu=False, options=EngineOptions(fp16=True))
    assert fp16.inputs == fp32.inputs and fp16.outputs == fp32.outputs
    full = fp32.run({"image": images}, ["logits"])["logits"]
    half = fp16.run({"image": images}, ["logits"])["logits"]
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, full, rtol=fp16.tolerance, atol=fp16.tolerance * 10)
    accuracy = [float((out.argmax(1) == labels).mean()) for out in (full, half)]
    assert accuracy[1] >= accuracy[0] - 0.005, accuracy


def test_a_gpu_beyond_the_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match=f"no such device: onnxruntime:gpu{gpu_count() + 1}; "
                                         "this node has "):
        create_engine(DeviceSpec("onnxruntime", f"gpu{gpu_count() + 1}"), PATH)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("tf32", ["on", "off"])
def test_every_gpu_runs_each_bucket_within_the_declared_tolerance(tf32) -> None:
    x = _images(8)
    exact = OnnxRuntimeEngine(PATH, 1, use_gpu=False).run({"image": x}, ["logits"])["logits"]
    for index in range(gpu_count()):
        engine = create_engine(DeviceSpec("onnxruntime", f"gpu{index}"), PATH,
                               ort_options=_options(_param("tf32", tf32)))
        assert engine.device.name == f"gpu{index}"
        engine.fix_batch_sizes((1, 2, 4, 8))
        for n in (1, 2, 4, 8):
            got = engine.run({"image": x[:n]}, ["logits"])["logits"]
            np.testing.assert_allclose(got, exact[:n], rtol=engine.tolerance,
                                       atol=engine.tolerance)


@pytest.mark.gpu
@needs_gpu
def test_cuda_graphs_replay_each_bucket_within_the_declared_tolerance() -> None:
    x = _images(4)
    exact = OnnxRuntimeEngine(PATH, 1, use_gpu=False).run({"image": x}, ["logits"])["logits"]
    engine = create_engine(DeviceSpec("onnxruntime", "gpu0"), PATH,
                           ort_options=_options("optimization { cuda { graphs: true } }"))
    engine.fix_batch_sizes((2, 4))
    for _ in range(3):  # a regular run, the capture, replays
        for n in (2, 4):
            got = engine.run({"image": x[:n]}, ["logits"])["logits"]
            np.testing.assert_allclose(got, exact[:n], rtol=engine.tolerance,
                                       atol=engine.tolerance)


@pytest.mark.gpu
@needs_gpu
def test_a_node_left_to_the_cpu_reads_this_runs_inputs(tmp_path) -> None:
    """Hardmax has no CUDA kernel, so ONNX Runtime runs it on the CPU. Inputs copied into bound
    device buffers outside ONNX Runtime's stream reached it late: 184 of 200 runs on an H200
    answered for the previous (zero) input."""
    from tests.support.onnx_graphs import single_op

    x = np.zeros((1, 4), np.float32)
    model = single_op("Hardmax", {"x": x}, {}, x.shape)
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "hardmax.onnx"
    path.write_bytes(model.SerializeToString())
    engine = create_engine(DeviceSpec("onnxruntime", "gpu0"), path)
    engine.fix_batch_sizes((1, 2))
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = rng.standard_normal((2, 4)).astype(np.float32)
        got = engine.run({"x": x}, ["y"])["y"]
        np.testing.assert_array_equal(got, np.eye(4, dtype=np.float32)[x.argmax(1)])
