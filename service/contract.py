"""What the daemon and its clients (spark_jobs/, tools on the node) must agree on, in the one
module both import: the batch sizes a model's engines run, the wire datatypes, where a daemon's
sockets are, and the parameters a response carries."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2

# A response's parameters: the device that ran the request, and what running it cost: the
# joules attributed to it (double), where the power figure came from (a sensor, or `model`: an
# estimate), how the joules were attributed (ENERGY_METHOD), and the FLOPs it ran (int64).
DEVICE_PARAMETER = "device"
ENERGY_PARAMETER = "energy_joules"
POWER_SOURCE_PARAMETER = "power_source"
ENERGY_METHOD_PARAMETER = "energy_method"
FLOPS_PARAMETER = "flops"
# Present (true) where the FLOPs are a lower bound: the model has ops the counter does not know.
FLOPS_PARTIAL_PARAMETER = "flops_partial"
# Beside it, the op types the counter does not know, comma-separated ("Hardmax,TopK").
FLOPS_UNKNOWN_OPS_PARAMETER = "flops_unknown_ops"
# The batch's run time on the device times the device's full-load watts, shared among the
# batches running on it side by side, split across the batch's rows (padding included).
ENERGY_METHOD = "busy-time-share"
# How a reply's `device` marks an emulated FPGA (`opencl:fpga0 (emulated)`): never taken for a
# board.
EMULATED = "(emulated)"


def reply_device(engine: str, name: str, emulated: bool) -> str:
    """The engine and device as replies (and so the Spark job's energy summary) name them, as a
    model's `devices` parameter and the metrics do: `onnxruntime:cpu0`, `opencl:cpu0`."""
    return f"{engine}:{name}" + (f" {EMULATED}" if emulated else "")


def batch_buckets(max_batch_size: int, preferred: Iterable[int] = ()) -> tuple[int, ...]:
    """The batch sizes a model's engines run (a batch is padded up to the next one): its
    preferred batch sizes, else the powers of two below max_batch_size and max_batch_size
    itself, so that a client's full request of max_batch_size rows is one run, unpadded."""
    chosen = set(preferred) or {1 << i for i in range(max_batch_size.bit_length())
                                if 1 << i < max_batch_size} | {max_batch_size}
    return tuple(sorted(chosen))


# Tensor datatypes across the three vocabularies: protocol ("FP32"), config (TYPE_FP32), numpy.
# Fixed-size datatypes only: BYTES (strings) is not an image-recognition input.
_NUMPY_BY_WIRE: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_WIRE_BY_NUMPY = {v: k for k, v in _NUMPY_BY_WIRE.items()}

# Where a datatype's values sit in InferTensorContents, for clients that send typed contents.
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def wire_names() -> list[str]:
    return list(_NUMPY_BY_WIRE)


def numpy_dtype(wire: str) -> np.dtype | None:
    return _NUMPY_BY_WIRE.get(wire)


def served_dtype(wire: str) -> np.dtype:
    """numpy_dtype of a datatype a model's input may have (ModelSpec.from_config checks them)."""
    dtype = _NUMPY_BY_WIRE.get(wire)
    if dtype is None:
        raise ValueError(f"datatype {wire!r} is not served; expected one of {wire_names()}")
    return dtype


def wire_dtype(dtype: np.dtype) -> str:
    return _WIRE_BY_NUMPY[np.dtype(dtype)]


def wire_from_config(data_type: int) -> str:
    """TYPE_FP32 (config enum) -> "FP32" (protocol)."""
    return model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")


def default_socket() -> Path:
    """A per-user socket in a private folder: node-local clients need no TCP at all."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"hetserve-{os.getuid()}" / "grpc.sock"


def worker_socket(socket: Path, index: int) -> Path:
    """The socket of front-end `index` of a daemon with several: the first serves the daemon's
    own socket, the others serve `<socket>.1`, `<socket>.2`..."""
    return socket if index == 0 else socket.with_name(f"{socket.name}.{index}")


def worker_sockets(socket: Path) -> list[Path]:
    """The sockets a daemon serves now: its own, and those of its other front-ends."""
    found = [socket]
    while (next_one := worker_socket(socket, len(found))).exists():
        found.append(next_one)
    return found


def front_end_addresses(address: str) -> list[str]:
    """The addresses a client spreads its calls over: every socket of a daemon with several
    front-end processes, else the address alone (TCP: the kernel spreads connections over the
    front-ends' SO_REUSEPORT listeners). A region registered at one of them is known to all
    (docs/serving.md). Calls on one socket alone queue behind one front-end's event loop."""
    if not address.startswith("unix:"):
        return [address]
    own = Path(address.removeprefix("unix:").removeprefix("//"))
    return [address] + [f"unix:{path}" for path in worker_sockets(own)[1:]]
