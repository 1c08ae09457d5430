"""What a response carries: the outputs asked for (into the caller's shared memory, as top
classes, or as raw bytes), the device that ran the request and what it cost; and a model's
statistics in Triton's terms."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from service import contract
from service.core import statistics as core
from service.core.dataplane import DataPlane
from service.core.model import ModelSpec
from service.core.types import Answer
from service.edge.shared_memory import Caller, SharedMemoryRegions
from service.errors import InvalidInputError, shown
from service.protocol.inputs import SHM_KEYS, natural, shared_memory
from service.protocol.types import (
    BatchStatistics,
    Duration,
    InferRequest,
    InferResponse,
    InferStatistics,
    ModelStatistics,
    OutputTensor,
    Parameters,
)


def respond(request: InferRequest, spec: ModelSpec, answer: Answer,
            regions: SharedMemoryRegions, caller: Caller | None,
            energy: bool = True) -> InferResponse:
    """Outputs requested in shared memory are written there (their data stays empty, so that
    the others keep their places); an output asked for with `classification` becomes its top
    classes (Triton's classification extension); every other output travels as raw bytes. The
    device that ran the request, and with `energy` what it cost, are response parameters
    (service.contract)."""
    parameters: Parameters = {contract.DEVICE_PARAMETER: answer.device}
    if energy:
        cost = answer.cost
        parameters[contract.ENERGY_PARAMETER] = float(cost.joules)
        parameters[contract.POWER_SOURCE_PARAMETER] = cost.source
        parameters[contract.ENERGY_METHOD_PARAMETER] = contract.ENERGY_METHOD
        parameters[contract.FLOPS_PARAMETER] = int(cost.flops)
        if cost.flops_partial:
            parameters[contract.FLOPS_PARTIAL_PARAMETER] = True
            parameters[contract.FLOPS_UNKNOWN_OPS_PARAMETER] = ",".join(cost.flops_unknown_ops)
    response = InferResponse(spec.name, str(spec.version), request.id, parameters)
    wanted = {o.name: o.parameters for o in request.outputs} if request.outputs else {}
    for name, array in answer.outputs.items():
        asked = wanted.get(name)
        count = natural(asked, "classification", f"output {shown(name)}: ") if asked else None
        if count:
            array = classes(array, count, spec.labels.get(name, ()), spec.max_batch_size > 0)
            datatype = "BYTES"
        else:
            datatype = contract.wire_dtype(array.dtype)
        place = shared_memory(asked, "output", name) if asked else None
        if place is None or asked is None:
            response.outputs.append(OutputTensor(
                name, datatype, array.shape,
                bytes_tensor(array) if count else array.tobytes()))  # C order, whatever its layout
            continue
        if count:
            raise InvalidInputError(f"output {name!r}: classification and shared memory "
                                    "received; a classified output travels in the reply")
        if array.nbytes > place.byte_size:
            raise InvalidInputError(f"output {name!r}: shared_memory_byte_size {place.byte_size} "
                                    f"received, the output needs {array.nbytes} bytes")
        regions.write(place.region, place.offset, array, caller, f"output {name!r}")
        response.outputs.append(OutputTensor(name, datatype, array.shape, b"", {
            key: asked[key] for key in SHM_KEYS if key in asked}))
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


def statistics_of(plane: DataPlane, name: str, version: str) -> list[ModelStatistics]:
    """Every served model version's counts when `name` is empty, else the one asked for."""
    return [statistics(m.spec.name, m.spec.version, m.stats)
            for m in plane.statistics(name, version)]


def statistics(name: str, version: int, stats: core.ModelStatistics) -> ModelStatistics:
    """A model's counts as the ModelStatistics RPC (and REST's stats) reports them."""
    def duration(d: core.Duration) -> Duration:
        return Duration(d.count, d.ns)
    return ModelStatistics(
        name, str(version), stats.last_inference_ms, stats.inference_count,
        stats.execution_count, InferStatistics(
            duration(stats.success), duration(stats.fail), duration(stats.queue),
            duration(stats.compute_input), duration(stats.compute_infer),
            duration(stats.compute_output)),
        [BatchStatistics(size, duration(b.compute_input), duration(b.compute_infer),
                         duration(b.compute_output)) for size, b in sorted(stats.batches.items())])
