"""The floods of request bodies that bench/floods.py runs: uploads that never finish, and requests
decoded at the daemon's caps. Each attacker process is one caller (bench/floods.py runs several,
each as a uid of its own, where it may) and prints what happened as counts, in JSON. The decode
flood's requests ask for an output the model lacks, so that what they cost the other callers is
decoding, not a device's time: the JSON is parsed in full (in the daemon's decoding process), then
refused 400; the typed requests are refused INVALID_ARGUMENT from their header, before any of
their values is converted. The binary flood sends the same values as binary tensors (gRPC's
`raw_input_contents`, REST's binary extension), refused alike: what the bytes cost without a
decode, the decode flood's reference. The gzip flood sends 58 KB of gzip that inflate to 60 MB:
REST bodies of JSON whitespace (refused 413 once past the JSON cap), and gRPC messages (refused
UNIMPLEMENTED before they are inflated)."""

from __future__ import annotations

import gzip
import http.client
import json
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial

import grpc
import h2.exceptions
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from bench.raw_h2 import RawH2
from service.http.codec import MAX_JSON_BYTES
from service.protocol.inputs import MAX_TYPED_VALUES

MODEL = "mnist_cnn"
INFER = "/inference.GRPCInferenceService/ModelInfer"
_STATUS = {str(code.value[0]): code.name for code in grpc.StatusCode}
IMAGE_VALUES = 28 * 28
_BOMB_BYTES = 60 << 20  # what a gzip flood's request inflates to
NO_OUTPUT = "no-such-output"
DECLARED = 60 << 20  # what each unfinished body says it will be
CHUNK, PACE_S = 16 << 10, 0.02  # each stream's body arrives at 16 KiB per 20 ms (0.8 MB/s)
STREAMS, CONNECTIONS, REST_CONNECTIONS = 4, 4, 2  # per attacker process
FLAGS = ("--max-upload-bytes-per-caller", "--max-buffered-bytes", "--upload-timeout-s",
         "--max-connections-per-peer", "--max-connections-tcp", "--max-rpcs-per-caller")


def _why(text: bytes | str) -> str:
    """The flag a refusal names, else what it said, short."""
    text = text.decode(errors="replace") if isinstance(text, bytes) else text
    return next((flag for flag in FLAGS if flag in text), text[:60] or "closed")


def _grpc_uploads(address: str, end: float, counts: Counter[str]) -> None:
    """Unary calls whose bodies never end, on a connection opened again each time it is ended."""
    while time.monotonic() < end:
        try:
            with RawH2(address) as flood:
                ids = [flood.open(INFER) for _ in range(STREAMS)]
                for stream in ids:
                    flood.h2.send_data(stream, b"\0" + struct.pack(">I", DECLARED))
                while time.monotonic() < end and flood.goaway is None and not flood.closed:
                    for stream in set(ids) - set(flood.ended) - flood.refused:
                        room = min(flood.h2.local_flow_control_window(stream), CHUNK)
                        if room > 0:
                            flood.h2.send_data(stream, bytes(room))
                            counts["bytes sent"] += room
                    flood.flush()
                    flood.read(PACE_S)
                if flood.goaway is not None:
                    counts[f"gRPC GOAWAY {_why(flood.goaway.additional_data or b'')}"] += 1
                elif flood.closed:
                    counts["gRPC closed"] += 1
        except (OSError, TimeoutError, h2.exceptions.H2Error) as e:
            counts[f"gRPC {type(e).__name__}"] += 1
            time.sleep(PACE_S)


def _rest_uploads(host: str, port: int, end: float, counts: Counter[str]) -> None:
    """REST requests whose bodies never end, one per connection, opened again when answered."""
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, port), timeout=5) as sock:
                sock.sendall(f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
                             f"Content-Length: {DECLARED}\r\n\r\n".encode())
                while time.monotonic() < end and not select.select([sock], [], [], PACE_S)[0]:
                    sock.sendall(bytes(CHUNK))
                    counts["bytes sent"] += CHUNK
                if time.monotonic() >= end:
                    counts["REST bodies still arriving at the end"] += 1
                    return
                reply = sock.recv(4096)
                status = reply.split(b" ")[1].decode() if reply.count(b" ") else "closed"
                counts[f"REST {status} {_why(reply)}"] += 1
        except OSError as e:
            counts[f"REST {type(e).__name__}"] += 1
            time.sleep(PACE_S)


def _json_at_the_cap() -> bytes:
    """A REST infer body whose JSON is just under MAX_JSON_BYTES: 128 images of 0.25s."""
    images = 128
    data = ",".join(["0.25"] * (images * IMAGE_VALUES))
    body = (f'{{"inputs":[{{"name":"image","shape":[{images},1,28,28],"datatype":"FP32",'
            f'"data":[{data}]}}],"outputs":[{{"name":"{NO_OUTPUT}"}}]}}').encode()
    assert len(body) <= MAX_JSON_BYTES, len(body)
    return body


def _typed_at_the_cap() -> pb.ModelInferRequest:
    """A gRPC request with as many typed `contents` values as the daemon converts."""
    images = MAX_TYPED_VALUES // IMAGE_VALUES
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="image", datatype="FP32", shape=[images, 1, 28, 28])
    tensor.contents.fp32_contents.extend([0.25] * (images * IMAGE_VALUES))
    request.outputs.add(name=NO_OUTPUT)
    return request


def _binary_at_the_cap() -> tuple[pb.ModelInferRequest, bytes, dict[str, str]]:
    """The decode flood's values as binary tensors: the gRPC request with `raw_input_contents`,
    and a REST body (binary extension) with its headers. What the bytes alone cost."""
    request = _typed_at_the_cap()
    tensor = request.inputs[0]
    raw = np.asarray(tensor.contents.fp32_contents, np.float32).tobytes()
    tensor.ClearField("contents")
    request.raw_input_contents.append(raw)
    images = 128  # as many as the JSON body's
    values = np.full(images * IMAGE_VALUES, 0.25, np.float32).tobytes()
    header = json.dumps({"inputs": [{
        "name": "image", "shape": [images, 1, 28, 28], "datatype": "FP32",
        "parameters": {"binary_data_size": len(values)}}],
        "outputs": [{"name": NO_OUTPUT}]}).encode()
    return request, header + values, {"Inference-Header-Content-Length": str(len(header))}


def _rest_requests(host: str, port: int, end: float, counts: Counter[str], body: bytes,
                   headers: dict[str, str], kind: str) -> None:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        while time.monotonic() < end:
            connection.request("POST", f"/v2/models/{MODEL}/infer", body, headers)
            reply = connection.getresponse()
            counts[f"REST {kind} {len(body) >> 10} KiB: {reply.status}"] += 1
            reply.read()
    finally:
        connection.close()


def _grpc_requests(address: str, end: float, counts: Counter[str],
                   request: pb.ModelInferRequest, kind: str) -> None:
    with grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)]) as channel:
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        size = request.ByteSize() >> 10
        while time.monotonic() < end:
            try:
                infer(request, timeout=30)
                counts[f"gRPC {kind} {size} KiB: OK"] += 1
            except grpc.RpcError as e:
                counts[f"gRPC {kind} {size} KiB: {e.code().name}"] += 1


def _sent(kind: str) -> tuple[pb.ModelInferRequest, bytes, dict[str, str]]:
    """What a `decode` or `binary` flood sends: its gRPC request, its REST body and headers."""
    if kind == "binary":
        return _binary_at_the_cap()
    return _typed_at_the_cap(), _json_at_the_cap(), {}


def _gzip_bomb() -> bytes:
    """60 MB of JSON whitespace in about 58 KB of gzip."""
    return gzip.compress(b" " * _BOMB_BYTES, 9)


def _grpc_gzip_bomb() -> bytes:
    """A ModelInfer message of 60 MB (a batch the model refuses) in about 58 KB of gzip."""
    request = pb.ModelInferRequest(model_name=MODEL)
    images = _BOMB_BYTES // (IMAGE_VALUES * 4)
    request.inputs.add(name="image", datatype="FP32", shape=[images, 1, 28, 28])
    request.raw_input_contents.append(bytes(images * IMAGE_VALUES * 4))
    return gzip.compress(request.SerializeToString(), 9)


def _grpc_gzip_bombs(address: str, end: float, counts: Counter[str], packed: bytes) -> None:
    """ModelInfer calls whose one message is `packed` (_grpc_gzip_bomb), on a connection opened
    again when closed: sent as raw frames, the message compressed once (a gRPC client would
    compress each call again)."""
    while time.monotonic() < end:
        try:
            with RawH2(address) as flood:
                while time.monotonic() < end and flood.goaway is None and not flood.closed:
                    stream = flood.open(INFER, [("grpc-encoding", "gzip")])
                    flood.send_message(stream, packed, end=True, compressed=True)
                    flood.flush()
                    flood.read(30, until=lambda: stream in flood.ended or stream in flood.refused)
                    answer = "REFUSED_STREAM" if stream in flood.refused else \
                        _STATUS.get(flood.ended.get(stream, ""), "no answer")
                    counts[f"gRPC gzip {len(packed) >> 10} KiB: {answer}"] += 1
        except (OSError, TimeoutError, h2.exceptions.H2Error) as e:
            counts[f"gRPC {type(e).__name__}"] += 1
            time.sleep(PACE_S)


def attack(kind: str, host: str, port: int, http_port: int, seconds: float) -> Counter[str]:
    """One caller's flood: `upload`, `decode`, `binary` or `gzip`, on gRPC (`port`) and REST
    (`http_port`)."""
    end = time.monotonic() + seconds
    grpc_address = f"{host}:{port}"
    workers: list[Callable[[float, Counter[str]], None]]  # each a thread
    if kind == "upload":
        workers = [*[partial(_grpc_uploads, grpc_address)] * CONNECTIONS,
                   *[partial(_rest_uploads, host, http_port)] * REST_CONNECTIONS]
    elif kind == "gzip":
        workers = [*[partial(_grpc_gzip_bombs, grpc_address, packed=_grpc_gzip_bomb())] * 2,
                   *[partial(_rest_requests, host, http_port, body=_gzip_bomb(),
                             headers={"Content-Encoding": "gzip"}, kind=kind)] * 2]
    else:
        request, body, headers = _sent(kind)
        workers = [*[partial(_grpc_requests, grpc_address, request=request, kind=kind)] * 2,
                   *[partial(_rest_requests, host, http_port, body=body, headers=headers,
                             kind=kind)] * 2]
    counts: list[Counter[str]] = [Counter() for _ in workers]  # one each: no lost updates
    threads = [threading.Thread(target=work, args=(end, mine), daemon=True)
               for work, mine in zip(workers, counts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return sum(counts, Counter())


def summary(outputs: list[str]) -> str:
    """The attackers' counts (JSON lines), summed, as a line."""
    total: Counter[str] = Counter()
    for output in outputs:
        total.update(json.loads(output))
    sent = total.pop("bytes sent", 0)
    callers = f"{len(outputs)} caller{'s' * (len(outputs) > 1)}"
    return (callers + (f", {sent / 1e6:.0f} MB sent" if sent else "") + ": "
            + ", ".join(f"{n} {what}" for what, n in total.most_common()))
