"""Exposure needs TLS and a token: loopback by default, a refused start-up when exposed without
them, and over TLS every call but health checks needs the bearer token (the unix socket none)."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.edge.credentials import ExposureError
from service.grpc.auth import check_exposure
from service.local_daemon import DaemonProcess, free_port
from tests.support.daemon import MODEL, MODELS, ROOT, image_input, self_signed

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    self_signed(tmp / "cert.pem", tmp / "key.pem")
    (tmp / "token").write_text(TOKEN + "\n")
    port, sock = free_port(), tmp / "grpc.sock"
    daemon = DaemonProcess(
        ["--models", str(MODELS), "--port", str(port), "--socket", str(sock),
         "--metrics-port", "0", "--tls-cert", str(tmp / "cert.pem"), "--tls-key",
         str(tmp / "key.pem"), "--token-file", str(tmp / "token")],
        f"unix:{sock}", tmp / "daemon.log")
    daemon.wait_ready()
    yield f"127.0.0.1:{port}", tmp / "cert.pem", f"unix:{sock}"
    assert daemon.stop() == 0


def _live(url: str, **kwargs) -> bool:
    headers = kwargs.pop("headers", None)
    with grpcclient.InferenceServerClient(url, **kwargs) as client:
        return client.is_server_live(headers=headers, client_timeout=10)


def test_tcp_over_tls_needs_the_bearer_token(tls_daemon) -> None:
    url, cert, _ = tls_daemon
    tls = dict(ssl=True, root_certificates=str(cert))
    assert _live(url, headers={"authorization": f"Bearer {TOKEN}"}, **tls)
    for headers in (None, {"authorization": "Bearer wrong"}):
        with pytest.raises(InferenceServerException, match="'authorization'") as refused:
            _live(url, headers=headers, **tls)
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException):  # plaintext is not spoken on the TLS port
        _live(url)


def test_health_checks_and_the_unix_socket_need_no_token(tls_daemon) -> None:
    url, cert, socket_url = tls_daemon
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    with grpc.secure_channel(url, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert _live(socket_url)


def test_exposing_tcp_without_tls_and_a_token_is_refused_at_start_up(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--host", "0.0.0.0",
         "--port", str(free_port()), "--socket", str(tmp_path / "s.sock"), "--metrics-port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "host '0.0.0.0' exposes gRPC beyond this node: give --tls-cert and --tls-key and " \
           "--token-file" in run.stderr
    check_exposure("0.0.0.0", tls=True, token=True)  # both given: allowed
    for host in ("127.0.0.1", "localhost", "::1"):
        check_exposure(host, tls=False, token=False)
    with pytest.raises(ExposureError, match="--token-file"):
        check_exposure("10.0.0.5", tls=True, token=False)


def test_streams_over_tls_need_the_token_too(tls_daemon, holdout) -> None:
    url, cert, _ = tls_daemon
    for headers, expected in (({"authorization": f"Bearer {TOKEN}"}, "OK"),
                              (None, "UNAUTHENTICATED")):
        replies: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(url, ssl=True,
                                              root_certificates=str(cert)) as client:
            client.start_stream(lambda result, error: replies.put((result, error)),
                                headers=headers)
            # A refused stream may end before the request goes out: the callback has the error.
            with contextlib.suppress(InferenceServerException):
                client.async_stream_infer(MODEL, image_input(holdout[0][:1]), request_id="1")
            result, error = replies.get(timeout=30)
            client.stop_stream()
        status = "OK" if error is None else error.status().removeprefix("StatusCode.")
        assert status == expected
        if error is None:
            assert result.as_numpy("logits").argmax() == holdout[1][0]
