"""Decoding too slow for the event loop (many typed values, a large JSON body) happens in the
decoding process (service/protocol/decoding.py): its answers are those of raw bytes, its errors come
back as statuses, each caller waits its own turn, and a binary request is answered while such a
decode is in progress."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from service.errors import InvalidInputError
from service.grpc import codec
from service.http.codec import INLINE_JSON_BYTES
from service.local_daemon import free_port
from service.protocol import inputs
from service.protocol.decoding import DecodePool
from service.protocol.types import Contents
from tests.support.daemon import MODEL, Daemon, example_repository, image_input

TYPED_IMAGES = 83  # 65,072 values: above what is converted on the event loop, under the cap


def _daemon(tmp: Path, workers: str) -> Daemon:
    """The example model on onnxruntime alone (the emulated FPGA takes seconds a batch), REST
    on."""
    d = Daemon(tmp, example_repository(tmp, "onnxruntime"), "--workers", workers,
               "--http-port", str(port := free_port()))
    d.http = f"127.0.0.1:{port}"
    return d


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def rest(request, tmp_path_factory) -> Iterator[Daemon]:
    d = _daemon(tmp_path_factory.mktemp("decoding"), request.param)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Iterator[Daemon]:
    """With --workers 1, whose one decoding process a test can find (with front-ends, which one
    a connection reaches is the kernel's choice)."""
    d = _daemon(tmp_path_factory.mktemp("decoding-one"), "1")
    yield d
    assert d.stop() == 0


def _typed(values: list, datatype: str, shape: tuple[int, ...]) -> inputs.Typed:
    contents = service_pb2.InferTensorContents()
    getattr(contents, {"INT8": "int_contents", "FP32": "fp32_contents"}[datatype]).extend(values)
    return inputs.Typed(Contents(len(values), contents.SerializeToString(), codec.typed_values),
                        datatype, shape, "input 'x'")


def test_the_decoding_process_converts_and_its_errors_come_back() -> None:
    async def run() -> tuple[np.ndarray, BaseException]:
        pool = DecodePool()
        try:
            array = await pool.run("a", inputs.typed, _typed([1.5, -2.0, 3.25, 0.0], "FP32",
                                                            (2, 2)))
            with pytest.raises(InvalidInputError) as caught:
                await pool.run("a", inputs.typed, _typed([1, 300], "INT8", (2,)))
            return array, caught.value
        finally:
            pool.close()

    array, error = asyncio.run(run())
    assert array.dtype == np.float32 and array.tolist() == [[1.5, -2.0], [3.25, 0.0]]
    assert str(error) == "input 'x': contents hold values outside the range of INT8"


def test_a_callers_decodes_wait_their_turn_behind_anothers_first() -> None:
    """Caller a asks for three decodes, then b for one: b's runs second, not fourth."""
    async def run() -> list[str]:
        pool, done = DecodePool(), []

        async def decode(caller: str, tag: str) -> None:
            await pool.run(caller, time.sleep, 0.2)
            done.append(tag)
        try:
            first = [asyncio.create_task(decode("a", f"a{i}")) for i in range(3)]
            await asyncio.sleep(0)  # a's three are asked for before b's
            await asyncio.gather(*first, decode("b", "b0"))
        finally:
            pool.close()
        return done

    assert asyncio.run(run()) == ["a0", "b0", "a1", "a2"]


def test_many_typed_values_are_answered_as_raw_bytes_are(rest, holdout) -> None:
    images = holdout[0][:TYPED_IMAGES].astype(np.float32)
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=images.shape
                       ).contents.fp32_contents.extend(images.ravel().tolist())
    assert len(request.inputs[0].contents.fp32_contents) > inputs.INLINE_TYPED_VALUES
    with grpcclient.InferenceServerClient(rest.socket_url) as client:
        stub = client._client_stub  # tritonclient sends only raw bytes: typed contents by hand
        typed = stub.ModelInfer(request, timeout=30)
        raw = client.infer(MODEL, image_input(images)).as_numpy("logits")
    logits = np.frombuffer(typed.raw_output_contents[0], np.float32).reshape(raw.shape)
    np.testing.assert_allclose(logits, raw, rtol=1e-5, atol=1e-5)
    assert list(logits.argmax(1)) == list(holdout[1][:TYPED_IMAGES])


def _json_infer(address: str, images: np.ndarray) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "image", "shape": list(images.shape),
                                   "datatype": "FP32", "data": images.ravel().tolist()}]})
    assert len(body) > INLINE_JSON_BYTES
    connection = http.client.HTTPConnection(address, timeout=60)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body.encode())
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


def _decoders(pid: int) -> list[int]:
    """The decoding processes among `pid`'s descendants."""
    found = []
    for child in map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split()):
        if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
            found.append(child)
        found += _decoders(child)
    return found


def test_a_binary_request_is_answered_while_a_json_body_is_decoded(one_process,
                                                                    holdout) -> None:
    """The decoding process is stopped (SIGSTOP) while it holds a JSON body: a binary request
    over the unix socket is answered meanwhile, and the JSON request once it resumes."""
    rest = one_process
    images = holdout[0][:8].astype(np.float32)
    status, _ = _json_infer(rest.http, images)  # starts the decoding process
    assert status == 200
    (decoder,) = _decoders(rest.process.pid)
    with concurrent.futures.ThreadPoolExecutor(1) as pool, \
            grpcclient.InferenceServerClient(rest.socket_url) as client:
        os.kill(decoder, signal.SIGSTOP)
        try:
            pending = pool.submit(_json_infer, rest.http, images)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                pending.result(timeout=0.5)  # it would be answered by now, were it not held
            assert not pending.done()
            logits = client.infer(MODEL, image_input(images[:1]), client_timeout=10
                                  ).as_numpy("logits")
            assert logits.argmax() == holdout[1][0]
            assert not pending.done()  # answered while the body was still being decoded
        finally:
            os.kill(decoder, signal.SIGCONT)
        status, document = pending.result(timeout=30)
    assert status == 200
    assert list(np.array(document["outputs"][0]["data"]).reshape(8, 10).argmax(1)) == \
        list(holdout[1][:8])


def test_a_decoding_process_that_ended_is_replaced(one_process, holdout) -> None:
    """Killed while idle: the next large body starts a new one and is answered."""
    images = holdout[0][:8].astype(np.float32)
    assert _json_infer(one_process.http, images)[0] == 200  # the process runs
    (decoder,) = _decoders(one_process.process.pid)
    os.kill(decoder, signal.SIGKILL)
    deadline = time.monotonic() + 30
    children = Path(f"/proc/{one_process.process.pid}/task/{one_process.process.pid}/children")
    while str(decoder) in children.read_text().split():  # until the daemon has reaped it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, document = _json_infer(one_process.http, images)
    assert status == 200, document
    assert list(np.array(document["outputs"][0]["data"]).reshape(8, 10).argmax(1)) == \
        list(holdout[1][:8])
    assert _decoders(one_process.process.pid) not in ([], [decoder])


def test_a_stream_answers_many_typed_values_and_what_follows(rest, holdout) -> None:
    images = holdout[0][:TYPED_IMAGES].astype(np.float32)
    typed = service_pb2.ModelInferRequest(model_name=MODEL, id="typed")
    typed.inputs.add(name="image", datatype="FP32", shape=images.shape
                     ).contents.fp32_contents.extend(images.ravel().tolist())
    raw = service_pb2.ModelInferRequest(model_name=MODEL, id="raw")
    raw.inputs.add(name="image", datatype="FP32", shape=[1, 1, 28, 28])
    raw.raw_input_contents.append(images[:1].tobytes())
    with grpcclient.InferenceServerClient(rest.socket_url) as client:
        replies = list(client._client_stub.ModelStreamInfer(iter([typed, raw]), timeout=60))
    assert not [r.error_message for r in replies if r.error_message]
    answers = {r.infer_response.id: np.frombuffer(r.infer_response.raw_output_contents[0],
                                                  np.float32) for r in replies}
    assert list(answers["typed"].reshape(-1, 10).argmax(1)) == list(holdout[1][:TYPED_IMAGES])
    assert answers["raw"].argmax() == holdout[1][0]
