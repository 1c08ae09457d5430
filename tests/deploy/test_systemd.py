"""The systemd unit: it verifies, its environment file sets real settings, and the daemon it
starts tells systemd READY=1 once it serves and STOPPING=1 when SIGTERM drains it."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from service import local_daemon
from service.local_daemon import free_port
from service.ops.systemd import notify
from tests.deploy import commands
from tests.support.daemon import MODELS, ROOT

UNIT = ROOT / "deploy" / "systemd" / "hetserve.service"
ENV_FILE = ROOT / "deploy" / "systemd" / "hetserve.env"


def test_the_units_header_and_the_docs_give_one_set_up_path() -> None:
    header = [line.removeprefix("#   ") for line in UNIT.read_text().splitlines()
              if line.startswith("#   ")]
    docs = (ROOT / "docs" / "deploy.md").read_text()
    block = docs.split("## Nodes outside Kubernetes: systemd", 1)[1].split("```sh\n", 1)[1]
    steps = block.split("```", 1)[0].splitlines()
    assert header == steps[:len(header)] and len(header) >= 5


def unit_value(key: str) -> str:
    (value,) = [line.split("=", 1)[1] for line in UNIT.read_text().splitlines()
                if line.startswith(key + "=")]
    return value


def test_the_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package has it)")
    # The same unit, starting this checkout's hetserve: verify checks that the command exists.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(
        shlex.split(unit_value("ExecStart"))[0], commands.hetserve_executable()))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    # Unknown keys and bad values are only warnings: any output is a failure.
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_unit_runs_hetserve_serve_with_the_environment_file() -> None:
    assert unit_value("Type") == "notify"
    assert unit_value("EnvironmentFile") == "/etc/hetserve/hetserve.env"
    env = commands.read_env_file(ENV_FILE) | dict(
        pair.split("=", 1) for pair in shlex.split(unit_value("Environment")))
    settings = commands.settings(shlex.split(unit_value("ExecStart")), env)
    assert env["XDG_CACHE_HOME"] == "/var/cache/" + unit_value("CacheDirectory")
    # The socket lives in the unit's RuntimeDirectory.
    assert settings.unix_socket == Path("/run") / unit_value("RuntimeDirectory") / "grpc.sock"
    assert settings.grpc_host == "127.0.0.1"
    # Stopping waits longer than the daemon's drain.
    assert int(unit_value("TimeoutStopSec").removesuffix("s")) > settings.shutdown_grace_s
    # The commented examples are real settings too.
    commands.check_environment(commands.read_env_file(ENV_FILE, commented=True))


def test_notify_is_a_no_op_without_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock")
    assert notify("READY=1") is False  # logged, never raised


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"hetserve-test-{free_port()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1", "STATUS=ok") is True
        assert listener.recv(4096) == b"READY=1\nSTATUS=ok"


def test_the_daemon_notifies_ready_once_serving_and_stopping_on_sigterm(tmp_path: Path) -> None:
    sock = tmp_path / "grpc.sock"
    environ = commands.read_env_file(ENV_FILE) | {
        "HETSERVE_MODEL_REPOSITORY": str(MODELS), "HETSERVE_UNIX_SOCKET": str(sock),
        "HETSERVE_SOCKET_GROUP": str(os.getgid()),  # the unit's hetserve group, here
        "HETSERVE_GRPC_PORT": str(free_port()), "HETSERVE_METRICS_HOST": "127.0.0.1",
        "HETSERVE_METRICS_PORT": "0"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(tmp_path / "notify.sock"))
        systemd.settimeout(120)
        environ["NOTIFY_SOCKET"] = str(tmp_path / "notify.sock")
        log = tmp_path / "daemon.log"
        daemon = commands.start(shlex.split(unit_value("ExecStart")), environ, log)
        try:
            ready = systemd.recv(4096).decode().split("\n")
            # READY=1 comes only once the daemon serves.
            assert ready[0] == "READY=1" and ready[1].startswith("STATUS=serving ")
            assert local_daemon.is_ready(f"unix:{sock}")
            assert os.stat(sock).st_mode & 0o777 == 0o660  # the group's members may connect
            daemon.send_signal(signal.SIGTERM)
            assert systemd.recv(4096) == b"STOPPING=1"
            assert daemon.wait(60) == 0
        finally:
            commands.stop(daemon)
    assert not sock.exists()
