"""KServe V2's requests and responses as plain typed classes (msgspec structs: cheap to build,
and the workers' channel carries them as they are). A transport converts its own messages to and
from these (service/grpc/codec.py, service/http/codec.py); nothing here knows a wire format."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

# A parameter's value: gRPC's InferParameter kinds (bool, int64/uint64, double, string) or
# REST's JSON scalars; None is a gRPC parameter sent with no value.
Value = bool | int | float | str | None
Parameters = dict[str, Value]


class Identity(msgspec.Struct, frozen=True):
    """Who makes a call, as its transport saw it: the address a door gave its connection
    (service.edge.door.Peers) and what it sent as its authorization (`Bearer <token>`)."""

    peer: str
    authorization: bytes = b""


class Contents(msgspec.Struct, frozen=True):
    """An input's typed values as its transport received them, converted only once the request
    is checked: `count` values that `decode(data, datatype)` lists (a module-level function, as
    it runs in the decoding process where the values are many)."""

    count: int
    data: bytes
    decode: Callable[[bytes, str], Sequence[Any]]


class SharedMemoryRef(msgspec.Struct, frozen=True):
    """Where a tensor lies in a client's registered system shared memory region (its
    `shared_memory_*` parameters, read by service.protocol.inputs.shared_memory)."""

    region: str
    offset: int
    byte_size: int


class InferInput(msgspec.Struct):
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Parameters = {}
    contents: Contents | None = None  # typed values, where the tensor came as such


class RequestedOutput(msgspec.Struct):
    name: str
    parameters: Parameters = {}  # `classification`, shared memory


class InferRequest(msgspec.Struct):
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: Parameters = {}  # `priority`, `timeout` (µs)
    inputs: list[InferInput] = []
    outputs: list[RequestedOutput] = []  # none: every output
    # The bytes of each input not in shared memory nor typed, in order (gRPC's
    # raw_input_contents; REST's binary data, or its JSON values as bytes).
    raw: Sequence[bytes] = ()


class OutputTensor(msgspec.Struct):
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes  # empty where the output went to shared memory
    parameters: Parameters = {}  # an output in shared memory: where


class InferResponse(msgspec.Struct):
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: Parameters = {}  # the device, and what the request cost (service.contract)
    outputs: list[OutputTensor] = []


class StreamReply(msgspec.Struct):
    """One answer on a stream: a response, or an error naming the request's model and id."""

    response: InferResponse
    error: str = ""


class TensorMetadata(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(msgspec.Struct):
    name: str
    version: str
    extensions: list[str]


class Duration(msgspec.Struct):
    count: int = 0
    ns: int = 0


class InferStatistics(msgspec.Struct):
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class BatchStatistics(msgspec.Struct):
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class ModelStatistics(msgspec.Struct):
    """A model version's counts as Triton's ModelStatistics reports them (perf_analyzer reads
    them)."""

    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    batch_stats: list[BatchStatistics]
