"""Protocol messages <-> the data plane: request bytes become messages, tensors become numpy
arrays (raw bytes without a copy; typed contents work too), answers become replies."""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from service import contract
from service.core.model import ModelSpec
from service.core.queue_policy import RequestOptions
from service.core.statistics import Duration, ModelStatistics
from service.core.types import Answer
from service.edge.shared_memory import Caller, RegionTensor, SharedMemoryRegions
from service.errors import InvalidInputError, shown

M = TypeVar("M", bound=Message)
# Beyond any message or region, and within numpy's size arithmetic (zero dimensions too).
_MAX_TENSOR_BYTES = 1 << 40
# Typed contents are converted value by value: up to INLINE_TYPED_VALUES on the event loop
# (about 0.2 ms), more in the decoding process (service/grpc/decoding.py), at most
# MAX_TYPED_VALUES an input (65,536 take 3-10 ms there on a shared 2-vCPU machine).
INLINE_TYPED_VALUES = 4096
MAX_TYPED_VALUES = 1 << 16
# The tensor parameters that place it in shared memory (what REST refuses, too).
SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def parse_message(message_class: type[M], data: bytes) -> M:
    """The message in `data`; InvalidInputError where the bytes are no such message."""
    try:
        return message_class.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:  # what protobuf's parsers raise
        raise InvalidInputError(f"the request is not a valid {message_class.DESCRIPTOR.full_name}"
                                f" message ({e})") from None


def uses_shared_memory(request: service_pb2.ModelInferRequest) -> bool:
    """Whether any tensor of the request names shared memory (other parameters, such as an
    output's `classification`, do not)."""
    return any(key in t.parameters for t in (*request.inputs, *request.outputs)
               for key in SHM_KEYS)


@dataclass(frozen=True, slots=True)
class Header:
    """An input as its request's header describes it, before any of its values is read: what
    the model checks first (ModelSpec.validate)."""

    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Typed:
    """An input's typed contents, still to be converted (`typed`, in the decoding process where
    they are many): their message's bytes, and what they must become."""

    contents: bytes  # a serialized InferTensorContents
    datatype: str
    shape: tuple[int, ...]
    field: str  # the request's, for errors


def headers(request: service_pb2.ModelInferRequest) -> dict[str, Header]:
    """Each input's datatype and shape, checked for what any model needs (a known datatype,
    non-negative dimensions of a bounded size, each name once); no value is read."""
    found: dict[str, Header] = {}
    for t in request.inputs:
        field = f"input {shown(t.name)}"
        if t.name in found:
            raise InvalidInputError(f"inputs: {field} appears twice")
        dtype = contract.numpy_dtype(t.datatype)
        if dtype is None:
            raise InvalidInputError(f"{field}: datatype {shown(t.datatype)} received, "
                                    f"expected one of {contract.wire_names()}")
        shape = tuple(t.shape)
        if shape and min(shape) < 0:
            raise InvalidInputError(f"{field}: shape {list(shape)[:8]} received, "
                                    "expected non-negative dimensions")
        # A zero dimension makes any shape empty: bound the others too.
        if (math.prod(shape) or math.prod(max(d, 1) for d in shape)) * dtype.itemsize > \
                _MAX_TENSOR_BYTES:
            raise InvalidInputError(f"{field}: shape {list(shape)[:8]} received, expected "
                                    f"dimensions that describe at most {_MAX_TENSOR_BYTES} bytes")
        found[t.name] = Header(dtype, shape)
    return found


def decode_inputs(request: service_pb2.ModelInferRequest, found: dict[str, Header],
                  regions: SharedMemoryRegions, caller: Caller | None
                  ) -> dict[str, np.ndarray | RegionTensor | Typed]:
    """Each input of a request whose `headers` are `found` (and checked against the model): from
    `caller`'s shared memory (read only where its batch is assembled), raw bytes (one entry per
    input not in shared memory, in order; no copy), or typed contents, converted here when they
    are few, else left to convert (Typed)."""
    raw = request.raw_input_contents
    inputs = list(request.inputs)
    in_memory = [_shared_memory(t.parameters, "input", t.name) if t.parameters else None
                 for t in inputs]
    expected_raw = in_memory.count(None)
    if raw and len(raw) != expected_raw:
        raise InvalidInputError(f"raw_input_contents: {len(raw)} entries received, "
                                f"{expected_raw} expected (one per input not in shared memory)")
    raw_entries = iter(raw)
    arrays: dict[str, np.ndarray | RegionTensor | Typed] = {}
    for t, place in zip(inputs, in_memory):
        field = f"input {shown(t.name)}"
        dtype, shape = found[t.name].dtype, found[t.name].shape
        count = math.prod(shape)
        if place is not None or raw:
            where = "its shared memory" if place is not None else "raw_input_contents"
            if t.HasField("contents") and t.contents.ListFields():
                raise InvalidInputError(f"{field}: both contents and {where} "
                                        "received; send the tensor in one of them")
            expected = count * dtype.itemsize
            if place is not None and place[2] != expected:  # checked before a byte is read
                raise InvalidInputError(
                    f"{field}: parameters['shared_memory_byte_size'] {place[2]} received, "
                    f"{expected} expected for {t.datatype} {list(shape)}")
            if place is not None:  # read where its batch is assembled
                arrays[t.name] = regions.tensor(*place, caller, field, dtype, shape)
                continue
            data = next(raw_entries)
            if len(data) != expected:
                raise InvalidInputError(
                    f"{field}: {where} holds {len(data)} bytes, {expected} expected "
                    f"for {t.datatype} {list(shape)}")
            arrays[t.name] = np.ndarray(shape, dtype, buffer=data)  # a view of the bytes
            continue
        values = len(getattr(t.contents, contract.CONTENTS_FIELD.get(t.datatype, ""), ()))
        if values > MAX_TYPED_VALUES:  # refused before any value is converted
            raise InvalidInputError(
                f"{field}: {values} values in contents received; typed contents are "
                f"taken up to {MAX_TYPED_VALUES} values: send larger tensors as "
                "raw_input_contents or shared memory")
        if values != count:
            raise InvalidInputError(
                f"{field}: {values} values in contents received, {count} "
                f"expected for {t.datatype} {list(shape)} (FP16 travels only as raw bytes)")
        tensor = Typed(t.contents.SerializeToString(), t.datatype, shape, field)
        arrays[t.name] = typed(tensor) if values <= INLINE_TYPED_VALUES else tensor
    return arrays


def typed(tensor: Typed) -> np.ndarray:
    """Typed contents converted, value by value (protobuf's repeated fields hold no buffer)."""
    contents = service_pb2.InferTensorContents.FromString(tensor.contents)
    values = getattr(contents, contract.CONTENTS_FIELD[tensor.datatype])
    try:
        return np.asarray(values, contract.numpy_dtype(tensor.datatype)).reshape(tensor.shape)
    except OverflowError:
        raise InvalidInputError(f"{tensor.field}: contents hold values outside the range of "
                                f"{tensor.datatype}") from None


def encode_response(request: service_pb2.ModelInferRequest, spec: ModelSpec, answer: Answer,
                    regions: SharedMemoryRegions, caller: Caller | None,
                    energy: bool = True) -> service_pb2.ModelInferResponse:
    """Outputs requested in shared memory are written there (their raw entry stays empty, so
    that the others keep their places); an output asked for with `classification` becomes its
    top classes (Triton's classification extension); every other output travels as raw bytes,
    which is all tritonclient reads. The device that ran the request, and with `energy` what it
    cost, are response parameters (service.contract)."""
    response = service_pb2.ModelInferResponse(
        model_name=spec.name, model_version=str(spec.version), id=request.id)
    parameters = response.parameters
    parameters[contract.DEVICE_PARAMETER].string_param = answer.device
    if energy:
        cost = answer.cost
        parameters[contract.ENERGY_PARAMETER].double_param = cost.joules
        parameters[contract.POWER_SOURCE_PARAMETER].string_param = cost.source
        parameters[contract.ENERGY_METHOD_PARAMETER].string_param = contract.ENERGY_METHOD
        parameters[contract.FLOPS_PARAMETER].int64_param = cost.flops
        if cost.flops_partial:
            parameters[contract.FLOPS_PARTIAL_PARAMETER].bool_param = True
            parameters[contract.FLOPS_UNKNOWN_OPS_PARAMETER].string_param = ",".join(
                cost.flops_unknown_ops)
    wanted = {o.name: o.parameters for o in request.outputs} if request.outputs else {}
    for name, array in answer.outputs.items():
        parameters = wanted.get(name)
        count = _natural(parameters, "classification", f"output {shown(name)}: ") \
            if parameters else None
        if count:
            data = classes(array, count, spec.labels.get(name, ()), spec.max_batch_size > 0)
            response.outputs.add(name=name, datatype="BYTES", shape=data.shape)
            array = data
        else:
            response.outputs.add(name=name, datatype=contract.wire_dtype(array.dtype),
                                 shape=array.shape)
        place = _shared_memory(parameters, "output", name) if parameters else None
        if place is None or parameters is None:
            response.raw_output_contents.append(
                bytes_tensor(array) if count else array.tobytes())  # C order, whatever its layout
            continue
        if count:
            raise InvalidInputError(f"output {name!r}: classification and shared memory "
                                    "received; a classified output travels in the reply")
        region, offset, byte_size = place
        if array.nbytes > byte_size:
            raise InvalidInputError(f"output {name!r}: shared_memory_byte_size {byte_size} "
                                    f"received, the output needs {array.nbytes} bytes")
        regions.write(region, offset, array, caller, f"output {name!r}")
        for key in SHM_KEYS:
            if key in parameters:
                response.outputs[-1].parameters[key].CopyFrom(parameters[key])
        response.raw_output_contents.append(b"")
    return response


def classes(array: np.ndarray, count: int, labels: Sequence[str], batched: bool) -> np.ndarray:
    """Triton's classification: each sample's `count` highest values (all where there are
    fewer), highest first, as "<value>:<index>[:<label>]" strings."""
    rows = array.reshape(len(array) if batched else 1, -1)
    top = np.argsort(-rows, axis=1, kind="stable")[:, :count]
    text = np.array([[f"{row[i]:f}:{i}" + (f":{labels[i]}" if i < len(labels) else "")
                      for i in order] for row, order in zip(rows, top)], dtype=object)
    return text if batched else text[0]


def bytes_tensor(array: np.ndarray) -> bytes:
    """A BYTES tensor's raw contents, as the protocol lays them out: each element's length
    (4 bytes, little-endian) then its UTF-8 bytes, in C order."""
    return b"".join(struct.pack("<I", len(b)) + b
                    for b in (str(v).encode() for v in array.reshape(-1)))


def _shared_memory(parameters, side: str, name: str) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) of a tensor (`side` "input" or "output") placed in shared
    memory, else None."""
    if "shared_memory_region" not in parameters:
        return None
    field = f"{side} {shown(name)}"
    size = _natural(parameters, "shared_memory_byte_size", f"{field}: ")
    if size is None:
        raise InvalidInputError(f"{field}: parameters['shared_memory_byte_size'] is missing; "
                                "a tensor in shared memory needs its size")
    return (parameters["shared_memory_region"].string_param,
            _natural(parameters, "shared_memory_offset", f"{field}: ") or 0, size)


def _natural(parameters, key: str, prefix: str) -> int | None:
    """A non-negative integer parameter as tritonclient sends it; None when absent. `prefix`
    places the parameter in error messages (a tensor's, or the request's when empty)."""
    if key not in parameters:
        return None
    param = parameters[key]
    kind = param.WhichOneof("parameter_choice")
    if kind not in ("uint64_param", "int64_param") or getattr(param, kind) < 0:
        value = shown(getattr(param, kind)) if kind else "nothing"
        raise InvalidInputError(f"{prefix}parameters[{key!r}]: {kind} {value} received, a "
                                "non-negative uint64_param or int64_param expected")
    return getattr(param, kind)


def request_options(request: service_pb2.ModelInferRequest, time_remaining_s: float | None,
                    caller: str = "", anonymous: bool = False) -> RequestOptions:
    """Priority and queue timeout (µs) as tritonclient sends them, the gRPC deadline, and whose
    queue places the request takes (RequestOptions)."""
    # grpc reports no deadline as None or as a practically infinite time
    deadline = time.monotonic() + time_remaining_s \
        if time_remaining_s is not None and time_remaining_s < 1e7 else None
    if not request.parameters:
        return RequestOptions(deadline=deadline, caller=caller, anonymous=anonymous)
    priority, timeout = (_natural(request.parameters, key, "") for key in ("priority", "timeout"))
    return RequestOptions(priority or 0, timeout or 0, deadline, caller, anonymous)


def statistics(name: str, version: int, stats: ModelStatistics) -> service_pb2.ModelStatistics:
    """A model's counts as the ModelStatistics RPC (and REST's stats) reports them."""
    def duration(d: Duration) -> service_pb2.StatisticDuration:
        return service_pb2.StatisticDuration(count=d.count, ns=d.ns)
    return service_pb2.ModelStatistics(
        name=name, version=str(version), last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count, execution_count=stats.execution_count,
        inference_stats=service_pb2.InferStatistics(
            success=duration(stats.success), fail=duration(stats.fail),
            queue=duration(stats.queue), compute_input=duration(stats.compute_input),
            compute_infer=duration(stats.compute_infer),
            compute_output=duration(stats.compute_output)),
        batch_stats=[service_pb2.InferBatchStatistics(
            batch_size=size, compute_input=duration(b.compute_input),
            compute_infer=duration(b.compute_infer), compute_output=duration(b.compute_output))
            for size, b in sorted(stats.batches.items())])
