"""A request's inputs, header first: each input's datatype and shape are checked before any of
its values is read; then its values become numpy arrays (raw bytes without a copy, a region of
the caller's shared memory read where its batch is assembled, or typed values converted here
when they are few, else in the decoding process). Also the request's options and the parameters
that place a tensor in shared memory."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from service import contract
from service.core.queue_policy import RequestOptions
from service.edge.shared_memory import Caller, RegionTensor, SharedMemoryRegions
from service.errors import InvalidInputError, shown
from service.protocol.types import Contents, InferRequest, Parameters, SharedMemoryRef, Value

# Beyond any message or region, and within numpy's size arithmetic (zero dimensions too).
_MAX_TENSOR_BYTES = 1 << 40
# Typed contents are converted value by value: up to INLINE_TYPED_VALUES on the event loop
# (about 0.2 ms), more in the decoding process (service/protocol/decoding.py), at most
# MAX_TYPED_VALUES an input (65,536 take 3-10 ms there on a shared 2-vCPU machine).
INLINE_TYPED_VALUES = 4096
MAX_TYPED_VALUES = 1 << 16
# The tensor parameters that place it in shared memory (what REST refuses, too).
SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def uses_shared_memory(request: InferRequest) -> bool:
    """Whether any tensor of the request names shared memory (other parameters, such as an
    output's `classification`, do not)."""
    return any(key in parameters for parameters in (
        *(t.parameters for t in request.inputs), *(o.parameters for o in request.outputs))
        for key in SHM_KEYS)


@dataclass(frozen=True, slots=True)
class Header:
    """An input as its request's header describes it, before any of its values is read: what
    the model checks first (ModelSpec.validate)."""

    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Typed:
    """An input's typed values, still to convert (`typed`, in the decoding process where they
    are many)."""

    contents: Contents
    datatype: str
    shape: tuple[int, ...]
    field: str  # the request's, for errors


def headers(request: InferRequest) -> dict[str, Header]:
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
        shape = t.shape
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


def decode_inputs(request: InferRequest, found: dict[str, Header],
                  regions: SharedMemoryRegions, caller: Caller | None
                  ) -> dict[str, np.ndarray | RegionTensor | Typed]:
    """Each input of a request whose `headers` are `found` (and checked against the model): from
    `caller`'s shared memory (read only where its batch is assembled), raw bytes (one entry per
    input not in shared memory, in order; no copy), or typed contents, converted here when they
    are few, else left to convert (Typed)."""
    raw = request.raw
    inputs = request.inputs
    in_memory = [shared_memory(t.parameters, "input", t.name) if t.parameters else None
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
            if t.contents is not None:
                raise InvalidInputError(f"{field}: both contents and {where} "
                                        "received; send the tensor in one of them")
            expected = count * dtype.itemsize
            if place is not None and place.byte_size != expected:  # checked before a byte is read
                raise InvalidInputError(
                    f"{field}: parameters['shared_memory_byte_size'] {place.byte_size} received, "
                    f"{expected} expected for {t.datatype} {list(shape)}")
            if place is not None:  # read where its batch is assembled
                arrays[t.name] = regions.tensor(place.region, place.offset, place.byte_size,
                                                caller, field, dtype, shape)
                continue
            data = next(raw_entries)
            if len(data) != expected:
                raise InvalidInputError(
                    f"{field}: {where} holds {len(data)} bytes, {expected} expected "
                    f"for {t.datatype} {list(shape)}")
            arrays[t.name] = np.ndarray(shape, dtype, buffer=data)  # a view of the bytes
            continue
        values = t.contents.count if t.contents is not None else 0
        if values > MAX_TYPED_VALUES:  # refused before any value is converted
            raise InvalidInputError(
                f"{field}: {values} values in contents received; typed contents are "
                f"taken up to {MAX_TYPED_VALUES} values: send larger tensors as "
                "raw_input_contents or shared memory")
        if values != count:
            raise InvalidInputError(
                f"{field}: {values} values in contents received, {count} "
                f"expected for {t.datatype} {list(shape)} (FP16 travels only as raw bytes)")
        if t.contents is None:  # an empty tensor, sent with no values at all
            arrays[t.name] = np.empty(shape, dtype)
            continue
        tensor = Typed(t.contents, t.datatype, shape, field)
        arrays[t.name] = typed(tensor) if values <= INLINE_TYPED_VALUES else tensor
    return arrays


def typed(tensor: Typed) -> np.ndarray:
    """Typed contents converted, value by value."""
    values = tensor.contents.decode(tensor.contents.data, tensor.datatype)
    try:
        return np.asarray(values, contract.numpy_dtype(tensor.datatype)).reshape(tensor.shape)
    except OverflowError:
        raise InvalidInputError(f"{tensor.field}: contents hold values outside the range of "
                                f"{tensor.datatype}") from None


def shared_memory(parameters: Parameters, side: str, name: str) -> SharedMemoryRef | None:
    """Where a tensor (`side` "input" or "output") placed in shared memory lies, else None."""
    if "shared_memory_region" not in parameters:
        return None
    field = f"{side} {shown(name)}"
    size = natural(parameters, "shared_memory_byte_size", f"{field}: ")
    if size is None:
        raise InvalidInputError(f"{field}: parameters['shared_memory_byte_size'] is missing; "
                                "a tensor in shared memory needs its size")
    region = parameters["shared_memory_region"]
    return SharedMemoryRef(region if isinstance(region, str) else "",
                           natural(parameters, "shared_memory_offset", f"{field}: ") or 0, size)


def natural(parameters: Parameters, key: str, prefix: str) -> int | None:
    """A non-negative integer parameter as tritonclient sends it; None when absent. `prefix`
    places the parameter in error messages (a tensor's, or the request's when empty)."""
    if key not in parameters:
        return None
    value = parameters[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        kind = kind_of(value)
        raise InvalidInputError(f"{prefix}parameters[{key!r}]: {kind} "
                                f"{shown(value) if kind else 'nothing'} received, a "
                                "non-negative uint64_param or int64_param expected")
    return value


def kind_of(value: Value) -> str | None:
    """The protocol's name for a parameter's kind (gRPC's InferParameter field)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool_param"
    if isinstance(value, int):
        return "int64_param" if value < 1 << 63 else "uint64_param"
    return "double_param" if isinstance(value, float) else "string_param"


def request_options(request: InferRequest, time_remaining_s: float | None,
                    caller: str = "", anonymous: bool = False) -> RequestOptions:
    """Priority and queue timeout (µs) as tritonclient sends them, the call's deadline, and whose
    queue places the request takes (RequestOptions)."""
    # grpc reports no deadline as None or as a practically infinite time
    deadline = time.monotonic() + time_remaining_s \
        if time_remaining_s is not None and time_remaining_s < 1e7 else None
    if not request.parameters:
        return RequestOptions(deadline=deadline, caller=caller, anonymous=anonymous)
    priority, timeout = (natural(request.parameters, key, "") for key in ("priority", "timeout"))
    return RequestOptions(priority or 0, timeout or 0, deadline, caller, anonymous)
