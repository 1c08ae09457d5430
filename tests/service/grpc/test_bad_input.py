"""Bad requests get a status and a message naming field, value and expectation; the daemon
keeps serving after each."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.daemon import MODEL, image_input


def _infer_error(client, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(*args, **kwargs)
    return caught.value


@pytest.fixture(autouse=True)
def still_serving_after(client, holdout):
    yield
    result = client.infer(MODEL, image_input(holdout[0][:1]))
    assert result.as_numpy("logits").shape == (1, 10)


@pytest.mark.parametrize("name", ["no_such_model", "../models/mnist_cnn", "..", "a/b"])
def test_unknown_model_is_not_found(client, holdout, name) -> None:
    error = _infer_error(client, name, image_input(holdout[0][:1]))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert repr(name) in error.message()


def test_unknown_version_is_not_found(client, holdout) -> None:
    error = _infer_error(client, MODEL, image_input(holdout[0][:1]), model_version="7")
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "model_version '7'" in error.message() and "[1]" in error.message()


def test_wrong_input_name(client) -> None:
    tensor = grpcclient.InferInput("pixels", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
    error = _infer_error(client, MODEL, [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'pixels'" in error.message() and "['image']" in error.message()


def test_wrong_datatype(client) -> None:
    tensor = grpcclient.InferInput("image", [1, 1, 28, 28], "FP64")
    tensor.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float64))
    error = _infer_error(client, MODEL, [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "FP64 received, FP32 expected" in error.message()


def test_wrong_shape(client) -> None:
    tensor = grpcclient.InferInput("image", [1, 28, 28], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 28, 28), np.float32))
    error = _infer_error(client, MODEL, [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "shape [1, 28, 28] received, [-1, 1, 28, 28] expected" in error.message()


def test_batch_larger_than_max_batch_size(client) -> None:
    error = _infer_error(client, MODEL, image_input(np.zeros((129, 1, 28, 28), np.float32)))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "batch size 129" in error.message() and "max_batch_size 128" in error.message()


def test_byte_count_that_does_not_match_the_shape(daemon) -> None:
    # tritonclient checks sizes itself, so this request is built by hand as a peer would.
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=[2, 1, 28, 28])
    request.raw_input_contents.append(np.zeros(784, np.float32).tobytes())
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "3136 bytes, 6272 expected for FP32 [2, 1, 28, 28]" in caught.value.details()


def test_unknown_requested_output(client, holdout) -> None:
    error = _infer_error(client, MODEL, image_input(holdout[0][:1]),
                         outputs=[grpcclient.InferRequestedOutput("probabilities")])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'probabilities'" in error.message() and "['logits']" in error.message()


@pytest.mark.parametrize("key, value, shown", [
    ("priority", dict(string_param="high"), "string_param 'high'"),
    ("timeout", dict(int64_param=-5), "int64_param -5"),
])
def test_priority_and_timeout_must_be_non_negative_integers(daemon, holdout, key, value,
                                                            shown) -> None:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(holdout[0][:1].tobytes())
    request.parameters[key].CopyFrom(service_pb2.InferParameter(**value))
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"parameters['{key}']: {shown} received" in caught.value.details()
