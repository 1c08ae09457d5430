"""Ten thousand mutated messages against a live daemon, most as calls of their own and a thousand
on one stream: every call ends with a status before its deadline, every streamed message gets a
reply, none is UNKNOWN or INTERNAL (a Python exception), the daemon stays live and serves a good
request afterwards. The seed is fixed and printed, so a failure replays."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from service.grpc.handlers import SERVICE
from tests.support.daemon import MODEL, Daemon

SEED = 20261123
MESSAGES = 10_000
STREAMED = 1_000  # of them, sent on one ModelStreamInfer stream
CONCURRENCY = 32
DEADLINE_S = 20.0
BUDGET_S = 60.0
DATATYPES = ["FP32", "FP16", "FP64", "INT8", "UINT8", "INT32", "INT64", "BOOL", "BYTES", "",
             "fp32", "FP3\x00", "TYPE_FP32"]
PARAMETERS = ["priority", "timeout", "shared_memory_region", "shared_memory_offset",
              "shared_memory_byte_size", "binary_data", "sequence_id", ""]
NAMES = [MODEL, "", "../" + MODEL, MODEL + "\x00", "ü" * 300, "models/" + MODEL, "."]


def _parameter(rng: random.Random) -> service_pb2.InferParameter:
    kind = rng.choice(["bool_param", "int64_param", "uint64_param", "string_param",
                       "double_param", None])
    values = {"bool_param": rng.random() < 0.5,
              "int64_param": rng.choice([-1, 0, 1, 2**63 - 1, -(2**63), rng.randrange(10**6)]),
              "uint64_param": rng.choice([0, 1, 2**64 - 1, rng.randrange(10**6)]),
              "string_param": rng.choice(["", "region", "/dev/shm/x", "../x", "\xff"]),
              "double_param": rng.choice([0.0, -1.5, float("nan"), float("inf")])}
    return service_pb2.InferParameter(**({kind: values[kind]} if kind else {}))


def _mutated_request(rng: random.Random, images: np.ndarray) -> service_pb2.ModelInferRequest:
    """A request with a few of its fields made wrong at random."""
    batch = rng.choice([0, 1, 2, 3, 129])
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=str(rng.randrange(10**6)))
    tensor = request.inputs.add(name="image", datatype="FP32", shape=[batch, 1, 28, 28])
    data = np.resize(images, (batch, 1, 28, 28)).astype(np.float32)
    if rng.random() < 0.15:
        tensor.contents.fp32_contents.extend(data.reshape(-1).tolist())
    else:
        request.raw_input_contents.append(data.tobytes())
    for _ in range(rng.randrange(4)):
        change = rng.randrange(10)
        if change == 0:
            tensor.ClearField("shape")
            tensor.shape.extend(rng.choice([-1, 0, 1, 28, 2**31, 2**62])
                                for _ in range(rng.randrange(7)))
        elif change == 1:
            tensor.datatype = rng.choice(DATATYPES)
        elif change == 2:
            tensor.name = rng.choice(["", "pixels", "image\x00", "image"])
        elif change == 3:
            key = rng.choice(PARAMETERS)
            target = rng.choice([request.parameters, tensor.parameters])
            target[key].CopyFrom(_parameter(rng))
        elif change == 4:
            output = request.outputs.add(name=rng.choice(["logits", "", "probabilities"]))
            if rng.random() < 0.5:
                output.parameters[rng.choice(PARAMETERS)].CopyFrom(_parameter(rng))
        elif change == 5:
            request.model_name = rng.choice(NAMES)
            request.model_version = rng.choice(["", "1", "0", "-1", "x", "99999999999999999"])
        elif change == 6:
            request.raw_input_contents.append(rng.randbytes(rng.randrange(64)))
        elif change == 7:
            extra = request.inputs.add(name=rng.choice(["image", "other"]),
                                       datatype=rng.choice(DATATYPES),
                                       shape=[rng.randrange(-2, 4)])
            extra.contents.int_contents.extend(rng.randrange(-300, 300)
                                               for _ in range(rng.randrange(4)))
        elif change == 8:
            tensor.contents.int64_contents.extend([2**40, -1])
        else:
            del request.raw_input_contents[:]
    return request


def _mutated_bytes(rng: random.Random, good: bytes) -> bytes:
    data = bytearray(good)
    mutation = rng.randrange(3)
    if mutation == 0 and data:  # bit flips
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif mutation == 1:  # truncation
        del data[rng.randrange(len(data) + 1):]
    else:  # random bytes
        data = bytearray(rng.randbytes(rng.randrange(200)))
    return bytes(data)


def _messages(rng: random.Random, images: np.ndarray) -> list[tuple[str, bytes]]:
    """(method, bytes): mostly ModelInfer, some for every other unary method."""
    unary = [m.name for m in SERVICE.methods if not m.client_streaming]
    messages = []
    for _ in range(MESSAGES):
        request = _mutated_request(rng, images)
        kind = rng.random()
        if kind < 0.5:
            messages.append(("ModelInfer", request.SerializeToString()))
        elif kind < 0.85:
            messages.append(("ModelInfer", _mutated_bytes(rng, request.SerializeToString())))
        else:
            messages.append((rng.choice(unary), _mutated_bytes(rng, request.SerializeToString())))
    return messages


async def _send_all(address: str, messages: list[tuple[str, bytes]]) -> Counter:
    statuses: Counter = Counter()
    bad: list[str] = []
    limit = asyncio.Semaphore(CONCURRENCY)
    async with grpc.aio.insecure_channel(address) as channel:
        calls = {m.name: channel.unary_unary(f"/{SERVICE.full_name}/{m.name}")
                 for m in SERVICE.methods}

        async def one(method: str, data: bytes) -> None:
            async with limit:
                try:
                    await calls[method](data, timeout=DEADLINE_S)
                    code, details = grpc.StatusCode.OK, ""
                except grpc.aio.AioRpcError as e:
                    code, details = e.code(), e.details() or ""
            statuses[code.name] += 1
            # A client-side deadline says "Deadline Exceeded"; the daemon's own names a reason.
            if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) or \
                    (code == grpc.StatusCode.DEADLINE_EXCEEDED and details == "Deadline Exceeded"):
                bad.append(f"{method} {data[:80]!r}: {code.name} {details}")

        unary, streamed = messages[STREAMED:], [data for _, data in messages[:STREAMED]]
        await asyncio.gather(*(one(method, data) for method, data in unary))
        stream = channel.stream_stream(
            f"/{SERVICE.full_name}/ModelStreamInfer",
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        replies = [r async for r in stream(iter(streamed), timeout=BUDGET_S)]
        assert len(replies) == len(streamed), "a message on the stream got no reply"
        for reply in replies:
            code = reply.error_message.partition(":")[0] or "OK"
            statuses[code] += 1
            if code in ("UNKNOWN", "INTERNAL"):
                bad.append(f"ModelStreamInfer: {reply.error_message}")
        live = service_pb2.ServerLiveResponse.FromString(
            await calls["ServerLive"](b"", timeout=10))
    assert not bad, f"{len(bad)} calls failed badly, e.g.:\n" + "\n".join(bad[:10])
    assert live.live
    return statuses


def test_ten_thousand_mutated_messages(tmp_path, holdout) -> None:
    print(f"fuzz seed {SEED}")
    rng = random.Random(SEED)
    messages = _messages(rng, holdout[0][:3])
    daemon = Daemon(tmp_path)
    try:
        started = time.monotonic()
        statuses = asyncio.run(asyncio.wait_for(_send_all(daemon.socket_url, messages),
                                                BUDGET_S))
        print(f"{len(messages)} messages in {time.monotonic() - started:.1f} s: "
              f"{dict(statuses)}")
        assert sum(statuses.values()) == MESSAGES
        assert statuses["INVALID_ARGUMENT"] > MESSAGES // 4 and statuses["OK"] > 100
        good = service_pb2.ModelInferRequest(model_name=MODEL)
        good.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
        good.raw_input_contents.append(holdout[0][:1].tobytes())
        with grpc.insecure_channel(daemon.url) as channel:
            reply = service_pb2.ModelInferResponse.FromString(channel.unary_unary(
                f"/{SERVICE.full_name}/ModelInfer")(good.SerializeToString(), timeout=10))
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).shape == (10,)
    finally:
        assert daemon.stop() == 0
    assert "Traceback" not in daemon.process.log_path.read_text()
