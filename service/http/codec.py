"""KServe V2 over HTTP/REST <-> the protocol's types (service/protocol/types.py): a JSON (and
Triton binary-tensor) infer request becomes the same InferRequest gRPC's messages become, so that
both transports share one operations object, its checks, scheduler, priorities and deadlines;
responses go back as JSON, with outputs as binary where the client asks (`binary_data`,
`binary_data_output`)."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import msgspec
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from service import contract
from service.errors import InvalidInputError, shown
from service.protocol.inputs import SHM_KEYS
from service.protocol.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStatistics,
    Parameters,
    RequestedOutput,
)

HEADER_LENGTH = "Inference-Header-Content-Length"  # Triton's binary-tensor extension
_INT64 = (-(1 << 63), (1 << 63) - 1)  # what the protocol's integer fields hold
# An infer request's JSON part is parsed on the event loop up to INLINE_JSON_BYTES (about 0.2
# ms), else in the decoding process (service/protocol/decoding.py), at most MAX_JSON_BYTES (25-80 ms
# there on a shared 2-vCPU machine); tensors beyond travel as binary data (tritonclient.http's
# default), which costs nothing to parse.
INLINE_JSON_BYTES = 16 << 10
MAX_JSON_BYTES = 512 << 10
_AS_BINARY = f"send tensors as binary data (parameters.binary_data_size, header {HEADER_LENGTH})"
JSON_BOUND = (MAX_JSON_BYTES, f"the most JSON parsed: {_AS_BINARY}")  # a JSON body's, inflated
_REST_ONLY = ("binary_data", "binary_data_size", "binary_data_output")


def parse_json(data: bytes | memoryview, what: str) -> dict:
    """A JSON object; InvalidInputError naming `what` otherwise (deep nesting included, or
    more than MAX_JSON_BYTES, refused before parsing)."""
    if len(data) > MAX_JSON_BYTES:
        raise InvalidInputError(f"{what}: {len(data)} bytes of JSON received, at most "
                                f"{MAX_JSON_BYTES} parsed (more would stall other callers): "
                                f"{_AS_BINARY}")
    try:
        document = json.loads(bytes(data) or b"{}")
    except (ValueError, RecursionError) as e:
        raise InvalidInputError(f"{what}: not a JSON document ({str(e)[:200]})") from None
    if not isinstance(document, dict):
        raise InvalidInputError(f"{what}: a JSON object expected, {type(document).__name__} "
                                "received")
    return document


def infer_request(body: bytes, header_length: str | None, model: str,
                  version: str) -> tuple[InferRequest, set[str] | None]:
    """The request, and the outputs to send as binary (None: every output). It pickles: large
    ones are decoded in the decoding process."""
    header: bytes | memoryview
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        try:
            length = int(header_length)
        except ValueError:
            length = -1
        if not 0 <= length <= len(body):
            raise InvalidInputError(f"header {HEADER_LENGTH}: {shown(header_length)} received, "
                                    f"expected the JSON part's length, at most {len(body)}")
        header, binary = memoryview(body)[:length], memoryview(body)[length:]
    document = parse_json(header, "the request body")
    request = InferRequest(model, version, _text(document.get("id", ""), "id"), raw=[])
    parameters = object_field(document.get("parameters", {}), "parameters")
    binary_outputs: set[str] | None = (None if parameters.get("binary_data_output") is True
                                       else set())
    request.parameters = _parameters(parameters, "parameters")
    at = 0
    for i, tensor in enumerate(_list(document.get("inputs"), "inputs")):
        at += _input(request, object_field(tensor, f"inputs[{i}]"), i, binary[at:])
    if at != len(binary):
        raise InvalidInputError(f"body: {len(binary) - at} bytes after the inputs' binary data "
                                "are left over")
    for i, output in enumerate(_list(document.get("outputs", []), "outputs")):
        output = object_field(output, f"outputs[{i}]")
        name = _text(output.get("name"), f"outputs[{i}].name")
        wanted = object_field(output.get("parameters", {}), f"outputs[{i}].parameters")
        if binary_outputs is not None and wanted.get("binary_data") is True:
            binary_outputs.add(name)
        request.outputs.append(RequestedOutput(
            name, _parameters(wanted, f"outputs[{i}].parameters")))
    return request, binary_outputs


def json_bytes(body: bytes, header_length: str | None) -> int:
    """How much of an infer request's body is JSON (all of it where the header is not a
    number: infer_request refuses it)."""
    return int(header_length) if header_length and header_length.isdigit() else len(body)


def _input(request: InferRequest, tensor: dict, index: int, binary: memoryview) -> int:
    """Adds input `index` as raw bytes; how many bytes of `binary` it took."""
    where = f"inputs[{index}]"
    name = _text(tensor.get("name"), f"{where}.name")
    datatype = _text(tensor.get("datatype"), f"{where}.datatype")
    shape = _list(tensor.get("shape"), f"{where}.shape")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _INT64[1]
               for d in shape):
        raise InvalidInputError(f"{where}.shape: {shown(shape)} received, expected "
                                f"non-negative integers up to {_INT64[1]}")
    parameters = object_field(tensor.get("parameters", {}), f"{where}.parameters")
    request.inputs.append(InferInput(name, datatype, tuple(shape),
                                     _parameters(parameters, f"{where}.parameters")))
    raw = request.raw
    assert isinstance(raw, list)  # infer_request's own
    size = parameters.get("binary_data_size")
    dtype = contract.numpy_dtype(datatype)
    if size is not None:
        if not isinstance(size, int) or not 0 <= size <= len(binary):
            raise InvalidInputError(f"{where}.parameters.binary_data_size: {shown(size)} "
                                    f"received, at most the {len(binary)} bytes left expected")
        raw.append(bytes(binary[:size]))
        return size
    if dtype is None:
        raise InvalidInputError(f"{where}.datatype: {shown(datatype)} received, expected one "
                                f"of {contract.wire_names()}")
    try:
        array = np.asarray(tensor.get("data"), dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInputError(f"{where}.data: not {datatype} values ({str(e)[:100]})") from None
    if array.size != (expected := math.prod(shape)):  # in values, as the client wrote them
        raise InvalidInputError(f"{where}.data: {array.size} value{'s' * (array.size != 1)} "
                                f"received, expected {expected} for shape {shape}")
    raw.append(array.tobytes())
    return 0


def infer_response(response: InferResponse,
                   binary_outputs: set[str] | None) -> tuple[bytes, int | None]:
    """The reply's body, and the length of its JSON part where binary outputs follow."""
    document: dict[str, Any] = {"model_name": response.model_name,
                                "model_version": response.model_version,
                                "outputs": []}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    blobs = []
    for tensor in response.outputs:
        output: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                  "shape": list(tensor.shape)}
        if binary_outputs is None or tensor.name in binary_outputs:
            output["parameters"] = {"binary_data_size": len(tensor.data)}
            blobs.append(tensor.data)
        else:
            output["data"] = _values(tensor.datatype, tensor.data)
        document["outputs"].append(output)
    header = json.dumps(document).encode()
    return (header + b"".join(blobs), len(header)) if blobs else (header, None)


def _values(datatype: str, raw: bytes) -> list:
    """A tensor's raw contents as the JSON list of its values, in row-major order."""
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(raw):
            (size,) = struct.unpack_from("<I", raw, at)
            values.append(raw[at + 4:at + 4 + size].decode(errors="replace"))
            at += 4 + size
        return values
    return np.frombuffer(raw, contract.numpy_dtype(datatype)).tolist()


def _parameters(given: dict, where: str) -> Parameters:
    """A JSON object's parameters, checked as the protocol's (REST's own keys left out)."""
    found: Parameters = {}
    for key, value in given.items():
        if key in SHM_KEYS:
            raise InvalidInputError(f"{where}.{key}: shared memory is not offered over REST; "
                                    "use gRPC on the daemon's unix socket")
        if key in _REST_ONLY:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and \
                not _INT64[0] <= value <= _INT64[1]:
            raise InvalidInputError(f"{where}.{key}: {shown(value)} received, expected an "
                                    f"integer from {_INT64[0]} to {_INT64[1]}")
        if not isinstance(value, (bool, int, float, str)):
            raise InvalidInputError(f"{where}.{key}: {shown(value)} received, expected a "
                                    "boolean, number or string")
        found[key] = value
    return found


def model_metadata(metadata: ModelMetadata) -> dict[str, Any]:
    return msgspec.to_builtins(metadata)


def statistics(models: list[ModelStatistics]) -> dict[str, Any]:
    """As Triton's REST API shows them (the fields hetserve does not count empty)."""
    return {"model_stats": [{**msgspec.to_builtins(m), "memory_usage": [], "response_stats": {}}
                            for m in models]}


def as_json(message: Message) -> dict[str, Any]:
    """A protobuf message (a model's configuration) as KServe V2's REST API shows it: the
    .proto's field names, every field with no presence at its value, 64-bit integers as numbers
    (protobuf's JSON mapping writes them as strings, which clients such as perf_analyzer do not
    read as numbers)."""
    document: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"]
            document[field.name] = {k: _json_value(inner, v) for k, v in value.items()}
        elif field.is_repeated:
            document[field.name] = [_json_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            continue
        else:
            document[field.name] = _json_value(field, value)
    return document


def _json_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return as_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.decode(errors="replace")
    return value


def object_field(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidInputError(f"{where}: a JSON object expected, {shown(value)} received")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise InvalidInputError(f"{where}: a JSON array expected, {shown(value)} received")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{where}: a string expected, {shown(value)} received")
    return value
