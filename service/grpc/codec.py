"""gRPC's messages <-> the protocol's types (service/protocol/types.py): request bytes become
messages, messages become requests (raw bytes kept without a copy; typed contents kept as their
message's bytes, converted once the request is checked), responses become messages with every
output in `raw_output_contents`, which is all tritonclient reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2 as pb

from service import contract
from service.errors import InvalidInputError
from service.protocol.inputs import MAX_TYPED_VALUES, kind_of
from service.protocol.types import (
    Contents,
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStatistics,
    Parameters,
    RequestedOutput,
    StreamReply,
)

M = TypeVar("M", bound=Message)


def parse_message(message_class: type[M], data: bytes) -> M:
    """The message in `data`; InvalidInputError where the bytes are no such message."""
    try:
        return message_class.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:  # what protobuf's parsers raise
        raise InvalidInputError(f"the request is not a valid {message_class.DESCRIPTOR.full_name}"
                                f" message ({e})") from None


def infer_request(message: pb.ModelInferRequest) -> InferRequest:
    return InferRequest(
        message.model_name, message.model_version, message.id,
        parameters(message.parameters) if message.parameters else {},
        [InferInput(t.name, t.datatype, tuple(t.shape),
                    parameters(t.parameters) if t.parameters else {}, _contents(t))
         for t in message.inputs],
        [RequestedOutput(o.name, parameters(o.parameters) if o.parameters else {})
         for o in message.outputs],
        message.raw_input_contents)


def parse_infer_request(data: bytes) -> InferRequest:
    """A ModelInferRequest's bytes as a request (a stream's messages)."""
    return infer_request(parse_message(pb.ModelInferRequest, data))


def _contents(tensor: pb.ModelInferRequest.InferInputTensor) -> Contents | None:
    """The tensor's typed values, where it carries any (counted in its datatype's field)."""
    if not (tensor.HasField("contents") and tensor.contents.ListFields()):
        return None
    values = getattr(tensor.contents, contract.CONTENTS_FIELD.get(tensor.datatype, ""), ())
    # Beyond the cap the count alone refuses it (inputs.decode_inputs): no copy on the loop.
    data = tensor.contents.SerializeToString() if len(values) <= MAX_TYPED_VALUES else b""
    return Contents(len(values), data, typed_values)


def typed_values(data: bytes, datatype: str) -> Sequence[Any]:
    """An InferTensorContents' values of `datatype` (in the decoding process where many)."""
    return getattr(pb.InferTensorContents.FromString(data), contract.CONTENTS_FIELD[datatype])


def parameters(given: Mapping[str, pb.InferParameter]) -> Parameters:
    """InferParameters as plain values (None where one carries no value)."""
    found: Parameters = {}
    for key, value in given.items():
        kind = value.WhichOneof("parameter_choice")
        found[key] = getattr(value, kind) if kind else None
    return found


def _set(into: Any, given: Parameters) -> None:
    for key, value in given.items():
        if (kind := kind_of(value)) is not None:
            setattr(into[key], kind, value)


def infer_response(response: InferResponse) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name=response.model_name,
                                    model_version=response.model_version, id=response.id)
    _set(message.parameters, response.parameters)
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype,
                                     shape=output.shape)
        if output.parameters:
            _set(tensor.parameters, output.parameters)
    message.raw_output_contents.extend([o.data for o in response.outputs])
    return message


def stream_reply(reply: StreamReply) -> pb.ModelStreamInferResponse:
    if reply.error:
        return pb.ModelStreamInferResponse(
            error_message=reply.error, infer_response=pb.ModelInferResponse(
                model_name=reply.response.model_name, id=reply.response.id))
    return pb.ModelStreamInferResponse(infer_response=infer_response(reply.response))


def model_metadata(metadata: ModelMetadata) -> pb.ModelMetadataResponse:
    def tensors(specs):
        return [pb.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=t.datatype, shape=t.shape) for t in specs]
    return pb.ModelMetadataResponse(
        name=metadata.name, versions=metadata.versions, platform=metadata.platform,
        inputs=tensors(metadata.inputs), outputs=tensors(metadata.outputs))


def statistics(models: list[ModelStatistics]) -> pb.ModelStatisticsResponse:
    def duration(d) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=d.count, ns=d.ns)
    return pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(
        name=m.name, version=m.version, last_inference=m.last_inference,
        inference_count=m.inference_count, execution_count=m.execution_count,
        inference_stats=pb.InferStatistics(**{
            field: duration(getattr(m.inference_stats, field))
            for field in m.inference_stats.__struct_fields__}),
        batch_stats=[pb.InferBatchStatistics(
            batch_size=b.batch_size, compute_input=duration(b.compute_input),
            compute_infer=duration(b.compute_infer), compute_output=duration(b.compute_output))
            for b in m.batch_stats]) for m in models])
