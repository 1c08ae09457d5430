"""Messages no client library would send, answered as Triton answers them: a status naming what
is wrong, never UNKNOWN, never a traceback in the daemon's log."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.grpc.handlers import SERVICE
from tests.support.daemon import MODEL

TRUNCATED = b"\x0a\x05ab"  # field 1, five bytes announced, two sent: no message parses it
UNARY = [m.name for m in SERVICE.methods if not m.client_streaming]


def _call(channel: grpc.Channel, method: str, data: bytes) -> grpc.RpcError:
    call = channel.unary_unary(f"/{SERVICE.full_name}/{method}")
    with pytest.raises(grpc.RpcError) as caught:
        call(data, timeout=10)
    return caught.value


def _digit_request(holdout) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id="good")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(holdout[0][:1].tobytes())
    return request


@pytest.mark.parametrize("method", UNARY)
def test_bytes_that_do_not_parse_are_invalid_argument(daemon, method) -> None:
    with grpc.insecure_channel(daemon.url) as channel:
        error = _call(channel, method, TRUNCATED)
    if method.startswith(("CudaShared", "Trace", "Log")):
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED  # never parsed: not served
    else:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        expected = next(m for m in SERVICE.methods if m.name == method).input_type.full_name
        assert error.details().startswith(f"{method}: the request is not a valid {expected}")


def test_a_bad_message_on_a_stream_fails_alone(daemon, holdout) -> None:
    good = _digit_request(holdout).SerializeToString()
    with grpc.insecure_channel(daemon.url) as channel:
        stream = channel.stream_stream(f"/{SERVICE.full_name}/ModelStreamInfer",
                                       response_deserializer=service_pb2.ModelStreamInferResponse
                                       .FromString)
        replies = list(stream(iter([TRUNCATED, good]), timeout=30))
    errors = [r.error_message for r in replies if r.error_message]
    answered = [r.infer_response.id for r in replies if not r.error_message]
    assert len(errors) == 1 and errors[0].startswith(
        "INVALID_ARGUMENT: the request is not a valid inference.ModelInferRequest")
    assert answered == ["good"]


def test_contents_and_raw_bytes_for_one_input_are_refused(daemon, holdout) -> None:
    request = _digit_request(holdout)
    request.inputs[0].contents.fp32_contents.extend(np.zeros(784, np.float32).tolist())
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == ("input 'image': both contents and raw_input_contents "
                                      "received; send the tensor in one of them")


def test_the_header_is_checked_against_the_model_before_any_value_is_converted(daemon) -> None:
    """83 digits as INT8 contents, each out of INT8's range: the model's datatype is named, so
    the values were never converted (converting them would have failed on their range)."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="INT8", shape=[83, 1, 28, 28]
                       ).contents.int_contents.extend([300] * (83 * 784))
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "input 'image': datatype INT8 received, FP32 expected"


@pytest.mark.parametrize("shape, output, message", [
    ([83, 1, 28, 27], "logits", "input 'image': shape [83, 1, 28, 27] received, "
                                "[-1, 1, 28, 28] expected"),
    ([83, 1, 28, 28], "no-such-output", "outputs: unknown output 'no-such-output'"),
])
def test_a_typed_request_the_model_refuses_is_refused_from_its_header(daemon, shape, output,
                                                                     message) -> None:
    """Typed contents at the cap, with the wrong shape or an output the model lacks."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=shape).contents.fp32_contents.extend(
        [0.25] * int(np.prod(shape)))
    request.outputs.add(name=output)
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(message)


@pytest.mark.parametrize("method", ["CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
                                    "CudaSharedMemoryStatus"])
def test_cuda_shared_memory_is_unimplemented_without_a_traceback(daemon, method) -> None:
    request = getattr(service_pb2, f"{method}Request")(name="region")
    with grpc.insecure_channel(daemon.url) as channel:
        error = _call(channel, method, request.SerializeToString())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error.details() == f"{method} is not supported by hetserve (use system shared memory)"
    assert "Traceback" not in daemon.process.log_path.read_text()


def test_typed_contents_beyond_the_cap_are_refused_before_decoding(daemon) -> None:
    """128 digits as typed fp32_contents (100,352 values): refused at once, pointing to raw
    bytes, instead of being converted value by value on the event loop."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="image", datatype="FP32", shape=[128, 1, 28, 28])
    tensor.contents.fp32_contents.extend(np.zeros(128 * 784, np.float32).tolist())
    with grpc.insecure_channel(daemon.url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "100352 values in contents received; typed contents are taken up to 65536" in \
        caught.value.details() and "raw_input_contents" in caught.value.details()
