"""The protocol's types, as both transports convert to them (no daemon: the conversions are the
protocol layer's own): one tensor sent over gRPC or REST becomes the same request, a response
reaches each transport with the same fields, and REST shows metadata and statistics exactly as
it did when it rendered gRPC's messages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from service.core import statistics as core
from service.errors import InvalidInputError
from service.grpc import codec as grpc_codec
from service.http import codec as http_codec
from service.protocol import inputs, outputs
from service.protocol.types import (
    InferResponse,
    ModelMetadata,
    OutputTensor,
    SharedMemoryRef,
    TensorMetadata,
)

IMAGE = np.arange(6, dtype=np.float32).reshape(1, 6)


def _grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r1")
    request.parameters["priority"].uint64_param = 1
    request.parameters["timeout"].int64_param = 500
    request.inputs.add(name="x", datatype="FP32", shape=IMAGE.shape)
    request.outputs.add(name="y").parameters["classification"].int64_param = 2
    request.raw_input_contents.append(IMAGE.tobytes())
    return request


def _rest_body(binary: bool) -> tuple[bytes, str | None]:
    tensor = {"name": "x", "datatype": "FP32", "shape": list(IMAGE.shape)}
    if binary:
        tensor["parameters"] = {"binary_data_size": IMAGE.nbytes}
    else:
        tensor["data"] = IMAGE.ravel().tolist()
    header = json.dumps({"id": "r1", "parameters": {"priority": 1, "timeout": 500},
                         "inputs": [tensor],
                         "outputs": [{"name": "y", "parameters": {"classification": 2}}]}
                        ).encode()
    return (header + IMAGE.tobytes(), str(len(header))) if binary else (header, None)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_request_is_the_same_from_either_transport(binary: bool) -> None:
    from_grpc = grpc_codec.infer_request(_grpc_request())
    from_rest, binary_outputs = http_codec.infer_request(*_rest_body(binary), "m", "2")
    assert binary_outputs == set()
    for request in (from_grpc, from_rest):
        assert (request.model_name, request.model_version, request.id) == ("m", "2", "r1")
        assert request.parameters == {"priority": 1, "timeout": 500}
        assert [(t.name, t.datatype, t.shape, t.contents) for t in request.inputs] == \
            [("x", "FP32", (1, 6), None)]
        assert [(o.name, o.parameters) for o in request.outputs] == \
            [("y", {"classification": 2})]
        assert [bytes(r) for r in request.raw] == [IMAGE.tobytes()]
        arrays = inputs.decode_inputs(request, inputs.headers(request), None, None)
        np.testing.assert_array_equal(arrays["x"], IMAGE)
        options = inputs.request_options(request, None)
        assert (options.priority, options.timeout_us) == (1, 500)


def test_typed_contents_are_counted_first_and_converted_once_checked() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 6]).contents.fp32_contents.extend(
        IMAGE.ravel().tolist())
    converted = grpc_codec.infer_request(request)
    assert converted.inputs[0].contents.count == 6
    array = inputs.decode_inputs(converted, inputs.headers(converted), None, None)["x"]
    np.testing.assert_array_equal(array, IMAGE)
    request.inputs[0].shape[:] = [1, 5]
    short = grpc_codec.infer_request(request)
    with pytest.raises(InvalidInputError) as caught:
        inputs.decode_inputs(short, inputs.headers(short), None, None)
    assert str(caught.value) == ("input 'x': 6 values in contents received, 5 expected for FP32 "
                                 "[1, 5] (FP16 travels only as raw bytes)")


@pytest.mark.parametrize("value, shown", [
    (pb.InferParameter(string_param="high"), "string_param 'high'"),
    (pb.InferParameter(int64_param=-5), "int64_param -5"),
    (pb.InferParameter(double_param=1.5), "double_param 1.5"),
    (pb.InferParameter(bool_param=True), "bool_param True"),
    (pb.InferParameter(), "None nothing"),
])
def test_a_parameter_of_the_wrong_kind_is_named_by_its_kind(value, shown) -> None:
    request = _grpc_request()
    request.parameters["priority"].CopyFrom(value)
    with pytest.raises(InvalidInputError) as caught:
        inputs.request_options(grpc_codec.infer_request(request), None)
    assert str(caught.value) == (f"parameters['priority']: {shown} received, a non-negative "
                                 "uint64_param or int64_param expected")


def _response() -> InferResponse:
    classes = outputs.classes(np.array([[0.1, 0.7, 0.2]], np.float32), 2, ("a", "b", "c"), True)
    return InferResponse("m", "2", "r1", {"device": "onnxruntime:cpu0", "energy_joules": 0.5,
                                           "flops": 1 << 40, "flops_partial": True},
                         [OutputTensor("y", "BYTES", classes.shape,
                                       outputs.bytes_tensor(classes)),
                          OutputTensor("z", "FP32", (1, 6), IMAGE.tobytes())])


def test_a_response_reaches_grpc_with_its_fields_and_kinds() -> None:
    message = grpc_codec.infer_response(_response())
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "r1")
    assert {k: v.WhichOneof("parameter_choice") for k, v in message.parameters.items()} == {
        "device": "string_param", "energy_joules": "double_param", "flops": "int64_param",
        "flops_partial": "bool_param"}
    assert message.parameters["flops"].int64_param == 1 << 40
    assert [(t.name, t.datatype, list(t.shape)) for t in message.outputs] == [
        ("y", "BYTES", [1, 2]), ("z", "FP32", [1, 6])]
    assert message.raw_output_contents[1] == IMAGE.tobytes()


def test_a_response_reaches_rest_as_json_and_binary() -> None:
    body, header_length = http_codec.infer_response(_response(), {"z"})
    document = json.loads(body[:header_length])
    assert document["parameters"] == {"device": "onnxruntime:cpu0", "energy_joules": 0.5,
                                      "flops": 1 << 40, "flops_partial": True}
    assert document["outputs"][0]["data"] == ["0.700000:1:b", "0.200000:2:c"]
    assert document["outputs"][1]["parameters"] == {"binary_data_size": IMAGE.nbytes}
    assert body[header_length:] == IMAGE.tobytes()


def test_rest_shows_metadata_and_statistics_as_it_showed_grpcs_messages() -> None:
    stats = core.ModelStatistics()
    stats.success.add(0.002)
    stats.queue.add(0.0005)
    stats.record_batch(2, 3, 0.001, 0.004, 0.0002)
    stats.record_batch(1, 8, 0.001, 0.004, 0.0002)
    models = [outputs.statistics("m", 2, stats)]
    assert http_codec.statistics(models) == http_codec.as_json(grpc_codec.statistics(models))
    metadata = ModelMetadata("m", ["2"], "onnxruntime_onnx",
                             [TensorMetadata("x", "FP32", [-1, 6])],
                             [TensorMetadata("y", "FP32", [-1, 3])])
    assert http_codec.model_metadata(metadata) == \
        http_codec.as_json(grpc_codec.model_metadata(metadata))


def test_shared_memory_is_referenced_over_grpc_and_refused_over_rest() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=IMAGE.shape)
    tensor.parameters["shared_memory_region"].string_param = "io"
    tensor.parameters["shared_memory_byte_size"].uint64_param = IMAGE.nbytes
    tensor.parameters["shared_memory_offset"].int64_param = 64
    converted = grpc_codec.infer_request(request)
    assert inputs.uses_shared_memory(converted)
    assert inputs.shared_memory(converted.inputs[0].parameters, "input", "x") == \
        SharedMemoryRef("io", 64, IMAGE.nbytes)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6],
                                   "data": IMAGE.ravel().tolist(),
                                   "parameters": {"shared_memory_region": "io"}}]}).encode()
    with pytest.raises(InvalidInputError) as caught:
        http_codec.infer_request(body, None, "m", "")
    assert str(caught.value) == ("inputs[0].parameters.shared_memory_region: shared memory is "
                                 "not offered over REST; use gRPC on the daemon's unix socket")
