"""Credentials rotate under a running daemon: a new token file or key pair is in force for the
next call or connection, without a restart, and a broken rotation keeps the old ones."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service.local_daemon import DaemonProcess, free_port
from tests.support.daemon import MODELS, ROOT, self_signed


def make_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    self_signed(cert, key, name)
    return cert, key


def replace(path: Path, content: bytes) -> None:
    """Writes `content` as `path` in one step, as an operator's rotation would."""
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(content)
    os.replace(staged, path)


@dataclass
class Exposed:
    url: str
    folder: Path
    token: Path  # a symbolic link, like a mounted Kubernetes secret
    cert: Path
    key: Path
    pairs: dict[str, tuple[Path, Path]]

    def live(self, token: str | None, trust: str) -> bool:
        headers = {"authorization": f"Bearer {token}"} if token else None
        # A new client is a new connection: the TLS handshake sees the current certificate.
        with grpcclient.InferenceServerClient(self.url, ssl=True, root_certificates=str(
                self.pairs[trust][0])) as client:
            return client.is_server_live(headers=headers, client_timeout=10)

    def refused(self, token: str | None, trust: str) -> str:
        with pytest.raises(InferenceServerException) as refused:
            self.live(token, trust)
        return refused.value.status()

    def use_pair(self, name: str) -> None:
        cert, key = self.pairs[name]
        replace(self.key, key.read_bytes())
        replace(self.cert, cert.read_bytes())

    def use_token(self, token: str) -> None:
        """Swaps the link to a new file, as the kubelet updates a secret volume."""
        target = self.folder / f"token-{token}"
        target.write_text(token + "\n")
        link = self.folder / "token.link"
        link.symlink_to(target)
        os.replace(link, self.token)


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exposed]:
    tmp = tmp_path_factory.mktemp("rotation")
    pairs = {name: make_pair(tmp, name) for name in ("first", "second")}
    e = Exposed(f"127.0.0.1:{free_port()}", tmp, tmp / "token", tmp / "tls.crt", tmp / "tls.key",
                pairs)
    e.use_pair("first")
    e.use_token("alpha")
    sock = tmp / "grpc.sock"
    daemon = DaemonProcess(
        ["--models", str(MODELS), "--port", e.url.rpartition(":")[2], "--socket", str(sock),
         "--metrics-port", "0", "--tls-cert", str(e.cert), "--tls-key", str(e.key),
         "--token-file", str(e.token)], f"unix:{sock}", tmp / "daemon.log")
    daemon.wait_ready()
    yield e
    assert daemon.stop() == 0


def test_a_swapped_token_file_is_in_force_for_the_next_call(exposed: Exposed) -> None:
    exposed.use_pair("first")
    exposed.use_token("alpha")
    assert exposed.live("alpha", trust="first")
    exposed.use_token("beta")
    assert exposed.live("beta", trust="first")
    assert exposed.refused("alpha", trust="first") == "StatusCode.UNAUTHENTICATED"
    exposed.use_token("alpha")  # and back
    assert exposed.live("alpha", trust="first")
    assert exposed.refused("beta", trust="first") == "StatusCode.UNAUTHENTICATED"


def test_an_empty_token_file_keeps_the_token_in_force(exposed: Exposed) -> None:
    exposed.use_pair("first")
    exposed.use_token("gamma")
    assert exposed.live("gamma", trust="first")
    replace(exposed.token, b"\n")
    assert exposed.live("gamma", trust="first")
    assert exposed.refused(None, trust="first") == "StatusCode.UNAUTHENTICATED"


def test_a_swapped_certificate_serves_new_connections(exposed: Exposed) -> None:
    exposed.use_token("alpha")
    exposed.use_pair("first")
    assert exposed.live("alpha", trust="first")
    with grpcclient.InferenceServerClient(exposed.url, ssl=True, root_certificates=str(
            exposed.pairs["first"][0])) as kept:
        assert kept.is_server_live(headers={"authorization": "Bearer alpha"})
        exposed.use_pair("second")
        assert exposed.live("alpha", trust="second")
        exposed.refused("alpha", trust="first")  # the handshake fails: an untrusted certificate
        # A connection made before the rotation keeps working.
        assert kept.is_server_live(headers={"authorization": "Bearer alpha"})


def test_a_key_that_does_not_match_its_certificate_keeps_the_pair_in_force(
        exposed: Exposed) -> None:
    exposed.use_token("alpha")
    exposed.use_pair("first")
    assert exposed.live("alpha", trust="first")
    replace(exposed.key, exposed.pairs["second"][1].read_bytes())  # half a rotation
    assert exposed.live("alpha", trust="first")
    replace(exposed.cert, exposed.pairs["second"][0].read_bytes())  # and the other half
    assert exposed.live("alpha", trust="second")


def test_a_key_that_does_not_match_its_certificate_is_a_start_up_error(tmp_path: Path) -> None:
    cert, _ = make_pair(tmp_path, "one")
    _, key = make_pair(tmp_path, "two")
    (tmp_path / "token").write_text("t\n")
    run = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--models", str(MODELS), "--port",
         str(free_port()), "--socket", str(tmp_path / "s.sock"), "--metrics-port", "0",
         "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(tmp_path / "token")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert f"--tls-cert {str(cert)!r} / --tls-key {str(key)!r}: cannot use the pair" in run.stderr
