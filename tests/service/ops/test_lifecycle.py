"""SIGTERM with requests in flight: health turns NOT_SERVING, new requests get UNAVAILABLE
(over REST: ready 400, inference 503), requests in flight finish, and the daemon exits 0."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.local_daemon import free_port
from tests.support.daemon import MODEL, image_input
from tests.support.metrics import scrape, total
from tests.support.waiting import until


def test_sigterm_drains_requests_in_flight(serve, holdout) -> None:
    daemon, control = serve(2, "max_queue_delay_microseconds: 1000", devices="faulty:cpu1")
    control.set(delay_s=0.3)  # 6 requests in flight: three batches, about 0.9 s

    def call(i: int):
        with grpcclient.InferenceServerClient(daemon.url) as c:
            return c.infer(MODEL, image_input(holdout[0][i:i + 1])).as_numpy("logits")

    with ThreadPoolExecutor(6) as pool, grpc.insecure_channel(daemon.url) as channel, \
            grpcclient.InferenceServerClient(daemon.url) as late:
        health = health_pb2_grpc.HealthStub(channel)
        in_flight = [pool.submit(call, i) for i in range(6)]
        # All six received (queued, running or answered) before the signal, however busy the
        # machine: a request that arrives after it is refused, as the test shows below.
        until(lambda: sum(total(scrape(daemon.metrics_url), name, model=MODEL) for name in (
            "hetserve_pending_requests", "hetserve_request_duration_seconds_count")) >= 6,
            what="six requests in flight")
        os.kill(daemon.process.pid, signal.SIGTERM)
        until(lambda: health.Check(health_pb2.HealthCheckRequest()).status ==
              health_pb2.HealthCheckResponse.NOT_SERVING, what="health NOT_SERVING")
        with pytest.raises(InferenceServerException) as refused:
            late.infer(MODEL, image_input(holdout[0][:1]))
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "draining" in refused.value.message()
        assert all(f.result(timeout=10).shape == (1, 10) for f in in_flight)
    # It ends by itself: a second SIGTERM (stop()) could find its handlers already gone.
    until(lambda: daemon.process.poll() is not None, timeout_s=30.0, what="the daemon to exit")
    assert daemon.process.poll() == 0


def test_rest_answers_ready_400_and_inference_503_while_draining(serve, holdout) -> None:
    port = free_port()
    daemon, control = serve(2, "max_queue_delay_microseconds: 1000", "--http-port", str(port),
                            devices="faulty:cpu1")
    control.set(delay_s=0.6)
    rest = f"http://127.0.0.1:{port}"
    body = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                   "data": holdout[0][:1].ravel().tolist()}]}).encode()

    def post() -> int:
        try:
            return urllib.request.urlopen(urllib.request.Request(
                f"{rest}/v2/models/{MODEL}/infer", body), timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code

    def ready() -> int:
        try:
            return urllib.request.urlopen(f"{rest}/v2/health/ready", timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code

    with ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(post) for _ in range(2)]
        time.sleep(0.3)
        os.kill(daemon.process.pid, signal.SIGTERM)
        time.sleep(0.1)
        assert (ready(), post()) == (400, 503)
        assert [f.result(timeout=10) for f in in_flight] == [200, 200]
    assert daemon.process.stop() == 0


def test_requests_still_running_when_the_grace_ends_are_cut_off(serve, holdout) -> None:
    daemon, control = serve(1, "max_queue_delay_microseconds: 0", "--shutdown-grace-s", "0.5",
                            devices="faulty:cpu1")
    control.set(delay_s=3.0)
    with ThreadPoolExecutor(1) as pool:
        def call():
            with grpcclient.InferenceServerClient(daemon.url) as c:
                return c.infer(MODEL, image_input(holdout[0][:1]))
        slow = pool.submit(call)
        time.sleep(0.5)
        start = time.monotonic()
        os.kill(daemon.process.pid, signal.SIGTERM)
        with pytest.raises(InferenceServerException) as cut:
            slow.result(timeout=10)
        assert time.monotonic() - start < 2.0  # the grace, not the 3 s batch
    assert cut.value.status() in ("StatusCode.CANCELLED", "StatusCode.UNAVAILABLE")
    assert daemon.process.stop() == 0
