"""Protocol tensors <-> numpy: raw bytes become arrays without a copy; typed contents work too."""

from __future__ import annotations

import math
import time

import numpy as np
from tritonclient.grpc import service_pb2

from service import tensors
from service.batcher import Answer
from service.errors import InvalidInputError
from service.queue_policy import RequestOptions
from service.tensors import Tensors



def decode_inputs(request: service_pb2.ModelInferRequest) -> Tensors:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(f"raw_input_contents: {len(raw)} entries received, "
                                f"{len(request.inputs)} expected (one per input)")
    arrays: Tensors = {}
    for i, t in enumerate(request.inputs):
        if t.name in arrays:
            raise InvalidInputError(f"inputs: input {t.name!r} appears twice")
        dtype = tensors.numpy_dtype(t.datatype)
        if dtype is None:
            raise InvalidInputError(f"input {t.name!r}: datatype {t.datatype!r} received, "
                                    f"expected one of {tensors.wire_names()}")
        shape = tuple(t.shape)
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"input {t.name!r}: shape {list(shape)} received, "
                                    "expected non-negative dimensions")
        count = math.prod(shape)
        if raw:
            expected = count * dtype.itemsize
            if len(raw[i]) != expected:
                raise InvalidInputError(
                    f"input {t.name!r}: raw_input_contents[{i}] holds {len(raw[i])} bytes, "
                    f"{expected} expected for {t.datatype} {list(shape)}")
            arrays[t.name] = np.frombuffer(raw[i], dtype).reshape(shape)
        else:
            values = getattr(t.contents, tensors.CONTENTS_FIELD.get(t.datatype, ""), ())
            if len(values) != count:
                raise InvalidInputError(
                    f"input {t.name!r}: {len(values)} values in contents received, {count} "
                    f"expected for {t.datatype} {list(shape)} (FP16 travels only as raw bytes)")
            arrays[t.name] = np.asarray(values, dtype).reshape(shape)
    return arrays


def encode_response(request: service_pb2.ModelInferRequest, model_name: str, version: int,
                    answer: Answer) -> service_pb2.ModelInferResponse:
    """tritonclient reads only raw_output_contents, so every output travels as raw bytes; the
    device that ran the request travels as the response parameter `device`."""
    response = service_pb2.ModelInferResponse(
        model_name=model_name, model_version=str(version), id=request.id)
    response.parameters["device"].string_param = answer.device
    for name, array in answer.outputs.items():
        response.outputs.add(name=name, datatype=tensors.wire_dtype(array.dtype),
                             shape=array.shape)
        response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return response


def request_options(request: service_pb2.ModelInferRequest,
                    time_remaining_s: float | None) -> RequestOptions:
    """Priority and queue timeout (µs) as tritonclient sends them, and the gRPC deadline."""
    values = {}
    for key in ("priority", "timeout"):
        if key not in request.parameters:
            continue
        param = request.parameters[key]
        kind = param.WhichOneof("parameter_choice")
        if kind not in ("uint64_param", "int64_param") or getattr(param, kind) < 0:
            raise InvalidInputError(
                f"parameters[{key!r}]: {kind} {getattr(param, kind) if kind else None!r} "
                "received, a non-negative uint64_param or int64_param expected")
        values[key] = getattr(param, kind)
    # grpc reports no deadline as None or as a practically infinite time
    deadline = time.monotonic() + time_remaining_s \
        if time_remaining_s is not None and time_remaining_s < 1e7 else None
    return RequestOptions(priority=values.get("priority", 0),
                          timeout_us=values.get("timeout", 0), deadline=deadline)
