"""Start-up and shutdown of the daemon process, and a bad model beside a good one."""

from __future__ import annotations

import shutil
import subprocess
import sys

import tritonclient.grpc as grpcclient

from service.local_daemon import free_port
from tests.support.daemon import MODEL, MODELS, Daemon


def test_a_taken_port_is_a_clear_start_up_error(daemon, tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS),
         "--port", str(daemon.port), "--socket", "", "--metrics-port", str(free_port())],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{daemon.port}" in result.stderr


def test_a_live_socket_is_never_taken_over(daemon) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port", "0",
         "--socket", str(daemon.socket), "--metrics-port", "0"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "another daemon is serving there" in result.stderr


def test_a_start_up_that_fails_after_binding_leaves_no_socket(daemon, tmp_path) -> None:
    socket = tmp_path / "grpc.sock"
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port", "0",
         "--socket", str(socket), "--metrics-port", str(daemon.metrics_port)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{daemon.metrics_port}" in result.stderr
    assert not socket.exists()


def test_a_broken_model_does_not_take_the_others_down(tmp_path) -> None:
    models = tmp_path / "models"
    shutil.copytree(MODELS / MODEL, models / MODEL)
    (models / "broken" / "1").mkdir(parents=True)
    (models / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    shutil.copy(MODELS / MODEL / "labels.txt", models / "broken")
    (models / "broken" / "config.pbtxt").write_text(
        (MODELS / MODEL / "config.pbtxt").read_text().replace(MODEL, "broken"))
    d = Daemon(tmp_path, models)
    try:
        with grpcclient.InferenceServerClient(d.url) as client:
            assert client.is_model_ready(MODEL) and not client.is_model_ready("broken")
            states = {m.name: (m.state, m.reason) for m in
                      client.get_model_repository_index().models}
            assert states[MODEL][0] == "READY"
            assert states["broken"][0] == "UNAVAILABLE" and "model.onnx" in states["broken"][1]
    finally:
        assert d.stop() == 0


def test_version_and_a_wrong_flag_value_are_one_line_each() -> None:
    version = subprocess.run([sys.executable, "-m", "service", "--version"],
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("hetserve ")
    assert "devices found: " in version.stdout and "onnxruntime:cpu0" in version.stdout
    wrong = subprocess.run([sys.executable, "-m", "service", "serve", "--log-level", "debugg"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip() == (
        "hetserve serve: --log-level (HETSERVE_LOG_LEVEL): 'debugg' is not one of "
        "['DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL']")


def test_the_log_opens_without_build_notes_and_ends_with_a_stopped_line(tmp_path) -> None:
    served = Daemon(tmp_path, MODELS)
    assert served.stop() == 0
    log = (tmp_path / "daemon.log").read_text()
    assert "CompilerWarning" not in log
    assert log.rstrip().splitlines()[-1].endswith(
        "stopped: the listeners closed, the devices released")
