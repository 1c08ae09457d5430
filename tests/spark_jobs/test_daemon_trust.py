"""An executor uses only its own daemon: a socket folder that another local user made first, with a
fake daemon in it, is refused before a byte is sent, and links planted in a socket folder never
make the job write through them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelerators.safe_files import UnsafeFolderError
from service.client_socket import UntrustedDaemonError
from service.contract import default_socket
from service.ops.cli import main
from spark_jobs.daemon import NodeDaemon, resolve_address
from spark_jobs.interface import ModelInterface
from tests.support.daemon import MODEL, MODELS

# Another user's fake daemon: it makes the folder, listens, plants links to the victim's files
# and prints how many bytes each connection sent it.
FAKE_DAEMON = """
import os, socket, sys
folder, log_target, starter_target = sys.argv[1:]
os.mkdir(folder, 0o755)
listener = socket.socket(socket.AF_UNIX)
listener.bind(folder + "/grpc.sock")
os.chmod(folder + "/grpc.sock", 0o777)
listener.listen()
os.symlink(log_target, folder + "/daemon.log")
os.symlink(starter_target, folder + "/daemon.starter")
print("ready", flush=True)
while True:
    connection, _ = listener.accept()
    connection.settimeout(1)
    try:
        print("received", len(connection.recv(65536)), flush=True)
    except OSError:
        print("received", 0, flush=True)
    connection.close()
"""


@pytest.fixture
def shared_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every local user may create entries in, as /tmp: the executor's default socket
    folder goes there."""
    folder = Path(tempfile.mkdtemp(prefix="hetserve-shared-"))
    folder.chmod(0o1777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("HETSERVE_DAEMON", raising=False)
    monkeypatch.delenv("HETSERVE_UNIX_SOCKET", raising=False)
    monkeypatch.delenv("HETSERVE_DAEMON_USER", raising=False)
    yield folder
    shutil.rmtree(folder)


def _fake_daemon_as_nobody(folder: Path, log_target: Path, starter_target: Path
                           ) -> subprocess.Popen:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a second local user (nobody) with setpriv")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")
    fake = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             sys.executable, "-c", FAKE_DAEMON, str(folder), str(log_target),
                             str(starter_target)], cwd="/", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if fake.stdout.readline().strip() != "ready":
        fake.kill()
        pytest.skip(f"nobody cannot run the fake daemon: {fake.communicate()[1][-300:]}")
    return fake


def test_a_fake_daemon_in_a_folder_another_user_made_first_gets_nothing(
        shared_runtime_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    victim_log, never_made = tmp_path / "root-only.log", tmp_path / "made-through-a-link"
    victim_log.write_text("root's own\n")
    folder = default_socket().parent
    fake = _fake_daemon_as_nobody(folder, victim_log, never_made)
    try:
        job = NodeDaemon(None, str(MODELS), "app-attacked")  # one that may start a daemon
        for attempt in (job.ensure, lambda: ModelInterface.fetch(resolve_address(), MODEL)):
            with pytest.raises(UntrustedDaemonError, match="belongs to uid 65534") as refused:
                attempt()
            assert str(folder) in str(refused.value)
            assert "HETSERVE_DAEMON_USER" in str(refused.value)  # and the fix
        assert main(["health"]) == 1
        assert str(folder) in capsys.readouterr().err
    finally:
        fake.terminate()
        out, _ = fake.communicate(timeout=10)
    assert "received" not in out  # not even a connection, let alone a byte
    assert victim_log.read_text() == "root's own\n"
    assert not never_made.exists()


def test_links_in_the_job_s_own_socket_folder_are_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.log"
    victim.write_text("untouched\n")
    (folder / "daemon.log").symlink_to(victim)
    job = NodeDaemon(f"unix:{folder / 'grpc.sock'}", str(MODELS), "app-links")
    with pytest.raises(UnsafeFolderError, match="daemon.log is a symbolic link"):
        job.ensure(timeout_s=10)
    assert victim.read_text() == "untouched\n"
    assert not (folder / "grpc.sock").exists()  # nothing was started
