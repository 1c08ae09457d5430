"""The access log (--access-log on) of a real daemon, with one process and with two front-ends:
one line per gRPC call (a stream's when it ends) and REST request, with transport, method or
endpoint, model, status, duration and caller, and never request data; off by default."""

from __future__ import annotations

import http.client
import os
import queue
import re
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from service.local_daemon import free_port
from tests.support.daemon import MODEL, MODELS, Daemon, image_input

LINE = re.compile(r"hetserve\.access: (grpc|rest) (\S+) model=(.+?) status=(\S+) "
                  r"duration_ms=(\d+\.\d+) caller='([^']*)'$")
SECRET = "request-id-not-for-logs"


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def logged(request, tmp_path_factory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("access")
    d = Daemon(tmp, MODELS, "--workers", request.param, "--access-log", "on",
               "--http-port", str(port := free_port()))
    d.http = f"127.0.0.1:{port}"
    yield d
    assert d.stop() == 0


def lines(daemon: Daemon) -> list[tuple[str, ...]]:
    assert daemon.process.log_path is not None
    text = daemon.process.log_path.read_text()
    assert SECRET not in text
    return [m.groups() for m in map(LINE.search, text.splitlines()) if m]


def test_every_grpc_call_and_rest_request_has_one_line(logged, holdout) -> None:
    before = len(lines(logged))
    images = holdout[0][:2]
    with grpcclient.InferenceServerClient(logged.url) as tcp, \
            grpcclient.InferenceServerClient(logged.socket_url) as unix:
        tcp.infer(MODEL, image_input(images), request_id=SECRET)
        unix.infer(MODEL, image_input(images))
        with pytest.raises(InferenceServerException):
            tcp.infer("x" * 5000, image_input(images))  # NOT_FOUND, the name cut short
        replies: queue.Queue = queue.Queue()
        tcp.start_stream(lambda result, error: replies.put(error))
        for _ in range(2):
            tcp.async_stream_infer(MODEL, image_input(images), request_id=SECRET)
        assert [replies.get(timeout=30), replies.get(timeout=30)] == [None, None]
        tcp.stop_stream()
    rest = httpclient.InferenceServerClient(logged.http)
    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images, np.float32))
    rest.infer(MODEL, [tensor], request_id=SECRET)
    connection = http.client.HTTPConnection(logged.http, timeout=30)
    connection.request("GET", "/v2/" + SECRET)
    assert connection.getresponse().status == 404
    connection.close()

    new = lines(logged)[before:]
    assert [(t, m, model, status) for t, m, model, status, *_ in new] == [
        ("grpc", "ModelInfer", f"'{MODEL}'", "OK"),
        ("grpc", "ModelInfer", f"'{MODEL}'", "OK"),
        ("grpc", "ModelInfer", new[2][2], "NOT_FOUND"),
        ("grpc", "ModelStreamInfer", "-", "OK"),
        ("rest", "infer", f"'{MODEL}'", "200"),
        ("rest", "none", "-", "404")]
    assert new[2][2] == repr("x" * 100) + "..."
    assert all(float(duration) > 0 for *_, duration, _ in new)
    uid = f"uid {os.getuid()}"
    # The unix socket's caller by its uid; over loopback TCP, the uid owning the client socket.
    assert [caller for *_, caller in new] == [uid] * 6


def test_the_access_log_is_off_by_default(daemon, client, holdout) -> None:
    client.infer(MODEL, image_input(holdout[0][:1]))
    assert daemon.process.log_path is not None
    assert "hetserve.access" not in daemon.process.log_path.read_text()
