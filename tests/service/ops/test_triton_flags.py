"""Triton's flag names and behaviours on a real daemon: strict readiness with a broken model beside
a good one, --exit-on-error, a REST-only daemon, JSON logs and unknown HETSERVE_* variables."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.local_daemon import DaemonProcess, free_port, serve_command
from tests.support.daemon import MODEL, MODELS, Daemon
from tests.support.waiting import until


def _with_broken_model(root: Path) -> Path:
    """The example model beside one whose config.pbtxt does not parse."""
    models = root / "models"
    shutil.copytree(MODELS / MODEL, models / MODEL)
    (models / "broken" / "1").mkdir(parents=True)
    shutil.copy(MODELS / MODEL / "1" / "model.onnx", models / "broken" / "1")
    (models / "broken" / "config.pbtxt").write_text("max_batch_size: oops\n")
    return models



def _rest_ready(port: int, path: str = "/v2/health/ready") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def _health(url: str) -> int:
    with grpc.insecure_channel(url) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5).status


def _model_ready(url: str) -> bool:
    try:
        with grpcclient.InferenceServerClient(url) as client:
            return client.is_model_ready(MODEL)
    except Exception:  # not listening yet
        return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_strict_readiness_waits_for_every_model_asked_for(tmp_path: Path, workers: str) -> None:
    http_port, port = free_port(), free_port()
    url = f"127.0.0.1:{port}"
    process = DaemonProcess(
        ["--model-repository", str(_with_broken_model(tmp_path)), "--grpc-port", str(port),
         "--http-port", str(http_port), "--socket", "", "--metrics-port", "0",
         "--strict-readiness", "--workers", workers], url, tmp_path / "daemon.log")
    try:
        until(lambda: process.poll() is not None or _model_ready(url), timeout_s=120.0)
        with grpcclient.InferenceServerClient(url) as client:
            assert client.is_server_live() and not client.is_server_ready()
        assert _rest_ready(http_port) == 400
        assert _health(url) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        assert process.stop() == 0


def test_strict_readiness_follows_a_model_repaired_while_serving(tmp_path: Path) -> None:
    port = free_port()
    url = f"127.0.0.1:{port}"
    models = _with_broken_model(tmp_path)
    process = DaemonProcess(
        ["--models", str(models), "--port", str(port), "--socket", "", "--metrics-port", "0",
         "--strict-readiness=true", "--model-control-mode", "poll",
         "--repository-poll-secs", "0.5"], url, tmp_path / "daemon.log")
    try:
        until(lambda: process.poll() is not None or _model_ready(url), timeout_s=120.0)
        assert _health(url) == health_pb2.HealthCheckResponse.NOT_SERVING
        shutil.copy(MODELS / MODEL / "labels.txt", models / "broken")
        (models / "broken" / "config.pbtxt").write_text(
            (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, "broken"))
        until(lambda: _health(url) == health_pb2.HealthCheckResponse.SERVING, timeout_s=120.0)
        with grpcclient.InferenceServerClient(url) as client:
            assert client.is_server_ready() and client.is_model_ready("broken")
    finally:
        assert process.stop() == 0


def test_without_strict_readiness_the_good_model_makes_it_ready(tmp_path: Path) -> None:
    http_port = free_port()
    daemon = Daemon(tmp_path, _with_broken_model(tmp_path), "--strict-readiness=false",
                    "--http-port", str(http_port))
    try:
        assert _rest_ready(http_port) == 200
        assert _health(daemon.url) == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert daemon.stop() == 0


def test_exit_on_error_names_the_model_and_why(tmp_path: Path) -> None:
    done = subprocess.run(serve_command(
        "--models", str(_with_broken_model(tmp_path)), "--port", str(free_port()), "--socket", "",
        "--metrics-port", "0", "--exit-on-error=true"), capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "--exit-on-error" in line]
    assert len(lines) == 1 and "'broken'" in lines[0] and "max_batch_size" in lines[0]
    assert MODEL not in lines[0]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_rest_only_daemon_serves(tmp_path: Path, workers: str) -> None:
    http_port = free_port()
    process = DaemonProcess(["--models", str(MODELS), "--port", "0", "--socket", "",
                             "--metrics-port", "0", "--http-port", str(http_port),
                             "--workers", workers], "", tmp_path / "daemon.log")

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "daemon.log").read_text()
        try:
            return _rest_ready(http_port) == 200
        except OSError:  # not listening yet
            return False
    try:
        until(ready, timeout_s=120.0)
        assert _rest_ready(http_port, f"/v2/models/{MODEL}/ready") == 200
    finally:
        assert process.stop() == 0


def test_json_logs_and_a_warning_for_an_unknown_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSERVE_PROT", "8001")
    monkeypatch.setenv("HETSERVE_TEST_ANYTHING", "1")  # the tests' own: no warning
    daemon = Daemon(tmp_path, MODELS, "--log-format", "json", "--log-verbose", "1")
    assert daemon.stop() == 0
    records = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    unknown = [r for r in records if "not a hetserve setting" in r["message"]]
    assert [(r["level"], r["message"]) for r in unknown] == [(
        "WARNING", "environment variable HETSERVE_PROT is not a hetserve setting; ignored "
                   "(did you mean HETSERVE_PORT?)")]
    assert any(r["level"] == "DEBUG" for r in records)  # --log-verbose 1
