"""ModelStreamInfer queues each request as it arrives, with no task per request: many requests on
one stream batch together, errors interleaved with them are answered alone, and a client that
goes away mid-stream leaves nothing queued or counted as in flight. A real grpc.aio server with
the servicer in this process (so that the scheduler's state can be read), on the faulty test
engine slowed down so that requests are still waiting when the client acts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

import tests.support.faulty_engine  # noqa: F401  (registers faulty:<device>)
from service.core.dataplane import DataPlane
from service.core.metrics import Metrics
from service.core.model_control import ModelControl
from service.core.registry import LoadedModel, ModelRegistry
from service.edge.door import Peers
from service.edge.shared_memory import SharedMemoryRegions
from service.edge.uploads import UploadBudget
from service.grpc import handlers
from service.grpc.servicer import InferenceServicer
from service.protocol.operations import Operations
from service.settings import Settings
from tests.support.daemon import MODEL
from tests.support.faulty_engine import CONTROL_ENV
from tests.support.served import Control, assert_served, write_model

METHOD = f"/{handlers.SERVICE.full_name}/ModelStreamInfer"


class Served:
    """The servicer on a real grpc.aio server on a free loopback port."""

    def __init__(self, plane: DataPlane, model: LoadedModel, target: str) -> None:
        self.plane, self.model, self.target = plane, model, target


@contextlib.asynccontextmanager
async def _serving(models: Path) -> AsyncIterator[Served]:
    metrics = Metrics()
    settings = Settings(model_repository=models, unix_socket=None)
    registry = ModelRegistry(settings, metrics)
    await registry.load_all()
    assert not registry.failures, registry.failures
    plane = DataPlane(registry)
    plane.ready = True
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handlers.add_to_server(InferenceServicer(Operations(
        plane, metrics, SharedMemoryRegions.from_settings(settings),
        Peers(UploadBudget.from_settings(settings)), settings,
        ModelControl(registry, settings))), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Served(plane, registry.get(MODEL), f"127.0.0.1:{port}")
    finally:
        await server.stop(0)
        await registry.close()


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Control:
    monkeypatch.setenv(CONTROL_ENV, str(tmp_path / "control.json"))
    return Control(tmp_path / "control.json")


def _request(request_id: str, images: np.ndarray, model: str = MODEL) -> bytes:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    request.raw_input_contents.append(np.ascontiguousarray(images, np.float32).tobytes())
    return request.SerializeToString()


def _stream(channel: grpc.aio.Channel):
    return channel.stream_stream(METHOD, response_deserializer=pb.ModelStreamInferResponse
                                 .FromString)


def test_many_requests_on_one_stream_batch_together_and_errors_fail_alone(
        tmp_path, control, holdout) -> None:
    models = write_model(tmp_path / "models", 16, "max_queue_delay_microseconds: 1000",
                         {"devices": "faulty:cpu1"})
    control.set(delay_s=0.02)  # the device is busy while the stream's requests arrive
    images = holdout[0][:300]
    messages, expected_errors = [], {}
    for i in range(len(images)):
        if i % 10 == 3:
            messages.append(b"\x0a\x05ab")  # does not parse: no id to carry
            expected_errors[""] = expected_errors.get("", 0) + 1
        elif i % 10 == 7:
            messages.append(_request(str(i), images[i:i + 1, 0]))  # no channel axis
            expected_errors[str(i)] = 1
        elif i % 10 == 9:
            messages.append(_request(str(i), images[i:i + 1], model="no_such_model"))
            expected_errors[str(i)] = 1
        else:
            messages.append(_request(str(i), images[i:i + 1]))

    async def main():
        async with _serving(models) as served:
            async with grpc.aio.insecure_channel(served.target) as channel:
                replies = [r async for r in _stream(channel)(iter(messages), timeout=60)]
            return replies, served.model.stats, served.plane.in_flight, \
                served.model.scheduler.queued()

    replies, stats, in_flight, queued = asyncio.run(main())
    assert len(replies) == len(messages)  # exactly one reply per message
    errors = [r for r in replies if r.error_message]
    answered = [r.infer_response for r in replies if not r.error_message]
    got_errors: dict[str, int] = {}
    for r in errors:
        got_errors[r.infer_response.id] = got_errors.get(r.infer_response.id, 0) + 1
    assert got_errors == expected_errors
    statuses = {r.error_message.split(":")[0] for r in errors}
    assert statuses == {"INVALID_ARGUMENT", "NOT_FOUND"}
    assert sorted(int(r.id) for r in answered) == [
        i for i in range(len(images)) if i % 10 not in (3, 7, 9)]
    for response in answered:
        i = int(response.id)
        logits = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(1, 10)
        assert_served(logits, response.parameters["device"].string_param, images[i:i + 1])
    assert stats.success.count == len(answered)
    # Queued as they arrived, not one after another: far fewer batches than requests.
    assert stats.execution_count < len(answered) / 2
    assert (in_flight, queued) == (0, 0)


def test_a_client_gone_mid_stream_leaves_nothing_queued(tmp_path, control, holdout) -> None:
    models = write_model(tmp_path / "models", 4, "max_queue_delay_microseconds: 1000",
                         {"devices": "faulty:cpu1"})
    control.set(delay_s=0.2)  # ten batches of four: two seconds of work
    sent = 40
    messages = [_request(str(i), holdout[0][i:i + 1]) for i in range(sent)]

    async def main():
        async with _serving(models) as served:
            async with grpc.aio.insecure_channel(served.target) as channel:
                call = _stream(channel)(iter(messages))
                first = await call.read()
                queued_before = served.model.scheduler.queued()
                call.cancel()
            plane, model = served.plane, served.model
            for _ in range(500):  # the server sees the cancellation shortly
                if plane.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            return first, queued_before, plane.in_flight, model.scheduler.queued(), model.stats

    first, queued_before, in_flight, queued, stats = asyncio.run(main())
    assert not first.error_message and first.infer_response.id in {str(i) for i in range(4)}
    assert queued_before > 0  # the client left with requests still waiting
    assert (in_flight, queued) == (0, 0)
    # Every request is accounted for, answered or withdrawn, and the withdrawn never ran.
    assert stats.success.count + stats.fail.count == sent
    assert stats.fail.count > 0
    assert stats.success.count < sent and stats.inference_count < sent
