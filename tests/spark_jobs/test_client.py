"""The executor-side client against real daemons: RESOURCE_EXHAUSTED waits for room in the queue,
UNAVAILABLE retries are bounded and consult the node's daemon, priorities follow the model,
tensors go through shared memory where the daemon can read it and in the messages otherwise;
and, against a fake server, a reply that does not match the model's config fails the call."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service import contract
from spark_jobs import client, staging
from spark_jobs.client import (
    DaemonUnavailableError,
    ReplyMismatchError,
    RetryPolicy,
    infer,
)
from spark_jobs.interface import ModelInterface
from tests.support.daemon import MODEL, MODELS, Daemon


def test_a_full_queue_holds_requests_back_until_every_sample_is_answered(holdout, tmp_path,
                                                                          caplog):
    busy = Daemon(tmp_path, MODELS, "--max-queue-size", "128")
    try:
        model = ModelInterface.fetch(busy.url, "mnist_cnn")
        images = np.tile(holdout[0], (2, 1, 1, 1))
        with caplog.at_level(logging.WARNING, "spark_jobs.client"):
            # 8 requests of 128 in flight against room for one: most are refused, many times
            result = infer(busy.socket_url, model, images, 128, 8)
        refusals = [r for r in caplog.records if "RESOURCE_EXHAUSTED" in r.getMessage()]
        assert len(refusals) == 1 and "--max-queue-size" in refusals[0].getMessage()
        assert result.logits.shape == (2000, 10) and result.model_version == "1"
        assert (result.logits.argmax(1) == np.tile(holdout[1], 2)).mean() >= 0.95
    finally:
        assert busy.stop() == 0


def _queue_full() -> InferenceServerException:
    return InferenceServerException("queue full", status="StatusCode.RESOURCE_EXHAUSTED")


def test_a_refused_request_is_sent_again_when_another_request_is_answered():
    sent = []

    def send() -> str:
        sent.append(True)
        if len(sent) == 1:
            raise _queue_full()
        return "answer"

    patient = RetryPolicy(busy_first_delay_s=600, busy_max_delay_s=600)
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(
        client._queued(send, "unix:/test", patient)), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30  # not the 300-600 s of its delay
    while waiting.is_alive() and time.monotonic() < deadline:
        client._queued(lambda: "another request's answer", "unix:/test", patient)
        waiting.join(timeout=0.05)
    assert answers == ["answer"] and len(sent) == 2


def test_refusals_past_the_request_timeout_fail_the_request():
    def send() -> str:
        raise _queue_full()

    with pytest.raises(InferenceServerException) as refused:
        client._queued(send, "unix:/test", RetryPolicy(
            request_timeout_s=0.2, busy_first_delay_s=0.01, busy_max_delay_s=0.05))
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_unavailable_retries_are_bounded_and_ask_for_the_nodes_daemon(daemon, tmp_path):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    asked = []

    def recover() -> str:
        asked.append(True)
        return f"unix:{tmp_path / 'still-nobody.sock'}"

    with pytest.raises(InferenceServerException) as failed:
        infer(f"unix:{tmp_path / 'nobody.sock'}", model, np.zeros((4, 1, 28, 28), np.float32),
              128, 1, retry=RetryPolicy(attempts=3, first_delay_s=0.01), recover=recover)
    assert failed.value.status() == "StatusCode.UNAVAILABLE" and len(asked) == 2


@pytest.fixture
def staged_regions(monkeypatch) -> list[str | None]:
    """The region each infer call staged its samples in (None: they went in the messages),
    checked to be registered with the daemon while the call's requests run."""
    regions: list[str | None] = []
    real = staging.staged

    @contextlib.contextmanager
    def watched(connection, address, samples, timeout_s):
        with real(connection, address, samples, timeout_s) as region:
            regions.append(region)
            if region is not None:
                client, _ = connection
                assert region in client.get_system_shared_memory_status().regions
            yield region
    monkeypatch.setattr(staging, "staged", watched)
    return regions


def test_tensors_travel_through_shared_memory_to_a_daemon_on_this_node(daemon, holdout,
                                                                        monkeypatch,
                                                                        staged_regions):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    images = holdout[0][:300]
    registered = staged_regions
    via_memory = infer(daemon.socket_url, model, images, 128, 2)
    assert registered[0] is not None
    with grpcclient.InferenceServerClient(daemon.socket_url) as check:
        assert not check.get_system_shared_memory_status().regions  # unregistered after
    # The same through the messages, where the daemon cannot open the region.
    monkeypatch.setattr(grpcclient.InferenceServerClient, "register_system_shared_memory",
                        _refuse_registration)
    via_messages = infer(daemon.socket_url, model, images, 128, 2)
    assert registered[1] is None
    # Equal up to the engines' tolerance: each batch goes to whichever listed device is free.
    np.testing.assert_allclose(via_memory.logits, via_messages.logits, rtol=1e-4, atol=1e-4)
    assert (via_memory.logits.argmax(1) == holdout[1][:300]).mean() >= 0.95


def test_a_workers_regions_are_reused_and_registered_only_during_a_call(daemon, holdout,
                                                                          monkeypatch,
                                                                          staged_regions):
    """Kept regions keep their pages mapped from call to call (no page faults on each copy);
    the daemon knows a region only while its call runs, a smaller one is replaced."""
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")
    monkeypatch.setattr(staging, "regions", staging.Regions(kept=1))
    names = staged_regions
    images, labels = holdout[0][:300], holdout[1][:300]
    first = infer(daemon.socket_url, model, images, 128, 2)
    again = infer(daemon.socket_url, model, images[:200], 128, 2)  # fits the kept region
    larger = infer(daemon.socket_url, model, np.concatenate([images, images]), 128, 2)
    assert names[0] is not None and names[1] == names[0] and names[2] != names[0]
    with grpcclient.InferenceServerClient(daemon.socket_url) as check:
        assert not check.get_system_shared_memory_status().regions
    assert not Path("/dev/shm", names[0]).exists()  # replaced: unlinked
    assert Path("/dev/shm", names[2]).exists()  # kept for the next call
    # Other request splits (other padding): the same logits up to rounding.
    np.testing.assert_allclose(again.logits, first.logits[:200], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(larger.logits, np.concatenate([first.logits] * 2), rtol=1e-4,
                               atol=1e-4)
    assert (first.logits.argmax(1) == labels).mean() >= 0.95
    staging.regions.close()
    assert not Path("/dev/shm", names[2]).exists()


def test_regions_a_stopped_worker_left_are_unlinked_by_the_next_one(tmp_path):
    """Spark stops Python workers by SIGHUP to their process group, which takes
    multiprocessing's resource tracker with them: the kept regions stay in /dev/shm until
    another worker of this user creates one."""
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom spark_jobs.staging import regions\n"
         "memory = regions.take(4096)\nregions.give_back(memory)\nprint(memory.name, flush=True)"
         "\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    name = worker.stdout.readline().strip()
    assert name.startswith(f"{staging.PREFIX}{worker.pid}-")
    os.killpg(worker.pid, signal.SIGHUP)
    worker.wait()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    orphan = Path("/dev/shm", f"{staging.PREFIX}{ended}-test")
    live = Path("/dev/shm", f"{staging.PREFIX}{os.getpid()}-test")
    orphan.write_bytes(b"x")
    live.write_bytes(b"x")
    try:
        staging.unlink_orphans()
        assert not Path("/dev/shm", name).exists() and not orphan.exists() and live.exists()
    finally:
        for path in (orphan, live):
            path.unlink(missing_ok=True)


def _refuse_registration(self, name, key, byte_size, *args, **kwargs):
    raise InferenceServerException("cannot open shared memory",
                                   status="StatusCode.INVALID_ARGUMENT")


def test_a_daemon_that_cannot_be_found_again_fails_the_call_naming_both_reasons(daemon,
                                                                              tmp_path):
    model = ModelInterface.fetch(daemon.url, "mnist_cnn")

    def recover() -> str:
        raise RuntimeError("the hetserve daemon did not become ready")

    with pytest.raises(DaemonUnavailableError, match=r"the daemon at unix:.*nobody.sock "
                       r"answered StatusCode.UNAVAILABLE \(.*\), and asking this node for its "
                       r"daemon failed: the hetserve daemon did not become ready"):
        infer(f"unix:{tmp_path / 'nobody.sock'}", model, np.zeros((4, 1, 28, 28), np.float32),
              None, 1, retry=RetryPolicy(attempts=5, first_delay_s=0.01), recover=recover)


Reply = Callable[[service_pb2.ModelInferRequest], service_pb2.ModelInferResponse]


class _Server(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's protocol with the example model's config, answering inference with `reply`;
    no shared memory extension (UNIMPLEMENTED), so tensors travel in the messages."""

    def __init__(self) -> None:
        self.config = text_format.Parse((MODELS / MODEL / "config.pbtxt").read_text(),
                                        model_config_pb2.ModelConfig())
        self.reply: Reply = _answer()
        self.stalled: set[str] = set()  # methods that answer only once `released` is set
        self.released = threading.Event()

    def _stall(self, method: str) -> None:
        if method in self.stalled:
            self.released.wait()

    def ModelConfig(self, request, context):
        return service_pb2.ModelConfigResponse(config=self.config)

    def ModelInfer(self, request, context):
        self._stall("ModelInfer")
        return self.reply(request)

    def SystemSharedMemoryRegister(self, request, context):
        self._stall("SystemSharedMemoryRegister")
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no shared memory here")


def _answer(name: str = "logits", datatype: str = "FP32", missing_rows: int = 0,
            dims: tuple[int, ...] = (10,)) -> Reply:
    """Replies with zeros: one row per sample sent, less `missing_rows`, of `dims`."""
    def reply(request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
        values = np.zeros((request.inputs[0].shape[0] - missing_rows, *dims),
                          contract.numpy_dtype(datatype))
        response = service_pb2.ModelInferResponse(model_name=request.model_name,
                                                  model_version="1")
        response.outputs.add(name=name, datatype=datatype, shape=values.shape)
        response.raw_output_contents.append(values.tobytes())
        return response
    return reply


@pytest.fixture
def fake_server() -> Iterator[tuple[str, _Server]]:
    servicer = _Server()
    server = grpc.server(ThreadPoolExecutor(4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        servicer.released.set()
        server.stop(None)


def test_a_reply_matching_the_config_and_the_request_is_used(fake_server):
    url, server = fake_server
    model = ModelInterface.fetch(url, MODEL)
    assert (model.output_name, model.output_datatype, model.output_dims) == ("logits", "FP32",
                                                                            (10,))
    result = infer(url, model, np.zeros((5, 1, 28, 28), np.float32), 4, 2)
    assert result.logits.shape == (5, 10) and result.logits.dtype == np.float32
    server.config.output[0].dims[:] = [-1]  # any size
    server.reply = _answer(dims=(7,))
    assert infer(url, ModelInterface.fetch(url, MODEL), np.zeros((5, 1, 28, 28), np.float32),
                 4, 2).logits.shape == (5, 7)


@pytest.mark.parametrize("reply, arrived", [
    (_answer(missing_rows=1), "'logits FP32 [3, 10]'; expected logits FP32 [4, 10]"),
    (_answer(datatype="FP64"), "'logits FP64 [4, 10]'; expected logits FP32 [4, 10]"),
    (_answer(name="scores"), "'scores FP32 [4, 10]'; expected logits FP32 [4, 10]"),
    (_answer(dims=(11,)), "'logits FP32 [4, 11]'; expected logits FP32 [4, 10]"),
    (_answer(dims=(10, 1)), "'logits FP32 [4, 10, 1]'; expected logits FP32 [4, 10]"),
    (lambda request: service_pb2.ModelInferResponse(model_name=MODEL), "''; expected logits"),
])
def test_a_reply_that_does_not_match_the_config_or_the_request_fails_the_call(
        fake_server, reply, arrived):
    url, server = fake_server
    model = ModelInterface.fetch(url, MODEL)
    server.reply = reply
    with pytest.raises(ReplyMismatchError, match=r"model 'mnist_cnn': the reply to 4 samples "
                                                 "holds " + re.escape(arrived)):
        infer(url, model, np.zeros((8, 1, 28, 28), np.float32), 4, 1)


def test_a_daemon_that_stops_answering_holds_a_call_no_longer_than_the_request_timeout(
        fake_server):
    """A task must never hang on a daemon that accepts calls and answers none: the shared
    memory registration gives up (the tensors then travel in the messages), and so does a
    request, after RetryPolicy.request_timeout_s."""
    url, server = fake_server
    model = ModelInterface.fetch(url, MODEL)
    samples = np.zeros((4, 1, 28, 28), np.float32)
    quick = RetryPolicy(request_timeout_s=0.5)
    server.stalled = {"SystemSharedMemoryRegister"}
    assert infer(url, model, samples, 4, 1, retry=quick).logits.shape == (4, 10)
    server.stalled = {"SystemSharedMemoryRegister", "ModelInfer"}
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        infer(url, model, samples, 4, 1, retry=quick)
