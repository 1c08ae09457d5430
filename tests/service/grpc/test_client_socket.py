"""A client's check of its daemon's unix socket: the folder by the daemon's own rule, then the
listener's uid (SO_PEERCRED), for the client's own user or HETSERVE_DAEMON_USER."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.client_socket import (
    DAEMON_USER_ENV,
    UntrustedDaemonError,
    check,
    expected_uid,
    listener_uid,
)

NOBODY = 65534


@pytest.fixture(autouse=True)
def own_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DAEMON_USER_ENV, raising=False)


def _listen(path: Path) -> Iterator[socket.socket]:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    try:
        yield listener
    finally:
        listener.close()


def test_the_listener_s_uid_comes_from_the_kernel_and_nothing_listening_is_none(
        tmp_path: Path) -> None:
    path = tmp_path / "grpc.sock"
    assert listener_uid(path) is None
    for _ in _listen(path):
        assert listener_uid(path) == os.geteuid()
        check(f"unix:{path}")  # the client's own daemon passes
    check("127.0.0.1:1")  # TCP tells nothing of its listener: nothing to check


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_a_socket_folder_others_may_write_in_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UntrustedDaemonError, match="group or others may write there") as refused:
        check(f"unix:{folder / 'grpc.sock'}")
    assert str(folder) in str(refused.value)


def test_a_socket_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "real")
    with pytest.raises(UntrustedDaemonError, match="symbolic link") as refused:
        check(f"unix:{tmp_path / 'run' / 'grpc.sock'}")
    assert str(tmp_path / "run") in str(refused.value)


def test_the_daemon_user_setting_names_whom_to_trust(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DAEMON_USER_ENV, "nobody")
    assert expected_uid() == NOBODY
    monkeypatch.setenv(DAEMON_USER_ENV, "no-such-user-here")
    with pytest.raises(UntrustedDaemonError, match="no such user"):
        expected_uid()


def test_a_listener_of_another_user_in_the_expected_folder_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a folder to a second local user (nobody)")
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, -1)  # nobody's daemon folder, where root listens
    path = folder / "grpc.sock"
    for _ in _listen(path):
        with pytest.raises(UntrustedDaemonError, match="belongs to uid 65534"):
            check(f"unix:{path}")  # root's client expects root's own folder
        monkeypatch.setenv(DAEMON_USER_ENV, "nobody")
        with pytest.raises(UntrustedDaemonError, match=r"runs as root \(uid 0\), not as "
                                                       r"nobody \(uid 65534\)") as refused:
            check(f"unix:{path}")
        assert str(path) in str(refused.value)
